"""Where a learner's fragments come from, opened in one place for every algorithm: in
process (:class:`LocalSource`), or local ``simkit serve`` processes, given endpoints or
Ray actors (:class:`~simkit.clients.learners._server_source.ServerSource`).

:class:`LocalSource` runs exactly what a stream session runs (one mechanism, one place):
the envs as policy rows (:func:`simkit.rollout._rows.make_env_rows`), the policy with
keyed sampling noise (:class:`simkit.rollout._policy.RowPolicy`) and the fragment loop
(:class:`simkit.rollout._loop.RolloutLoop`). So a run in process and a run through any
number of servers give the same fragments, bit for bit, for the same seed.

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

import contextlib
import copy
import queue
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from simkit._kernels import pinned_vars
from simkit._types import Fragment
from simkit.clients.learners._args import RunOptions, Settings
from simkit.clients.learners._checkpoint import NO_ENV_STATES_LINE, no_snapshots_line
from simkit.clients.learners._device_pick import device_loop_support
from simkit.clients.learners._server_source import ServerSource, spawn_servers, stop_servers
from simkit.clients.remote._connection import CurveKeys
from simkit.models import ActorCritic, ModelSpec
from simkit.rollout._loop import DeviceFragment, RolloutLoop
from simkit.rollout._policy import RowPolicy
from simkit.rollout._rows import EnvRows, make_device_rows, make_env_rows

__all__ = [
    "FragmentSource",
    "LocalSource",
    "Rollout",
    "describe_source",
    "open_rollout",
    "served_env",
    "source_kind",
]


class FragmentSource(Protocol):
    """What a run uses of its fragment source (:class:`LocalSource`, on the host or in the
    device loop, :class:`ServerSource`): its policy rows, the fragments (``None``: the source changed,
    e.g. lost a server), weight pushes, whether a fragment waits, its state for
    checkpoints and why a continuation from them would not be exact."""

    @property
    def num_rows(self) -> int: ...

    @property
    def not_exact(self) -> str | None: ...

    def fragments(self) -> Iterator[Fragment | DeviceFragment | None]: ...

    def push_weights(self, weights: torch.nn.Module, *, version: int | None = None) -> int: ...

    def pending(self) -> bool: ...

    def get_state(self, *, include_envs: bool = True) -> dict[str, Any]: ...

    def set_state(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class LocalSource:
    """Rolls out ``model`` over local envs and yields :class:`Fragment` s.

    Args:
        env_id: a simkit id (single-agent, multi-agent or batch) or ``gym:<id>``.
        model: the policy; the source keeps its own copy and only reads pushed weights.
        num_envs, num_steps: env slots, and ``T``, steps per fragment.
        seed: root seed of the envs and of the sampling noise.
        mode, prefetch: ``"sync"`` or ``"async"``; async only, fragments rolled out
            ahead of the learner.
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
            with device-resident steps:
            :func:`~simkit.clients.learners._device_pick.device_loop_support`).

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
                with self._lock:  # the newest weights pushed, if any
                    pending, self._pending = self._pending, None
                if pending is not None:
                    self.policy.load_state_dict(pending[1], pending[0])
                fragment = self.rollout()
                while not self._stop.is_set():
                    with contextlib.suppress(queue.Full):
                        self._queue.put(fragment, timeout=0.05)
                        break
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


def source_kind(source: FragmentSource) -> str:
    """What a checkpoint calls the kind of rollout ``source`` runs: ``"device"`` (the
    device loop), ``"local"`` (in process on the host) or ``"servers"``."""
    if isinstance(source, LocalSource):
        return "device" if source.device_loop else "local"
    return "servers"


def describe_source(source: FragmentSource) -> str:
    """Where ``source`` rolls out, for the run's summary: ``"device loop on cuda:0"``,
    ``"in process (host)"`` or ``"rollout servers"``."""
    if isinstance(source, LocalSource):
        return (
            f"device loop on {source.policy.device}" if source.device_loop else "in process (host)"
        )
    return "rollout servers"


@dataclass
class Rollout:
    """An open fragment source and what runs it (server processes, a Ray launch)."""

    source: LocalSource | ServerSource
    procs: list[Any] = field(default_factory=list)
    launched: Any = None

    def close(self) -> None:
        """Closes the source, stops the servers it started."""
        try:
            self.source.close()
        finally:
            stop_servers(self.procs)
            if self.launched is not None:
                self.launched.close()


def _relocator(launched: Any, logdir: Path) -> Callable[[str], str]:
    """Ray's answer to "where is the server lost at this endpoint now", keeping the
    Prometheus targets file current."""

    def locate(endpoint: str) -> str:
        found: str = launched.locate(endpoint)
        launched.write_prometheus_targets(logdir / "prometheus_targets.json")
        return found

    return locate


def open_rollout(
    s: Settings,
    o: RunOptions,
    spec: ModelSpec,
    model: ActorCritic,
    *,
    max_lag: int,
    servers: int,
    give_up: Callable[[], bool],
    logdir: Path,
    device_loop: torch.device | None = None,
) -> Rollout:
    """Opens the fragment source the algorithm's settings ``s`` and the run's options
    ``o`` ask for, acting with ``model`` of ``spec``; on error nothing is left running.
    With ``device_loop``: in process on that device (the run checked it can,
    :func:`~simkit.clients.learners._device_pick.use_device_loop`); else, without
    ``servers`` (local ones to start: the run's choice), endpoints or Ray: in process on
    the host (:class:`LocalSource`); else the ``connect`` endpoints, then servers
    launched on Ray or started as local processes, under one :class:`ServerSource`
    (servers this run starts get the env the way a new process can build it,
    :func:`served_env`; ``connect`` servers serve what their operators chose).

    Raises:
        ValueError: ``ray`` without ``servers`` or with ``connect``.
    """
    if device_loop is not None or (o.ray is None and not servers and not o.connect):
        return Rollout(
            LocalSource(
                s.env_id,
                model,
                mode=s.mode,
                num_threads=s.env_threads,
                env_kwargs=s.env_kwargs,
                device=device_loop,
                device_loop=device_loop is not None,
                num_envs=s.num_envs,
                num_steps=s.num_steps,
                seed=s.seed,
            )
        )
    procs: list[Any] = []
    endpoints = list(o.connect)
    launched: Any = None
    env_id, env_kwargs = s.env_id, dict(s.env_kwargs)
    if not o.connect:
        env_id, env_kwargs = served_env(s.env_id, s.env_kwargs)
    if o.ray is not None:
        launched = _launch_on_ray(s, o, servers, logdir, env_id, env_kwargs)
        endpoints += launched.endpoints
    elif servers:
        procs, spawned = spawn_servers(
            env_id, servers, num_threads=s.env_threads, env_kwargs=env_kwargs
        )
        endpoints += spawned
    try:
        source = ServerSource(
            endpoints,
            spec,
            env_id=env_id,
            env_kwargs=env_kwargs,
            mode=s.mode,
            max_lag=max_lag,
            timeout=o.server_timeout,
            report=lambda line: print(line, file=sys.stderr, flush=True),
            wait_for_servers=o.wait_for_servers,
            give_up=give_up,
            curve=launched.curve if launched is not None else _curve_keys(o),
            locate=None if launched is None else _relocator(launched, logdir),
            num_envs=s.num_envs,
            num_steps=s.num_steps,
            seed=s.seed,
        )
    except BaseException:
        stop_servers(procs)
        if launched is not None:
            launched.close()
        raise
    return Rollout(source, procs, launched)


def served_env(env_id: str, env_kwargs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The env id and kwargs a rollout server this process starts is given, so that it
    builds the envs ``env_id`` builds here (:func:`simkit.registry.portable_env`).

    Raises:
        ValueError: no new process can build it: one line saying to roll out in process
            or to name an importable class.
    """
    from simkit.registry import portable_env

    try:
        return portable_env(env_id, env_kwargs)
    except ValueError as exc:
        raise ValueError(f"{exc}; or roll out in this process (--servers 0)") from None


def _curve_keys(o: RunOptions) -> CurveKeys | None:
    """The CURVE keys of ``--curve-server-key`` and ``--curve-secret-key`` (None without).

    Raises:
        ValueError: a file that cannot be read or holds no valid key, naming the flag.
    """
    if o.curve_server_key is None or o.curve_secret_key is None:
        return None
    try:
        return CurveKeys.from_files(o.curve_server_key, o.curve_secret_key)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"--curve-server-key {o.curve_server_key} / --curve-secret-key "
            f"{o.curve_secret_key}: {exc}"
        ) from None


def _launch_on_ray(
    s: Settings, o: RunOptions, servers: int, logdir: Path, env_id: str, env_kwargs: dict[str, Any]
) -> Any:
    """``servers`` rollout servers of ``env_id`` (with ``env_kwargs``: :func:`served_env`)
    launched on the Ray cluster at ``o.ray`` ("": a local Ray instance), the env slots
    split evenly; their Prometheus targets written into ``logdir``.

    Raises:
        ValueError: no ``servers`` or some ``connect`` endpoints (Ray launches them all).
    """
    connect = o.connect
    if connect or not servers:
        raise ValueError(
            f"--ray launches the servers itself: it needs --servers >= 1 and no --connect, "
            f"got --servers {servers} and {len(connect)} --connect"
        )
    from simkit.clients.launcher._launch import launch

    launched = launch(
        env_id,
        servers,
        num_envs=max(1, s.num_envs // servers),
        address=o.ray or None,
        server_cpus=o.server_cpus,
        server_gpus=o.server_gpus,
        max_restarts=o.max_restarts,
        num_threads=s.env_threads,
        fragment_length=s.num_steps,
        heartbeat_timeout=max(60.0, 4 * o.server_timeout),
        env_vars=pinned_vars(),
        env_kwargs=env_kwargs,
    )
    logdir.mkdir(parents=True, exist_ok=True)
    launched.write_prometheus_targets(logdir / "prometheus_targets.json")
    return launched
