"""Remote multi-agent envs: a PettingZoo ``ParallelEnv`` and a multi-agent vector over the wire.

:class:`RemoteMultiAgentVectorEnv` mirrors :class:`simkit.vector.MultiAgentVectorEnv`
(fixed (env, agent) rows, ``agent_mask``, :class:`~simkit.vector.MultiAgentBatchStep`)
and equals it bit for bit for the same seeds and actions. :class:`RemoteParallelEnv`
is one remote env behind the PettingZoo Parallel API (agent dicts).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from pettingzoo import ParallelEnv

from simkit._multiagent import ParallelStepResult
from simkit._types import MultiAgentBatchStep
from simkit._validation import check_seed
from simkit.clients.remote._connection import Connection, ConnectOptions
from simkit.errors import InvalidAction, ResetNeeded
from simkit.protocol import (
    ENV_KIND_MULTI_AGENT,
    EnvFault,
    MultiAgentReset,
    MultiAgentStep,
    ServerInfo,
    parse_multi_agent_reset,
    parse_multi_agent_step,
)

__all__ = ["RemoteMultiAgentVectorEnv", "RemoteParallelEnv"]


def _open(endpoint: str, client: str, connect: ConnectOptions) -> Connection:
    """Connects and shakes hands with a server that must serve a multi-agent env."""
    conn = Connection(endpoint, **connect)
    try:
        info = conn.hello(client)
    except BaseException:
        conn.close(polite=False)
        raise
    if info.env_kind != ENV_KIND_MULTI_AGENT or not info.agents:
        conn.close()
        raise ValueError(
            f"{endpoint} serves {info.env_id!r} as env_kind {info.env_kind!r}; a remote "
            f"multi-agent env needs env_kind {ENV_KIND_MULTI_AGENT!r} (use RemoteVectorEnv)"
        )
    return conn


def _rows(space: spaces.Space[Any], batch: Any, n: int) -> list[Any]:
    """The ``n`` rows of a batched value of ``space`` (views)."""
    return list(iterate(batch_space(space, n), batch))


def _own_rows(space: spaces.Space[Any], batch: Any, n: int) -> list[Any]:
    """The ``n`` rows of a batched value of ``space``, as writable copies."""
    return [copy.deepcopy(row) for row in _rows(space, batch, n)]


class _Session:
    """What both remote classes share: their connection's reset and step requests, and
    closing it (politely on :meth:`close`, at once when dropped unclosed)."""

    _conn: Connection
    closed: bool

    def _request_reset(self, env_ids: Any = None, **kwargs: Any) -> MultiAgentReset:
        self._conn.send("reset", self._conn.session.request_reset(env_ids=env_ids, **kwargs))
        return parse_multi_agent_reset(self._conn.session, self._conn.recv())

    def _request_step(self, actions: Any, env_ids: Any = None) -> MultiAgentStep:
        self._conn.send("step", self._conn.session.request_step(actions, env_ids=env_ids))
        return parse_multi_agent_step(self._conn.session, self._conn.recv())

    def close(self) -> None:
        """Ends the session (the server frees the envs) and closes the socket."""
        if not self.closed:
            self.closed = True
            self._conn.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self._conn.close(polite=False)


class RemoteMultiAgentVectorEnv(_Session):
    """The envs of one multi-agent rollout server as (env, agent) rows.

    The same interface and data as :class:`simkit.vector.MultiAgentVectorEnv`: row
    ``r`` is agent ``possible_agents[r % A]`` of env ``r // A``; :meth:`reset` returns
    ``(obs, agent_mask, infos)``, :meth:`step` a :class:`~simkit.vector.MultiAgentBatchStep`
    (rows of agents that are not live are ignored by the server). Seeding is the
    vector's, so for equal seeds and actions the results are bit-identical.

    Args:
        endpoint: the server's ZeroMQ endpoint (it must serve a multi-agent env).
        client: a name the server logs for this client.
        timeout, context, curve, keepalive, busy_poll_us: the connection, as for
            :class:`simkit.clients.RemoteVectorEnv` (one server here).

    Raises:
        ServerUnavailable: the server did not answer the handshake in time.
        ValueError: the server serves a single-agent env.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        client: str = "simkit-remote-multi-agent",
        **connect: Unpack[ConnectOptions],
    ) -> None:
        self._conn = _open(endpoint, client, connect)
        info = self._conn.info
        assert info.agents is not None
        self.endpoint = endpoint
        self.env_id = info.env_id
        self.capabilities = info.capabilities
        self.num_envs = info.num_envs
        self.possible_agents: list[str] = list(info.agents)
        self.num_agents = len(self.possible_agents)
        self.num_rows = self.num_envs * self.num_agents
        self.single_observation_space: spaces.Space[Any] = info.observation_space
        self.single_action_space: spaces.Space[Any] = info.action_space
        self.observation_space = batch_space(info.observation_space, self.num_rows)
        self.action_space = batch_space(info.action_space, self.num_rows)
        self.row_env = np.repeat(np.arange(self.num_envs, dtype=np.int64), self.num_agents)
        """``(rows,)`` the env of each row."""
        self._slot = {agent: k for k, agent in enumerate(self.possible_agents)}
        self._mask = np.zeros(self.num_rows, dtype=np.bool_)
        self._has_reset = False
        self.faults: list[EnvFault] = []
        """Envs that raised on the last step; their episodes ended (truncated) and reset."""
        self.closed = False

    @property
    def server_info(self) -> ServerInfo:
        """The server's handshake."""
        return self._conn.info

    def row(self, env_index: int, agent: str) -> int:
        """The row of ``agent`` in env ``env_index``."""
        return env_index * self.num_agents + self._slot[agent]

    @property
    def agent_mask(self) -> np.ndarray:
        """``(rows,)`` bool: rows whose agent is live now (a copy)."""
        return self._mask.copy()

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, np.ndarray, list[dict[str, Any]]]:
        """Resets every env; seeds as :meth:`simkit.vector.MultiAgentVectorEnv.reset`.

        ``seed``: an int root (env ``i`` gets ``episode_seed(seed, i, k)``), a list of
        ``num_envs`` ints or None (an int resets that env with exactly that seed, None
        starts its next episode), or None (every env starts its next episode).

        Returns:
            ``(obs, agent_mask, infos)`` over all rows.
        """
        n = self.num_envs
        if seed is None or isinstance(seed, int | np.integer):
            kw: dict[str, Any] = {} if seed is None else {"seed": check_seed(seed, "seed")}
            result = self._request_reset(options=options, **kw)
            obs, mask, infos = result.obs, result.agent_mask, result.infos
        elif isinstance(seed, Sequence) and not isinstance(seed, str) and len(seed) == n:
            explicit = [i for i, s in enumerate(seed) if s is not None]
            rest = [i for i, s in enumerate(seed) if s is None]
            parts: list[tuple[list[int], MultiAgentReset]] = []
            if explicit:
                seeds = [check_seed(seed[i], f"seed[{i}]") for i in explicit]
                reply = self._request_reset(explicit, seeds=seeds, options=options)
                parts.append((explicit, reply))
            if rest:
                parts.append((rest, self._request_reset(rest, options=options)))
            A, space, R = self.num_agents, self.single_observation_space, self.num_rows
            rows: list[Any] = [None] * R
            mask = np.zeros(R, dtype=np.bool_)
            infos = [{} for _ in range(R)]
            for env_list, part in parts:
                got = _rows(space, part.obs, len(env_list) * A)
                for k, i in enumerate(env_list):
                    for s in range(A):
                        rows[i * A + s] = got[k * A + s]
                        infos[i * A + s] = part.infos[k * A + s]
                    mask[i * A : (i + 1) * A] = part.agent_mask[k * A : (k + 1) * A]
            out: Any = create_empty_array(space, R, np.zeros)
            obs = concatenate(space, rows, out)
        else:
            raise ValueError(
                f"seed must be an int, a list of {n} int | None, or None, got {seed!r}"
            )
        self._mask = np.array(mask, dtype=np.bool_)
        self._has_reset = True
        return obs, self._mask.copy(), infos

    def step(self, actions: Any) -> MultiAgentBatchStep:
        """Steps every env with the live rows of ``actions`` (``(rows, *action_shape)``).

        Raises:
            ResetNeeded: called before :meth:`reset`.
            simkit.protocol.RemoteError: the server refused the actions (nothing moved).
        """
        if not self._has_reset:
            raise ResetNeeded("step() called before reset(); call reset() first")
        result = self._request_step(actions)
        self.faults = result.faults
        self._mask = np.array(result.step.agent_mask, dtype=np.bool_)
        return result.step

    def get_state(self) -> list[dict[str, Any]]:
        """One opaque snapshot per env (capability ``state``); send back with :meth:`set_state`."""
        self._conn.send("get_state", self._conn.session.request_get_state())
        return self._conn.session.parse_get_state(self._conn.recv())

    def set_state(self, states: Sequence[Mapping[str, Any]]) -> None:
        """Restores snapshots from :meth:`get_state`; the continuation is bit-identical."""
        self._conn.send("set_state", self._conn.session.request_set_state(states))
        self._conn.session.parse_set_state(self._conn.recv())
        A = self.num_agents
        self._mask = np.concatenate(
            [np.asarray(s["agent_mask"], dtype=np.bool_).reshape(A) for s in states]
        )
        self._has_reset = True

    def __enter__(self) -> RemoteMultiAgentVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteParallelEnv(_Session, ParallelEnv[str, Any, Any]):
    """One remote multi-agent env behind the PettingZoo Parallel API.

    ``reset``/``step`` take and return agent dicts; ``agents`` holds the live agents.
    The server resets an env in the same step as its last agent finishes: the step
    still returns the finished agents' last observations, ``agents`` becomes empty, and
    the next ``reset()`` (no seed, no options) takes the episode the server already
    started, so seeding matches a local env reset with the same seeds; ``reset(options=...)``
    then replaces that episode (``replace_autoreset``: the server undoes the autoreset's
    draws), as a local env's would start. ``reset(seed=s)`` resets the env with exactly
    ``s`` (as ``env.reset(seed=s)`` does locally).

    Args:
        endpoint: the server's ZeroMQ endpoint (it must serve a multi-agent env).
        env_index: which of the session's envs this object drives.
        timeout, client, context, curve, keepalive, busy_poll_us: the connection, as
            for :class:`RemoteMultiAgentVectorEnv`.

    Raises:
        ServerUnavailable: the server did not answer the handshake in time.
        ValueError: the server serves a single-agent env, or ``env_index`` is out of range.
    """

    metadata: dict[str, Any] = {"render_modes": [], "name": "simkit_remote_parallel"}

    def __init__(
        self,
        endpoint: str,
        *,
        env_index: int = 0,
        client: str = "simkit-remote-parallel",
        **connect: Unpack[ConnectOptions],
    ) -> None:
        conn = _open(endpoint, client, connect)
        info = conn.info
        if isinstance(env_index, bool) or not 0 <= env_index < info.num_envs:
            conn.close()
            raise ValueError(f"env_index must be in [0, {info.num_envs}), got {env_index!r}")
        self._conn = conn
        assert info.agents is not None
        self.endpoint = endpoint
        self.env_index = int(env_index)
        self._ids = np.array([self.env_index], dtype=np.int64)
        self.possible_agents: list[str] = list(info.agents)
        self.agents: list[str] = []
        self.render_mode = None
        # one space object per agent, so seeding one agent's space leaves the others alone
        self.observation_spaces: dict[str, spaces.Space[Any]] = {
            a: copy.deepcopy(info.observation_space) for a in self.possible_agents
        }
        self.action_spaces: dict[str, spaces.Space[Any]] = {
            a: copy.deepcopy(info.action_space) for a in self.possible_agents
        }
        self._space = info.action_space
        self._obs_space = info.observation_space
        self._zero_action = _rows(self._space, create_empty_array(self._space, 1), 1)[0]
        self._pending: MultiAgentReset | None = None
        self.faults: list[EnvFault] = []
        """Faults of the last step (the env raised; its episode ended, truncated)."""
        self.closed = False

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self.action_spaces[agent]

    def _live(self, mask: np.ndarray) -> list[str]:
        return [a for k, a in enumerate(self.possible_agents) if mask[k]]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Starts an episode; returns observations and infos of the live agents."""
        if seed is not None:
            result = self._request_reset(
                self._ids, seeds=[check_seed(seed, "seed")], options=options
            )
        elif self._pending is not None and options is None:
            result = self._pending
        else:  # with options after the episode's end: it replaces the server's autoreset
            replace = self._pending is not None
            result = self._request_reset(self._ids, options=options, replace_autoreset=replace)
        self._pending = None
        self.agents = self._live(result.agent_mask)
        rows = _own_rows(self._obs_space, result.obs, self.num_agents)
        live = [(k, a) for k, a in enumerate(self.possible_agents) if result.agent_mask[k]]
        return {a: rows[k] for k, a in live}, {a: result.infos[k] for k, a in live}

    def step(self, actions: Mapping[str, Any]) -> ParallelStepResult[str, Any]:
        """Steps every live agent; returns dicts keyed by the agents that acted.

        Raises:
            ResetNeeded: no live agents (call :meth:`reset`).
            simkit.errors.InvalidAction: ``actions`` misses a live agent or names another.
        """
        if not self.agents:
            raise ResetNeeded("step() with no live agents; call reset() first")
        if not isinstance(actions, Mapping):
            raise InvalidAction(
                f"actions must be a dict keyed by agent, got {type(actions).__name__}"
            )
        missing = [a for a in self.agents if a not in actions]
        extra = [a for a in actions if a not in self.agents]
        if missing or extra:
            raise InvalidAction(
                f"actions must cover exactly the live agents {self.agents}; "
                f"missing {missing}, not live {extra}"
            )
        items = [actions.get(a, self._zero_action) for a in self.possible_agents]
        out: Any = create_empty_array(self._space, len(items))
        batch: Any = concatenate(self._space, items, out)
        result = self._request_step(batch, self._ids)
        step, self.faults = result.step, result.faults
        final = _own_rows(self._obs_space, step.final_obs, self.num_agents)
        acted = [(k, a) for k, a in enumerate(self.possible_agents) if step.acted[k]]
        obs = {a: final[k] for k, a in acted}
        rewards = {a: float(step.reward[k]) for k, a in acted}
        terms = {a: bool(step.terminated[k]) for k, a in acted}
        truncs = {a: bool(step.truncated[k]) for k, a in acted}
        infos = {a: {x: v for x, v in step.infos[k].items() if x != "reset_info"} for k, a in acted}
        if step.env_reset[0]:
            self.agents = []
            self._pending = MultiAgentReset(
                obs=step.obs,
                agent_mask=step.agent_mask,
                infos=[dict(i.get("reset_info", {})) for i in step.infos],
                env_ids=self._ids,
            )
        else:
            self.agents = self._live(step.agent_mask)
        return obs, rewards, terms, truncs, infos
