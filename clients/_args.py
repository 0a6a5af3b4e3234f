"""The learner's settings, :class:`PPOArgs`: a dataclass with no heavy imports, so the
command line (``simkit train --help``) is built without loading torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["PPOArgs", "resolve_device", "refuse_unless"]


def refuse_unless(rules: list[tuple[str, Any, bool, str]]) -> None:
    """Raises for the first ``(flag, value, ok, must be)`` rule that does not hold.

    Raises:
        ValueError: ``"<flag> must be <must be>, got <value>"``.
    """
    for flag, value, ok, want in rules:
        if not ok:
            raise ValueError(f"{flag} must be {want}, got {value}")


@dataclass
class PPOArgs:
    """Hyperparameters and run settings (defaults: CleanRL's ``ppo_continuous_action``)."""

    env_id: str = "simkit/CartPole-v0"
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
    """The learner's torch device for the update: ``cpu``, ``cuda[:k]`` or ``auto``
    (``cuda`` where available, else ``cpu``). The rollout keeps its own device."""

    def check(self) -> None:
        """Refuses values no run can use, before anything starts.

        Raises:
            ValueError: one line naming the flag, what it must be and what came.
        """
        rules: list[tuple[str, Any, bool, str]] = [
            ("total_steps", self.total_steps, self.total_steps >= 0, ">= 0 (0: until stopped)"),
            ("num_envs", self.num_envs, self.num_envs >= 1, ">= 1"),
            ("num_steps", self.num_steps, self.num_steps >= 1, ">= 1"),
            ("learning_rate", self.learning_rate, self.learning_rate > 0, "> 0"),
            ("gamma", self.gamma, 0 < self.gamma <= 1, "in (0, 1]"),
            ("gae_lambda", self.gae_lambda, 0 <= self.gae_lambda <= 1, "in [0, 1]"),
            ("num_minibatches", self.num_minibatches, self.num_minibatches >= 1, ">= 1"),
            ("update_epochs", self.update_epochs, self.update_epochs >= 1, ">= 1"),
            ("clip_coef", self.clip_coef, self.clip_coef > 0, "> 0"),
            ("ent_coef", self.ent_coef, self.ent_coef >= 0, ">= 0"),
            ("vf_coef", self.vf_coef, self.vf_coef >= 0, ">= 0"),
            ("max_grad_norm", self.max_grad_norm, self.max_grad_norm > 0, "> 0"),
            ("reward_clip", self.reward_clip, self.reward_clip > 0, "> 0"),
            ("max_lag", self.max_lag, self.max_lag >= 0, ">= 0"),
            ("env_threads", self.env_threads, self.env_threads >= 1, ">= 1"),
            ("torch_threads", self.torch_threads, self.torch_threads >= 1, ">= 1"),
            (
                "hidden",
                list(self.hidden),
                bool(self.hidden) and min(self.hidden) >= 1,
                "sizes >= 1",
            ),
            ("mode", self.mode, self.mode in ("sync", "async"), "sync or async"),
        ]
        refuse_unless([(f"--{name.replace('_', '-')}", *rest) for name, *rest in rules])
        batch = self.num_envs * self.num_steps
        if batch // self.num_minibatches < 2:
            raise ValueError(
                f"--num-minibatches {self.num_minibatches} splits a batch of {batch} env "
                "steps (--num-envs x --num-steps) into minibatches of fewer than 2 samples "
                f"(advantages cannot be normalised); use at most {max(1, batch // 2)}"
            )
        resolve_device(self.device)

    def to_plain(self) -> dict[str, Any]:
        """JSON-able form (for checkpoints)."""
        plain = asdict(self)
        plain["hidden"] = list(self.hidden)
        return plain

    @classmethod
    def from_plain(cls, plain: Mapping[str, Any]) -> PPOArgs:
        """Inverse of :meth:`to_plain`; unknown keys are an error."""
        values = dict(plain)
        values["hidden"] = tuple(values.get("hidden", (64, 64)))
        return cls(**values)


def resolve_device(name: str) -> torch.device:
    """``torch.device`` of a ``--device`` value (``auto``: ``cuda`` where available).

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
