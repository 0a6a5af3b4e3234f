"""An in-process fragment source: the rollout servers' own loop, in the learner's process.

:class:`LocalSource` runs exactly what a stream session runs (one mechanism, one place):
the envs as policy rows (:func:`simkit.rollout._rows.make_env_rows`: a
:class:`simkit.vector.VectorEnv` for single-agent ids and ``gym:<id>``, a
:class:`simkit.vector.MultiAgentVectorEnv` with one row per (env, agent), a
:class:`simkit.BatchEnv`), the policy with keyed sampling noise
(:class:`simkit.rollout._policy.RowPolicy`) and the fragment loop
(:class:`simkit.rollout._loop.RolloutLoop`). So a run in process and a run
through any number of servers give the same fragments, bit for bit, for the same seed.
It is a :class:`~simkit.clients.learners._sources.FragmentSource`, the interface a run uses,
as the rollout servers' stream is.

With ``device_loop`` it runs the same loop with every array on one torch device (the
device loop): a batch env with device-resident steps built there
(:class:`~simkit.rollout._rows.DeviceRows`), the policy acting on its tensors with the
keyed noise computed there, and :class:`~simkit.rollout._loop.DeviceFragment` s of
tensors that :meth:`simkit.clients.learners.ppo.PPO.update` consumes where they are. Per
fragment the host reads the env's episode counters once and the fragment's episode ends
once; no step reads a tensor back. Its fragments are not bit-identical to the host
rollout's (the forward pass is torch's on a batch, not ``LeanMLP``'s); a sync run is
deterministic (same seed, same device) and resumes exactly.

Sync mode rolls out a fragment when the learner asks for one, with the weights it last
pushed (exactly on-policy, deterministic). Async mode rolls out on a thread with the
newest weights it has, at most ``prefetch`` fragments ahead, so the learner's update
overlaps the next rollout.
"""

from __future__ import annotations

import copy
import importlib.util
import queue
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any, TypedDict

import torch

from simkit._batch import BatchEnv
from simkit._types import Fragment
from simkit.models import ActorCritic
from simkit.registry import GYM_PREFIX, EnvKind, spec
from simkit.rollout._loop import DeviceFragment, RolloutLoop
from simkit.rollout._policy import RowPolicy
from simkit.rollout._rows import EnvRows, make_device_rows, make_env_rows
from simkit.vector import MultiAgentVectorEnv, VectorEnv

__all__ = [
    "LocalSource",
    "GYM_PREFIX",
    "device_loop_support",
    "use_device_loop",
    "is_multi_agent",
    "make_vector",
    "no_snapshots_line",
    "NO_ENV_STATES_LINE",
    "SourceKeywords",
]

NO_ENV_STATES_LINE = (
    "simkit train: the checkpoint holds no env states (envs without snapshots, or async "
    "mode): the envs restart afresh, so this run does not continue exactly where the "
    "checkpointed one stopped (the learner does)"
)
"""What a source says when it resumes from a checkpoint without env states."""


def no_snapshots_line(not_exact: str, *, supervised: bool) -> str:
    """What a source says, once, when its envs turn out to have no snapshots
    (``not_exact``: the reason, as :attr:`TrainResult.not_exact` keeps it)."""
    if supervised:
        what = (
            "a lost server's session reopens with fresh envs and a resume from a "
            "checkpoint restarts them afresh: neither continues exactly"
        )
    else:
        what = "a resume from a checkpoint restarts them afresh: it does not continue exactly"
    return f"simkit train: {not_exact}: {what}"


class SourceKeywords(TypedDict):
    """The keywords every fragment source's constructor takes beside its own
    (:class:`LocalSource`, :class:`~simkit.clients.learners._server_source.ServerSource`): what a run asks of
    its rollout, whichever kind (``RolloutPlan.source_keywords()``)."""

    num_envs: int
    """``N``, env slots."""
    num_steps: int
    """``T``, steps per env slot per fragment."""
    seed: int
    """Root seed of the envs and of the sampling noise (keyed by ``(seed, slot, step)``
    in every source)."""


def is_multi_agent(env_id: str) -> bool:
    """Whether ``env_id`` names a simkit multi-agent env (``gym:<id>`` never does)."""
    return spec(env_id).kind is EnvKind.MULTI_AGENT


def make_vector(
    env_id: str, num_envs: int, num_threads: int = 1, *, render_mode: str | None = None
) -> VectorEnv | MultiAgentVectorEnv:
    """The local vector of ``env_id`` (``gym:<id>`` builds the installed Gymnasium env).

    ``render_mode`` (e.g. ``"rgb_array"``) is passed to every env's constructor.
    """
    kwargs: dict[str, Any] = {} if render_mode is None else {"render_mode": render_mode}
    if is_multi_agent(env_id):
        return MultiAgentVectorEnv(env_id, num_envs, env_kwargs=kwargs)
    if spec(env_id).kind is EnvKind.BATCH:
        raise ValueError(
            f"{env_id!r} is a batch env: a vector of single envs cannot hold it (it steps "
            f"as one: simkit.make({env_id!r}, num_envs=N))"
        )
    return VectorEnv(env_id, num_envs, num_threads=num_threads, env_kwargs=kwargs)


def device_loop_support(
    env_id: str, env_kwargs: Mapping[str, Any] | None = None, device: Any = None
) -> str | None:
    """Why ``env_id`` cannot run the device loop, or ``None`` where it can: a batch env
    whose class has the masked reset hook (:meth:`simkit.BatchEnv.reset_masked`) or
    declares :attr:`~simkit.BatchEnv.time_limit_only` (resets scheduled on the host),
    so its whole-batch steps stay on the device. A MuJoCo batch (built with
    ``env_kwargs`` on ``device``; None: the class alone is judged) computes on the device
    only on MuJoCo Warp, which needs the ``gpu`` extra."""
    if env_id.startswith("gym:"):
        return f"{env_id} is a Gymnasium env (the device loop needs a simkit batch env)"
    env_spec = spec(env_id)
    if env_spec.kind is not EnvKind.BATCH:
        return f"{env_id} is a {env_spec.kind.value} env (the device loop needs a batch env)"
    factory = env_spec.load()
    hook = getattr(factory, "reset_masked", None)
    if not isinstance(factory, type) or (
        (hook is BatchEnv.reset_masked or hook is None)
        and not getattr(factory, "time_limit_only", False)
    ):
        return (
            f"{env_id} has no device-resident steps (its class does not implement "
            "BatchEnv.reset_masked)"
        )
    if device is not None and _is_mujoco_batch(factory):
        from simkit._batch_mujoco import resolve_backend

        backend = resolve_backend((env_kwargs or {}).get("backend", "auto"), device)
        if backend != "mjwarp":
            return (
                f"{env_id} computes on the host on backend {backend!r} (the device loop "
                "needs --env-kwarg backend=mjwarp, or a CUDA --device)"
            )
        if importlib.util.find_spec("mujoco_warp") is None:
            return f"{env_id} on the device needs MuJoCo Warp (pip install 'simkit[gpu]')"
    return None


def _is_mujoco_batch(factory: type) -> bool:
    """Whether ``factory`` is a :class:`simkit.BatchMujocoEnv` (importing MuJoCo only
    where the env's own module did)."""
    module = sys.modules.get("simkit._batch_mujoco")
    return module is not None and issubclass(factory, module.BatchMujocoEnv)


def use_device_loop(
    *,
    env_id: str,
    choice: str,
    device: torch.device,
    mode: str,
    servers: int,
    connect: bool,
    ray: bool,
    record: bool,
    env_kwargs: Mapping[str, Any] | None = None,
) -> bool:
    """Whether a PPO run rolls out in the device loop (``--device-loop``, ``choice``):
    ``on`` where the run can (else a ``ValueError`` saying why), ``off`` never, ``auto``
    where it can and ``device`` is not the CPU (a CPU run keeps the host rollout, and its
    bits, unless it asks).

    Raises:
        ValueError: ``choice`` is ``on`` and the run cannot (one line, naming why).
    """
    if choice == "off":
        return False
    why: str | None
    if servers or connect or ray:
        why = "it rolls out in the learner's process (--servers 0, no --connect or --ray)"
    elif mode != "sync":
        why = f"it runs in sync mode only, got --mode {mode}"
    elif record:
        why = "--record records host fragments (the device loop's never leave the device)"
    else:
        why = device_loop_support(env_id, env_kwargs, device)
    if choice == "on":
        if why is not None:
            raise ValueError(f"--device-loop on: {why}")
        return True
    return why is None and device.type != "cpu"


class LocalSource:
    """Rolls out ``model`` over local envs and yields :class:`Fragment` s.

    Args:
        env_id: a simkit id (single-agent, multi-agent or batch) or ``gym:<id>``.
        model: the policy; the source keeps its own copy and only reads pushed weights.
        num_envs: env slots.
        num_steps: ``T``, steps per fragment.
        seed: root seed of the envs and of the sampling noise.
        mode: ``"sync"`` or ``"async"``.
        prefetch: async only, fragments rolled out ahead of the learner.
        num_threads: env stepping threads (MuJoCo releases the GIL).
        lean: act through :class:`~simkit.models._lean.LeanMLP` (numpy) where the
            model is a plain MLP; else ``model.act`` (torch).
        device: the torch device of the rollout's policy (None: the CPU, whose
            ``LeanMLP`` gives the same fragments as rollout servers on CPUs). On a CUDA
            device the policy acts as a stream session on CUDA does (pinned buffers, one
            synchronisation per step, the forward as a CUDA graph; docs/server.md), and
            gives that session's fragments.
        env_kwargs: more constructor arguments of the envs.
        device_loop: roll out with every array on ``device`` (sync mode; a batch env
            with device-resident steps: :func:`device_loop_support`).

    Raises:
        ValueError: a bad mode or ``num_steps``; the device loop cannot run the env.
    """

    def __init__(
        self,
        env_id: str,
        model: ActorCritic,
        *,
        num_envs: int,
        num_steps: int,
        seed: int,
        mode: str = "sync",
        prefetch: int = 1,
        num_threads: int = 1,
        lean: bool = True,
        device: torch.device | str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        device_loop: bool = False,
    ) -> None:
        if mode not in ("sync", "async") or (device_loop and mode != "sync"):
            want = "'sync' (the device loop)" if device_loop else "'sync' or 'async'"
            raise ValueError(f"mode must be {want}, got {mode!r}")
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.env_id = env_id
        self.mode = mode
        self.num_steps = num_steps
        self.device_loop = device_loop
        dev = torch.device("cpu" if device is None else device)
        self.name = f"{'device' if device_loop else 'local'}:{env_id}"
        self.envs: EnvRows
        if device_loop:
            why = device_loop_support(env_id)
            if why is not None:
                raise ValueError(f"the device loop cannot run {env_id}: {why}")
            self.envs = make_device_rows(env_id, num_envs, num_steps, dev, env_kwargs=env_kwargs)
        else:
            self.envs = make_env_rows(
                env_id, num_envs, env_kwargs=env_kwargs, num_threads=num_threads
            )
        self.multi_agent = self.envs.kind == "multi_agent"
        self.observation_space = self.envs.observation_space
        self.action_space = self.envs.action_space
        self.num_envs = num_envs
        self.num_rows = self.envs.num_rows
        self.policy = RowPolicy(
            copy.deepcopy(model),
            dev,
            seed=seed,
            first_slot=0,
            num_slots=num_envs,
            rows_per_slot=self.envs.agents_per_env,
            action_space=self.action_space,
            lean=lean,
            resident=device_loop,
            ahead=num_steps if device_loop else 1,
        )
        self.loop = RolloutLoop(self.envs, self.policy, fragment_length=num_steps, source=self.name)
        try:
            self.loop.reset(seed, 0)
        except BaseException:
            self.envs.close()
            raise
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._lock = threading.Lock()
        self._times = {"env": 0.0, "inference": 0.0}
        self._queue: queue.Queue[Fragment | DeviceFragment | BaseException] = queue.Queue(
            maxsize=max(1, prefetch)
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.not_exact: str | None = None
        """Why a resume of this run does not continue exactly (its envs have no
        snapshots), once a checkpoint found so; else None."""

    @property
    def version(self) -> int:
        """The version of the weights the rollout acts with (0 before any push)."""
        return self.policy.version or 0

    @property
    def sequence(self) -> int:
        """The next fragment's sequence number."""
        return self.loop.sequence

    # ------------------------------------------------------------------ weights

    def push_weights(self, weights: torch.nn.Module, *, version: int | None = None) -> int:
        """New weights (normalisation buffers included), used from the next fragment on."""
        v = self.version + 1 if version is None else version
        if self.mode == "sync":  # copied into the rollout's model right away
            self.policy.load_state_dict(weights.state_dict(keep_vars=False), v)
            return v
        copied = {k: t.detach().clone() for k, t in weights.state_dict().items()}
        with self._lock:
            self._pending = (v, copied)
        return v

    def _swap(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self.policy.load_state_dict(pending[1], pending[0])

    # ------------------------------------------------------------------ rollout

    def rollout(self) -> Fragment | DeviceFragment:
        """Steps ``T`` times with the current weights and returns the fragment."""
        loop = self.loop
        fragment = None
        while fragment is None:
            fragment = loop.step()
        times = loop.take_times()
        with self._lock:
            self._times["env"] += times.env
            self._times["inference"] += times.inference
        return fragment

    def _produce(self) -> None:
        try:
            while not self._stop.is_set():
                self._swap()
                fragment = self.rollout()
                while not self._stop.is_set():
                    try:
                        self._queue.put(fragment, timeout=0.05)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the learner, which re-raises it
            self._queue.put(exc)

    def fragments(self) -> Iterator[Fragment | DeviceFragment]:
        """Fragments forever: rolled out on demand (sync) or by the rollout thread (async)."""
        if self.mode == "sync":
            while True:
                yield self.rollout()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._produce, name="simkit-rollout", daemon=True
            )
            self._thread.start()
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    def pending(self) -> bool:
        """Whether a fragment is ready without waiting (async: rolled out ahead; sync
        rolls out on demand, so never)."""
        return self.mode == "async" and not self._queue.empty()

    def timings(self) -> dict[str, float]:
        """Seconds spent stepping envs and in inference since the last call."""
        with self._lock:
            out, self._times = self._times, {"env": 0.0, "inference": 0.0}
        return out

    # ------------------------------------------------------------------ state

    def get_state(self, *, include_envs: bool = True) -> dict[str, Any]:
        """Plain data to resume the rollout exactly (sync mode): the loop's boundary
        state (envs, observations, episode accumulators, the sequence number that keys
        the sampling noise).

        ``loop`` is ``None`` for envs without ``get_state`` (Gymnasium's) and without
        ``include_envs`` (async mode, where the rollout thread owns the envs); such
        envs restart with a fresh reset on resume, the noise continuing from
        ``sequence``.
        """
        loop_state: Any = None
        if include_envs:
            try:
                loop_state = self.loop.boundary_state()
            except TypeError:
                loop_state = None
                if self.not_exact is None:
                    self.not_exact = f"the envs of {self.env_id} have no snapshots"
                    print(no_snapshots_line(self.not_exact, supervised=False), file=sys.stderr)
        return {"loop": loop_state, "sequence": self.loop.sequence}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` (the loop's boundary state only where one was taken).

        Raises:
            ValueError: not a :meth:`get_state` of this version (a checkpoint from before
                keyed sampling noise, or a device loop's from before it was this loop).
        """
        if set(state) != {"loop", "sequence"}:
            raise ValueError(
                "the rollout state must hold 'loop' and 'sequence' (a checkpoint of this "
                f"simkit version), got {sorted(state)}"
            )
        if state["loop"] is not None:
            self.loop.restore_boundary(dict(state["loop"]))
        else:
            print(NO_ENV_STATES_LINE, file=sys.stderr)
        self.loop.sequence = int(state["sequence"])

    def close(self) -> None:
        """Stops the rollout thread and closes the envs."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.envs.close()
