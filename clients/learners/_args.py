"""The learners' settings (:class:`PPOArgs`, :class:`SACArgs`) and a run's options
(:class:`RunOptions`): dataclasses with no heavy imports, so the command line
(``simkit train --help``) is built without loading torch."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self

from simkit._limits import max_threads

if TYPE_CHECKING:
    import torch

__all__ = [
    "PPOArgs",
    "RunOptions",
    "Settings",
    "SACArgs",
    "resolve_device",
    "MAX_TOTAL_STEPS_VAR",
    "capped_total_steps",
    "capped",
    "DEFAULT_SERVERS",
    "flag",
]


@dataclass
class RunOptions:
    """A run's keywords beside the algorithm's settings (:func:`simkit.train`'s): the
    ``simkit train`` flags of the same names, with their defaults. ``logdir`` is the
    run's log directory once planned."""

    algo: str | None = None
    """``"ppo"`` or ``"sac"``; None: PPO, or the checkpoint's with ``resume``."""
    logdir: str | Path | None = None
    resume: str | Path | None = None
    checkpoint_every: int = 10
    checkpoint_steps: int = 100_000
    checkpoint_minutes: float = 5.0
    buffer_from: str | Path | None = None
    metrics_port: int | None = None
    reproducible: bool = False
    progress: bool = False
    print_every: float = 10.0
    connect: Sequence[str] = ()
    curve_server_key: str | Path | None = None
    """``connect``: the servers' CURVE public key file; with ``curve_secret_key``."""
    curve_secret_key: str | Path | None = None
    """``connect``: this learner's CURVE secret key file (``.key_secret``)."""
    servers: int | None = None
    wait_for_servers: bool = False
    record: str | Path | None = None
    server_timeout: float = 30.0
    ray: str | None = None
    server_cpus: float = 1.0
    server_gpus: float = 0.0
    max_restarts: int = 3
    tensorboard: bool = True
    max_rounds: int | None = None
    """Stop after this many rounds (PPO updates, SAC weight pushes) of this call."""
    handle_signals: bool = False
    """SIGINT/SIGTERM stop the run after the current round, with a checkpoint."""


class Settings(Protocol):
    """What a run reads of an algorithm's settings (:class:`PPOArgs`, :class:`SACArgs`)."""

    env_id: str
    seed: int
    num_envs: int
    num_steps: int
    mode: str
    env_threads: int
    torch_threads: int
    env_kwargs: dict[str, Any]


DEFAULT_SERVERS = 1
"""Local ``simkit serve`` subprocesses ``simkit train`` starts without ``--connect`` /
``--servers`` (the embedded default; ``--servers 0`` rolls out in process)."""

MAX_TOTAL_STEPS_VAR = "SIMKIT_MAX_TOTAL_STEPS"
"""The environment variable that caps every run's ``total_steps`` (``simkit train``,
``./run main``, :func:`simkit.train`) and its rollout per update (:func:`capped`): the docs'
test runs the documented training commands with it, so each takes seconds."""


def capped_total_steps(total_steps: int) -> int:
    """``total_steps`` capped by ``$SIMKIT_MAX_TOTAL_STEPS`` where that is set (0, "until
    stopped", becomes the cap too).

    Raises:
        ValueError: the variable is set to anything but an integer >= 1.
    """
    raw = os.environ.get(MAX_TOTAL_STEPS_VAR)
    if raw is None or raw == "":
        return total_steps
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(f"{MAX_TOTAL_STEPS_VAR} must be an integer >= 1, got {raw!r}")
    return cap if total_steps == 0 else min(total_steps, cap)


def capped(args: PPOArgs | SACArgs) -> PPOArgs | SACArgs:
    """``args`` under ``$SIMKIT_MAX_TOTAL_STEPS`` (unchanged where it is unset): ``total_steps``
    capped (:func:`capped_total_steps`) and the rollout per update (``num_steps`` per env)
    shortened so that one update fits the cap, so a capped run takes seconds."""
    total = capped_total_steps(args.total_steps)
    if total == args.total_steps and MAX_TOTAL_STEPS_VAR not in os.environ:
        return args
    steps = min(args.num_steps, max(1, total // max(1, args.num_envs)))
    return replace(args, total_steps=total, num_steps=steps)


def flag(name: str) -> str:
    """The command-line flag of a setting or run option: ``num_envs`` is ``--num-envs``."""
    return "--" + name.replace("_", "-")


_FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: a hyperparameter becomes a float32 tensor (a larger one overflows)."""

_THREADS = f"in [1, {max_threads()}]"
"""Thread counts: at least one, at most :func:`~simkit._limits.max_threads` (more would
exhaust the host's threads)."""

_MUST: dict[str, Callable[[Any], bool]] = {
    "in [0, 2**63)": lambda v: 0 <= v < 2**63,
    ">= 0 (0: until stopped)": lambda v: v >= 0,
    ">= 0": lambda v: math.isfinite(v) and v >= 0,
    ">= 1": lambda v: v >= 1,
    "> 0": lambda v: math.isfinite(v) and v > 0,
    _THREADS: lambda v: 1 <= v <= max_threads(),
    "in (0, 1]": lambda v: 0 < v <= 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "sizes >= 1": lambda v: bool(v) and min(v) >= 1,
    "sync or async": lambda v: v in ("sync", "async"),
    "auto, on or off": lambda v: v in ("auto", "on", "off"),
}
"""What a setting must be, in the words of its error, and the test of it."""

_SHARED_CHECKS = {
    "in [0, 2**63)": ("seed",),
    ">= 0 (0: until stopped)": ("total_steps",),
    ">= 1": ("num_envs", "num_steps"),
    _THREADS: ("env_threads", "torch_threads"),
    "sizes >= 1": ("hidden",),
    "sync or async": ("mode",),
}
"""The fields both learners have, by what they must be (a key of :data:`_MUST`); checked
first."""


class _Plain:
    """Settings as plain data for checkpoints (``hidden`` as a list)."""

    hidden: tuple[int, ...]
    seed: int
    total_steps: int
    num_envs: int
    num_steps: int
    env_threads: int
    torch_threads: int
    mode: str

    def _refuse_bad(self, checks: Mapping[str, tuple[str, ...]]) -> None:
        """Raises for the first field of :data:`_SHARED_CHECKS`, then of ``checks`` (the
        learner's fields by what they must be), that is not what :data:`_MUST` says.

        Raises:
            ValueError: ``"--<field> must be <must be>, got <value>"`` (``hidden`` as a list).
        """
        for table in (_SHARED_CHECKS, checks):
            for must, names in table.items():
                for name in names:
                    value = getattr(self, name)
                    if not _MUST[must](value):
                        shown = list(value) if name == "hidden" else value
                        raise ValueError(f"{flag(name)} must be {must}, got {shown}")
        for name, value in vars(self).items():  # tensors hold them: float32's range
            if isinstance(value, float) and not abs(value) <= _FLOAT32_MAX:
                raise ValueError(
                    f"{flag(name)} must be at most {_FLOAT32_MAX:.4g} (a float32), got {value}"
                )

    def to_plain(self) -> dict[str, Any]:
        """JSON-able form (for checkpoints)."""
        plain = asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass
        plain["hidden"] = list(self.hidden)
        return plain

    @classmethod
    def from_plain(cls, plain: Mapping[str, Any]) -> Self:
        """Inverse of :meth:`to_plain`; unknown keys are an error."""
        values = dict(plain)
        if "hidden" in values:
            values["hidden"] = tuple(values["hidden"])
        return cls(**values)


@dataclass
class PPOArgs(_Plain):
    """Hyperparameters and run settings (defaults: CleanRL's ``ppo_continuous_action``)."""

    env_id: str = "simkit/CartPole-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """More constructor arguments of the envs (``--env-kwarg KEY=VALUE``, e.g.
    ``backend="mjwarp"``), for the rollouts the run starts (in process, ``--servers``,
    ``--ray``; not ``--connect``); recorded in checkpoints, so a resume builds the same
    envs."""
    seed: int = 1
    total_steps: int = 1_000_000
    """env steps (rows x steps) to train for; 0 trains until stopped (no lr annealing)."""
    num_envs: int = 1
    num_steps: int = 2048
    """``T``: steps per env slot per update (the fragment length)."""
    learning_rate: float = 3e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 32
    update_epochs: int = 10
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: tuple[int, ...] = (64, 64)
    normalize_obs: bool = True
    normalize_reward: bool = True
    reward_clip: float = 10.0
    mode: str = "sync"
    """``"sync"`` (on-policy, reproducible) or ``"async"`` (bounded lag)."""
    max_lag: int = 1
    """async: drop fragments produced by a version older than ``version - max_lag``."""
    env_threads: int = 1
    torch_threads: int = 1
    compile: bool = False
    """``torch.compile`` the minibatch loss (forward and backward): a one-off compile,
    then a cheaper update; deterministic run to run, but not bit-equal to eager."""
    device: str = "cpu"
    """The learner's torch device for the update: ``cpu``, ``cuda[:k]`` or ``auto`` (a
    run times its update step on the CPU and CUDA and keeps the faster; the CPU, unprobed,
    where there is no CUDA: :mod:`~simkit.clients.learners._device_pick`). The rollout
    keeps its own device, except in the device loop (``device_loop``)."""
    device_loop: str = "auto"
    """The whole loop on ``device`` (env, noise, policy, fragments, GAE, update:
    :class:`~simkit.clients.learners._sources.LocalSource` with ``device_loop``): ``on`` (a batch env with
    device-resident steps, in process, sync; refused otherwise), ``off``, or ``auto``
    (on where ``device`` is not the CPU and the run can; a CPU run keeps the host
    rollout and its bits)."""
    cuda_graph: bool = True
    """On a CUDA ``device``, replay the learner's step (PPO: a minibatch's loss, backward,
    gradient clip and Adam step; SAC: a whole gradient step) as a CUDA graph, one launch
    instead of hundreds (:mod:`~simkit.clients.learners._graphed`); off runs the same step
    eagerly, with the same bits. No effect on the CPU, whose path and bits stay."""

    def check(self) -> None:
        """Refuses values no run can use, before anything starts.

        Raises:
            ValueError: one line naming the flag, what it must be and what came.
        """
        self._refuse_bad(
            {
                "> 0": ("learning_rate", "clip_coef", "max_grad_norm", "reward_clip"),
                "in (0, 1]": ("gamma",),
                "in [0, 1]": ("gae_lambda",),
                ">= 1": ("num_minibatches", "update_epochs"),
                ">= 0": ("ent_coef", "vf_coef", "max_lag"),
                "auto, on or off": ("device_loop",),
            }
        )
        batch = self.num_envs * self.num_steps
        if batch // self.num_minibatches < 2:
            raise ValueError(
                f"--num-minibatches {self.num_minibatches} splits a batch of {batch} env "
                "steps (--num-envs x --num-steps) into minibatches of fewer than 2 samples "
                f"(advantages cannot be normalised); use at most {max(1, batch // 2)}"
            )
        resolve_device(self.device)


@dataclass
class SACArgs(_Plain):
    """SAC hyperparameters and run settings (defaults: CleanRL's ``sac_continuous_action``)."""

    env_id: str = "gym:HalfCheetah-v5"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """As :attr:`PPOArgs.env_kwargs`."""
    seed: int = 1
    total_steps: int = 1_000_000
    """env steps to train for; 0 trains until stopped."""
    num_envs: int = 1
    num_steps: int = 1
    """``T``: steps per env slot per fragment (each sync round is one fragment per slot)."""
    buffer_size: int = 1_000_000
    """replay capacity in transitions."""
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    learning_starts: int = 5000
    """transitions in the buffer before the first gradient step (random actions until then)."""
    policy_lr: float = 3e-4
    q_lr: float = 1e-3
    policy_frequency: int = 2
    """actor (and entropy) updates happen every this many gradient steps, this many times."""
    target_network_frequency: int = 1
    alpha: float = 0.2
    """entropy coefficient (its start value with ``autotune``)."""
    autotune: bool = True
    utd: float = 1.0
    """update-to-data ratio: gradient steps per env step."""
    hidden: tuple[int, ...] = (256, 256)
    mode: str = "sync"
    """``"sync"``: the UTD enforced exactly, reproducible; ``"async"``: free-running."""
    push_every: int = 8
    """async: gradient steps between weight pushes."""
    env_threads: int = 1
    torch_threads: int = 1
    device: str = "cpu"
    """As :attr:`PPOArgs.device` (``auto`` times SAC's gradient step at ``batch_size``)."""
    cuda_graph: bool = True
    """As :attr:`PPOArgs.cuda_graph`: SAC's gradient step as a CUDA graph on CUDA."""

    def check(self) -> None:
        """Refuses values no run can use, before anything starts.

        Raises:
            ValueError: one line naming the flag, what it must be and what came.
        """
        self._refuse_bad(
            {
                ">= 1": (
                    "buffer_size",
                    "batch_size",
                    "learning_starts",
                    "policy_frequency",
                    "target_network_frequency",
                    "push_every",
                ),
                "in (0, 1]": ("gamma", "tau"),
                "> 0": ("policy_lr", "q_lr", "alpha", "utd"),
            }
        )
        if self.learning_starts > self.buffer_size:
            raise ValueError(
                f"--learning-starts {self.learning_starts} exceeds --buffer-size "
                f"{self.buffer_size}: learning would never start"
            )
        resolve_device(self.device)

    def check_learning_starts(self) -> None:
        """Refuses a run that ends before learning starts: ``total_steps`` (as asked,
        before ``$SIMKIT_MAX_TOTAL_STEPS`` caps it for the docs' tests) below
        ``learning_starts`` would act at random throughout and take no gradient step.

        Raises:
            ValueError: naming both settings and the two ways out.
        """
        if 0 < self.total_steps < self.learning_starts:
            raise ValueError(
                f"--total-steps {self.total_steps:,} ends before learning starts "
                f"(--learning-starts {self.learning_starts:,}): the run would act at random "
                f"and take no gradient step; train at least {self.learning_starts:,} env "
                "steps or lower --learning-starts"
            )


def resolve_device(name: str) -> torch.device:
    """``torch.device`` of a ``--device`` value (``auto``: ``cuda`` where available,
    unprobed; a run probes instead: :func:`~simkit.clients.learners._device_pick.pick_device`).

    Raises:
        ValueError: not a torch device, or CUDA asked for where there is none.
    """
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device must be cpu, cuda[:k] or auto, got {name!r}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this machine has no CUDA device (use cpu or auto)")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu, cuda[:k] or auto, got {name!r}")
    return device
