"""RemoteVectorEnv: a Gymnasium ``VectorEnv`` whose envs live in one or more rollout servers.

Learner code written against ``gymnasium.vector.VectorEnv`` runs unchanged; the typed
:meth:`RemoteVectorEnv.step_batch` and the EnvPool-style :meth:`RemoteVectorEnv.send` /
:meth:`RemoteVectorEnv.recv` expose the protocol's explicit episode boundaries and let a
learner overlap its own work (or a second half of the envs) with the servers' stepping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, Unpack

import gymnasium as gym
import numpy as np
import zmq
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, create_empty_array

from simkit._seeding import ResetSeed, wire_seed
from simkit._types import BatchStep
from simkit._validation import checked_env_ids
from simkit.clients.remote._connection import Connection, ConnectOptions, ServerUnavailable
from simkit.errors import ResetNeeded
from simkit.protocol import AUTORESET_SAME_STEP, EnvFault, RemoteError, ServerInfo
from simkit.protocol import take_rows as _take
from simkit.vector._build import no_frames, no_sub_env_methods

__all__ = ["RemoteVectorEnv"]

_AUTORESET_MODES = {AUTORESET_SAME_STEP: AutoresetMode.SAME_STEP}


def _concat(space: spaces.Space[Any], parts: Sequence[Any]) -> Any:
    """Concatenates batched values along the env axis (always a fresh, writable copy)."""
    if isinstance(space, spaces.Dict):
        return {k: _concat(s, [p[k] for p in parts]) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_concat(s, [p[i] for p in parts]) for i, s in enumerate(space.spaces))
    if len(parts) == 1:
        return np.array(parts[0], copy=True)
    return np.concatenate([np.asarray(p) for p in parts], axis=0)


def _put(space: spaces.Space[Any], out: Any, index: Any, value: Any) -> None:
    """Writes rows ``index`` of a batched value in place."""
    if isinstance(space, spaces.Dict):
        for k, s in space.spaces.items():
            _put(s, out[k], index, value[k])
    elif isinstance(space, spaces.Tuple):
        for i, s in enumerate(space.spaces):
            _put(s, out[i], index, value[i])
    else:
        out[index] = value


class _LossGuard:
    """Marks a :class:`RemoteVectorEnv` broken when a request inside loses its connection
    or session: a plain class, as a ``contextlib`` generator costs a few microseconds per
    request."""

    def __init__(self, vector: RemoteVectorEnv) -> None:
        self._vector = vector

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> Literal[False]:
        if isinstance(exc, ServerUnavailable):
            self._vector._broken = True
        elif isinstance(exc, RemoteError) and exc.remote_code == "session_state":
            self._vector._broken = True  # the server dropped our session
        return False


def _unless_all(ids: np.ndarray, everyone: np.ndarray) -> np.ndarray | None:
    """``None`` (the wire's "every env, in order") when ``ids`` is ``everyone``, else ids."""
    if ids is everyone or (ids.size == everyone.size and (ids == everyone).all()):
        return None
    return ids


class RemoteVectorEnv(gym.vector.VectorEnv[Any, Any, Any]):
    """A ``gymnasium.vector.VectorEnv`` over the simkit wire protocol.

    Env indices of several servers are concatenated in the order of ``endpoints``:
    server ``s`` holds envs ``offset_s .. offset_s + n_s - 1``. Seeding matches a local
    vector of the same total size: ``reset(seed=r)`` gives global env ``g`` the seed
    ``episode_seed(r, g, k)`` for its ``k``-th episode, whichever server hosts it.

    Servers autoreset in the same step; :meth:`step` reports it Gymnasium's way under
    ``autoreset_mode`` (``metadata["autoreset_mode"]``), exactly as a local
    :class:`simkit.vector.VectorEnv`: ``SAME_STEP`` returns the next episode's first
    observation with the last one in ``infos["final_obs"]`` and the episode's info in
    ``infos["final_info"]``; ``NEXT_STEP`` (what Gymnasium's observation wrappers such as
    ``NormalizeObservation`` require) returns the last observation and delivers the
    reset on the following step, ignoring that env's action.

    Args:
        endpoints: one ZeroMQ endpoint or a list of them.
        timeout: seconds to wait for every reply before raising :class:`ServerUnavailable`
            (default 10).
        client: a name the servers log for this client.
        context: a ZeroMQ context (default: the process-wide instance).
        autoreset_mode: ``SAME_STEP`` (default) or ``NEXT_STEP`` for :meth:`step`;
            :meth:`step_batch` and :meth:`recv` always report same-step.
        curve: CURVE keys for servers bound beyond loopback (one set for every server).
        keepalive: keep each session alive from a background thread while the learner
            is silent (e.g. a long update), so the servers do not drop it after their
            heartbeat timeout.
        busy_poll_us: poll this many microseconds for each reply before sleeping in
            the kernel, as the server does for requests (docs/clients.md): it saves the
            learner's wake-up (docs/benchmarks.md, "Remote") for up to this much CPU
            per wait. Off by default: a spinning learner holds the GIL, so a server
            started in the same process (``RolloutServer.start()``) could not answer
            until the spin ends.

    Raises:
        ServerUnavailable: a server did not answer the handshake in time.
        ValueError: servers disagree on env id, spaces or autoreset mode.
    """

    call, get_attr, set_attr = no_sub_env_methods("remote")  # docs/clients.md says why
    render = no_frames

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        client: str = "simkit-remote-vector",
        autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP,
        **connect: Unpack[ConnectOptions],
    ) -> None:
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        if self.autoreset_mode is AutoresetMode.DISABLED:
            raise ValueError(
                "autoreset_mode must be SAME_STEP or NEXT_STEP (servers always autoreset), "
                "got DISABLED"
            )
        endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not endpoints:
            raise ValueError("RemoteVectorEnv needs at least one endpoint, got none")
        self._client = client
        self._conns = [Connection(e, **connect) for e in endpoints]
        self._broken = False
        self.closed = False
        try:
            self._handshake()
        except BaseException:
            for conn in self._conns:
                conn.close(polite=False)
            raise
        info = self._conns[0].info
        self.num_envs = sum(self._sizes)
        self.single_observation_space = info.observation_space
        self.single_action_space = info.action_space
        self.observation_space = batch_space(info.observation_space, self.num_envs)
        self.action_space = batch_space(info.action_space, self.num_envs)
        self.metadata = {
            "autoreset_mode": self.autoreset_mode,
            "env_id": info.env_id,
            "endpoints": list(endpoints),
        }
        self._reset_done = False
        self._pending_step: np.ndarray | None = None
        self._inflight: list[list[np.ndarray]] = [[] for _ in self._conns]
        self._autoreset_envs = np.zeros(self.num_envs, dtype=bool)
        self._reset_obs: list[Any] = [None] * self.num_envs
        self._reset_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self.faults: list[EnvFault] = []
        """Envs that raised on the last step (global ids); their episodes ended, truncated."""

    # -- connection management -------------------------------------------------------

    def _handshake(self) -> None:
        with _LossGuard(self):
            infos = [c.hello(self._client) for c in self._conns]
        first = infos[0]
        for conn, info in zip(self._conns[1:], infos[1:], strict=True):
            for what in ("env_id", "observation_space", "action_space", "autoreset"):
                if getattr(info, what) != getattr(first, what):
                    raise ValueError(
                        f"servers must serve the same env: {self._conns[0].endpoint} has "
                        f"{what}={getattr(first, what)!r}, {conn.endpoint} has "
                        f"{getattr(info, what)!r}"
                    )
        if first.autoreset not in _AUTORESET_MODES:
            raise ValueError(
                f"unknown server autoreset mode: expected one of {sorted(_AUTORESET_MODES)}, "
                f"got {first.autoreset!r}"
            )
        if first.env_kind != "single":
            raise ValueError(
                f"RemoteVectorEnv serves single-agent envs, {first.env_id!r} is {first.env_kind}"
            )
        self._sizes = [i.num_envs for i in infos]
        self._offsets = np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64)
        self._all_ids = np.arange(sum(self._sizes), dtype=np.int64)
        self._all_ids.flags.writeable = False

    @property
    def server_infos(self) -> list[ServerInfo]:
        """The handshake of each server, in endpoint order."""
        return [c.info for c in self._conns]

    @property
    def timeout(self) -> float:
        """Seconds every request waits for its reply before :class:`ServerUnavailable`."""
        return self._conns[0].timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        if not value > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {value!r}")
        for conn in self._conns:
            conn.timeout = float(value)

    @property
    def endpoints(self) -> list[str]:
        """The endpoints, in env-index order."""
        return [c.endpoint for c in self._conns]

    def reconnect(self) -> None:
        """Opens fresh sessions with every server (e.g. after a restart); reset next.

        Raises:
            ServerUnavailable: a server is still not answering.
            ValueError: a restarted server serves a different env or number of envs.
        """
        if self.closed:
            raise RuntimeError("this RemoteVectorEnv is closed")
        old = (self.single_observation_space, self.single_action_space, list(self._sizes))
        for conn in self._conns:
            conn.reopen()
        self._broken = True
        self._handshake()
        info = self._conns[0].info
        new = (info.observation_space, info.action_space, list(self._sizes))
        if new != old:
            raise ValueError(
                f"the reconnected servers serve another env layout: expected {old}, got {new}"
            )
        self._broken = self._reset_done = False
        self._pending_step = None
        self._inflight = [[] for _ in self._conns]

    # -- splitting and merging -------------------------------------------------------

    def _split_ids(self, env_ids: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """``(server, rows of env_ids, local ids)`` for each server that owns some ids."""
        server = np.searchsorted(self._offsets, env_ids, side="right") - 1
        split = [(s, np.flatnonzero(server == s)) for s in range(len(self._conns))]
        return [(s, rows, env_ids[rows] - self._offsets[s]) for s, rows in split if rows.size]

    def _check_ids(self, env_ids: Any) -> np.ndarray:
        if env_ids is None:
            return self._all_ids
        return checked_env_ids(env_ids, self.num_envs, allow_empty=False)

    def _ready(self) -> None:
        if self.closed:
            raise RuntimeError("this RemoteVectorEnv is closed")
        if self._broken:
            raise ResetNeeded("the connection was lost; call reset() (it reconnects) first")
        if not self._reset_done:
            raise ResetNeeded("call reset() before stepping a RemoteVectorEnv")

    # -- reset -----------------------------------------------------------------------

    def reset(
        self, *, seed: ResetSeed = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (reconnecting first if a server was lost).

        Args:
            seed: a root seed (env ``g`` gets ``episode_seed(seed, g, k)``), a list of
                one int per env (or a 1-D int array: env ``g`` reset with exactly
                ``seed[g]``, then its own generator, as a local vector; no ``None``: the
                wire has no form for it), or ``None`` to continue each env's seeds;
                every seed in ``[0, 2**63)``, checked before any server is asked.
            options: reset options passed to every env (e.g. ``{"params": {...}}``).

        Returns:
            Batched observations and Gymnasium-style vector infos.
        """
        if self.closed:
            raise RuntimeError("this RemoteVectorEnv is closed")
        if options is not None and "reset_mask" in options:
            raise ValueError(
                "RemoteVectorEnv resets every env: expected options without 'reset_mask', "
                "got reset_mask (servers autoreset ended envs themselves)"
            )
        root, seeds = wire_seed(seed, self.num_envs)  # checked before any server moves
        if self._broken:
            self.reconnect()
        self._drain()
        for s, conn in enumerate(self._conns):
            lo, hi = int(self._offsets[s]), int(self._offsets[s + 1])
            frames = conn.session.request_reset(
                seed=root,
                seeds=None if seeds is None else seeds[lo:hi],
                options=options,
                env_offset=lo if len(self._conns) > 1 else None,
            )
            conn.send("reset", frames)
        parts: list[Any] = []
        infos: dict[str, Any] = {}
        for s, conn in enumerate(self._conns):
            with _LossGuard(self):
                result = conn.session.parse_reset(conn.recv())
            parts.append(result.obs)
            for k, info in enumerate(result.infos):
                infos = self._add_info(infos, info, int(self._offsets[s]) + k)
        self._reset_done = True
        self._autoreset_envs[:] = False
        self._reset_obs = [None] * self.num_envs
        if root is not None:  # Gymnasium's VectorEnv.reset seeds the vector's np_random
            self._np_random, self._np_random_seed = seeding.np_random(root)
        return _concat(self.single_observation_space, parts), infos

    # -- stepping --------------------------------------------------------------------

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Sends ``actions`` for ``env_ids`` (all envs when ``None``) without waiting.

        EnvPool-style: each server that owns some of the ids gets one request;
        :meth:`recv` returns the replies as they arrive. Rows of ``actions`` follow
        ``env_ids``.
        """
        self._ready()
        self._send_ids(actions, self._check_ids(env_ids))

    def _send_ids(self, actions: Any, ids: np.ndarray) -> None:
        """:meth:`send` for checked ``ids`` (``self._all_ids`` for every env)."""
        if self.autoreset_mode is AutoresetMode.NEXT_STEP and self._autoreset_envs[ids].any():
            raise ResetNeeded(
                f"envs {ids[self._autoreset_envs[ids]].tolist()} await their NEXT_STEP reset "
                "from step(); call step() or reset() first"
            )
        if len(self._conns) == 1:
            conn = self._conns[0]
            conn.send("step", conn.session.request_step(actions, _unless_all(ids, self._all_ids)))
            self._inflight[0].append(ids)
            return
        for s, rows, local in self._split_ids(ids):
            conn = self._conns[s]
            part = _take(self.single_action_space, actions, rows)
            everyone = self._all_ids[: self._sizes[s]]
            conn.send("step", conn.session.request_step(part, _unless_all(local, everyone)))
            self._inflight[s].append(ids[rows])

    def recv(self, timeout: float | None = None) -> BatchStep:
        """The next finished step of one server, as a :class:`BatchStep` with global ids.

        Raises:
            RuntimeError: nothing was sent.
            ServerUnavailable: no server answered within ``timeout`` (default: the
                connections' timeout).
        """
        busy = [s for s, q in enumerate(self._inflight) if q]
        if not busy:
            raise RuntimeError("recv() without a pending send(); call send() first")
        poller = zmq.Poller()
        for s in busy:
            poller.register(self._conns[s].socket, zmq.POLLIN)
        wait = self._conns[busy[0]].timeout if timeout is None else timeout
        ready = dict(poller.poll(int(wait * 1000)))
        for s in busy:
            if self._conns[s].socket in ready:
                return self._recv_from(s)
        self._broken = True
        raise ServerUnavailable(", ".join(self._conns[s].endpoint for s in busy), wait, "'step'")

    def _recv_from(self, s: int) -> BatchStep:
        conn = self._conns[s]
        ids = self._inflight[s].pop(0)
        with _LossGuard(self):
            step, faults = conn.session.parse_step(conn.recv())
        offset = int(self._offsets[s])
        if faults:
            self.faults.extend(EnvFault(f.env_id + offset, f.code, f.message) for f in faults)
        global_ids = np.asarray(step.env_ids, dtype=np.int64)
        if offset:
            global_ids = global_ids + offset
        # A few ids compare as lists (cheaper than numpy's compare and reduction).
        if global_ids.shape != ids.shape or not (
            global_ids.tolist() == ids.tolist() if ids.size <= 64 else (global_ids == ids).all()
        ):
            raise RuntimeError(
                f"server {conn.endpoint} answered for envs {global_ids.tolist()}, "
                f"expected {ids.tolist()}"
            )
        return step if global_ids is step.env_ids else dataclasses.replace(step, env_ids=global_ids)

    def _drain(self) -> None:
        for s, queue in enumerate(self._inflight):
            while queue:
                self._recv_from(s)
        self._pending_step = None

    def step_batch(self, actions: Any, env_ids: Any = None) -> BatchStep:
        """Steps ``env_ids`` (all when ``None``) and returns one typed :class:`BatchStep`.

        Rows follow ``env_ids``; across several servers the requests run concurrently.
        Arrays may be zero-copy, read-only views of the reply: copy before writing.
        """
        self.faults = []
        ids = self._check_ids(env_ids)
        if any(self._inflight):
            raise RuntimeError("step_batch() with send()s in flight; recv() them first")
        self._ready()
        self._send_ids(actions, ids)
        parts = [self._recv_from(s) for s, q in enumerate(self._inflight) if q]
        if len(parts) == 1:
            return parts[0]  # _recv_from checked its rows are ``ids``, in order
        got = np.concatenate([p.env_ids for p in parts])
        order = np.argsort(got)[np.argsort(np.argsort(ids))]
        space = self.single_observation_space
        all_infos = [info for p in parts for info in p.infos]
        return BatchStep(
            obs=_take(space, _concat(space, [p.obs for p in parts]), order),
            reward=np.concatenate([p.reward for p in parts])[order],
            terminated=np.concatenate([p.terminated for p in parts])[order],
            truncated=np.concatenate([p.truncated for p in parts])[order],
            final_obs=_take(space, _concat(space, [p.final_obs for p in parts]), order),
            env_ids=got[order],
            infos=[all_infos[k] for k in order.tolist()] if all_infos else [],
        )

    def step_async(self, actions: Any) -> None:
        """Sends actions for every env; :meth:`step_wait` collects the result.

        Under ``NEXT_STEP`` the envs that ended on the previous step are not sent (their
        action is ignored): the server already reset them, the client reports the reset.
        """
        if self._pending_step is not None:
            raise RuntimeError("step_async() called twice; call step_wait() first")
        self._ready()
        self.faults = []
        ids = np.flatnonzero(~self._autoreset_envs).astype(np.int64)
        if ids.size == self.num_envs:
            self.send(actions)
        elif ids.size:
            self.send(_take(self.single_action_space, actions, ids), ids)
        self._pending_step = ids

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Collects the step sent by :meth:`step_async` (Gymnasium return values)."""
        if self._pending_step is None:
            raise RuntimeError("step_wait() without step_async(); call step_async() first")
        self._pending_step = None
        parts = [self._recv_from(s) for s, q in enumerate(self._inflight) if q]
        space = self.single_observation_space
        infos: dict[str, Any] = {}
        if self.autoreset_mode is not AutoresetMode.NEXT_STEP:
            for p in parts:
                done = p.done
                for k, g in enumerate(p.env_ids.tolist()):
                    info = p.infos[k] if p.infos else {}
                    if done[k]:
                        final_info = {key: v for key, v in info.items() if key != "reset_info"}
                        final_obs = _take(space, p.final_obs, k)
                        final = {"final_obs": final_obs, "final_info": final_info}
                        infos = self._add_info(infos, final, g)
                        info = info.get("reset_info", {})
                    infos = self._add_info(infos, info, g)
            return (
                _concat(space, [p.obs for p in parts]),
                np.concatenate([p.reward for p in parts]),
                np.concatenate([p.terminated for p in parts]),
                np.concatenate([p.truncated for p in parts]),
                infos,
            )
        n = self.num_envs
        obs = create_empty_array(space, n, np.zeros)
        reward = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        for g in np.flatnonzero(self._autoreset_envs).tolist():
            _put(space, obs, g, self._reset_obs[g])
            infos = self._add_info(infos, self._reset_infos[g], g)
            self._reset_obs[g] = None
        self._autoreset_envs[:] = False
        for p in parts:
            done = p.done
            ids = p.env_ids
            _put(space, obs, ids, p.final_obs)
            reward[ids], terminated[ids], truncated[ids] = p.reward, p.terminated, p.truncated
            for k, g in enumerate(ids.tolist()):
                info = p.infos[k] if p.infos else {}
                if done[k]:
                    self._autoreset_envs[g] = True
                    self._reset_obs[g] = _take(space, p.obs, k)
                    self._reset_infos[g] = info.get("reset_info", {})
                    info = {key: v for key, v in info.items() if key != "reset_info"}
                infos = self._add_info(infos, info, g)
        return obs, reward, terminated, truncated, infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every env (Gymnasium ``VectorEnv.step``, same-step autoreset)."""
        self.step_async(actions)
        return self.step_wait()

    # -- snapshots -------------------------------------------------------------------

    def get_state(self, env_ids: Any = None) -> list[dict[str, Any]]:
        """Plain-data snapshots of ``env_ids`` (all when ``None``), one per env."""
        self._ready()
        ids = self._check_ids(env_ids)
        out: list[dict[str, Any] | None] = [None] * ids.size
        split = self._split_ids(ids)
        for s, _rows, local in split:
            conn = self._conns[s]
            conn.send("get_state", conn.session.request_get_state(local))
        for s, rows, _local in split:
            conn = self._conns[s]
            with _LossGuard(self):
                states = conn.session.parse_get_state(conn.recv())
            for r, st in zip(rows.tolist(), states, strict=True):
                out[r] = st
        return [st for st in out if st is not None]

    def set_state(self, states: Sequence[dict[str, Any]], env_ids: Any = None) -> None:
        """Restores snapshots from :meth:`get_state` into ``env_ids`` (all when ``None``)."""
        self._ready()
        ids = self._check_ids(env_ids)
        if len(states) != ids.size:
            raise ValueError(f"set_state needs one snapshot per env: {ids.size}, got {len(states)}")
        split = self._split_ids(ids)
        for s, rows, local in split:
            conn = self._conns[s]
            conn.send("set_state", conn.session.request_set_state([states[r] for r in rows], local))
        for s, _rows, _local in split:
            conn = self._conns[s]
            with _LossGuard(self):
                conn.session.parse_set_state(conn.recv())

    def ping(self) -> None:
        """Checks every server answers (raises :class:`ServerUnavailable` otherwise)."""
        for conn in self._conns:
            if conn.pending:
                continue
            conn.send("ping", conn.session.request_ping())
            with _LossGuard(self):
                conn.session.parse_ping(conn.recv())

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            for conn in getattr(self, "_conns", []):
                conn.close(polite=False)

    def close_extras(self, **kwargs: Any) -> None:
        """Ends every session (frees the server's slots) and closes the sockets."""
        for conn in self._conns:
            conn.close(polite=not self._broken)
