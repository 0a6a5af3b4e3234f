"""Multi-agent serving (protocol 1.1): (env, agent) rows with an agent mask. No IO.

A multi-agent session flattens its ``num_envs`` envs of ``A = len(agents)`` agents into
``num_envs * A`` rows, row ``r`` for agent ``agents[r % A]`` of env ``r // A``, exactly
the layout of :class:`simkit.vector.MultiAgentVectorEnv`. Every agent shares one
observation space and one action space (the handshake's per-row spaces).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from simkit._types import MultiAgentBatchStep
from simkit.protocol._client_session import ClientSession
from simkit.protocol._codec import Message
from simkit.protocol._errors import InvalidField
from simkit.protocol._handshake import ServerInfo
from simkit.protocol._infos import infos_from_wire
from simkit.protocol._server_session import EnvHost, ServerSession, request_env_ids
from simkit.protocol._spaces import check_batch, unflatten_batch
from simkit.protocol._step_reply import (
    MULTI_AGENT_STEP,
    EnvFault,
    decode_step_reply,
    encode_step_reply,
    final_obs_rows,
)

__all__ = [
    "ENV_KIND_SINGLE",
    "ENV_KIND_MULTI_AGENT",
    "MultiAgentHost",
    "MultiAgentServerSession",
    "MultiAgentReset",
    "MultiAgentStep",
    "parse_multi_agent_reset",
    "parse_multi_agent_step",
    "final_obs_rows",
]

ENV_KIND_SINGLE = "single"
ENV_KIND_MULTI_AGENT = "multi_agent"


class MultiAgentHost(EnvHost, Protocol):
    """What a :class:`MultiAgentServerSession` serves: N multi-agent envs as agent rows.

    ``observation_space``/``action_space`` are the per-row spaces; batched values have
    ``len(env_ids) * num_agents`` rows in ``env_ids`` order (``reset`` returns per-row
    infos).
    """

    possible_agents: list[str]
    num_agents: int

    def agent_mask(self, env_ids: np.ndarray) -> np.ndarray:
        """``(len(env_ids) * num_agents,)`` bool: which rows are live now."""
        ...

    def step(self, env_ids: np.ndarray, actions: Any) -> tuple[MultiAgentBatchStep, list[EnvFault]]:
        """Steps ``env_ids`` with action rows (rows of agents not live are ignored)."""
        ...


def _action_arrays(arrays: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[rows] for k, v in arrays.items() if k == "actions" or k.startswith("actions/")}


class MultiAgentServerSession(ServerSession[MultiAgentHost]):
    """A :class:`ServerSession` over a :class:`MultiAgentHost` (agent rows, agent mask).

    ``reset`` replies add ``agent_mask``; ``step`` takes one action row per (env, agent)
    of ``env_ids`` and checks dtype and shape of every row but values (finite, in
    range) only of live rows: rows of agents that are not live are ignored.
    """

    def _on_reset(self, msg: Message) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        body, arrays = super()._on_reset(msg)
        arrays["agent_mask"] = self.host.agent_mask(arrays["env_ids"])
        return body, arrays

    def _on_step(self, msg: Message) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        host = self.host
        env_ids = request_env_ids(msg, host.num_envs, everyone=self._all_ids)
        space = host.action_space
        check_batch(space, msg.arrays, "actions", env_ids.size * host.num_agents)
        live = np.flatnonzero(host.agent_mask(env_ids))
        check_batch(
            space,
            _action_arrays(msg.arrays, live),
            "actions",
            live.size,
            finite=True,
            in_space=True,
        )
        actions = unflatten_batch(space, msg.arrays, "actions")
        result, faults = host.step(env_ids, actions)
        self.steps += int(live.size)
        return encode_step_reply(
            MULTI_AGENT_STEP,
            host.observation_space,
            result,
            env_ids,
            faults,
            self.peer_version,
            rows_per_env=host.num_agents,
        )


@dataclass(frozen=True)
class MultiAgentReset:
    """A parsed multi-agent ``reset`` reply.

    Attributes:
        obs: ``(len(env_ids) * A, ...)`` observation rows (zeros where not live).
        agent_mask: ``(len(env_ids) * A,)`` bool, live rows.
        infos: per-row info dicts.
        env_ids: the envs of the reply, in row-block order.
    """

    obs: Any
    agent_mask: np.ndarray
    infos: list[dict[str, Any]]
    env_ids: np.ndarray


@dataclass(frozen=True)
class MultiAgentStep:
    """A parsed multi-agent ``step`` reply: the batch step, its env ids and faults."""

    step: MultiAgentBatchStep
    env_ids: np.ndarray
    faults: list[EnvFault]


def _multi_agent_info(session: ClientSession) -> tuple[ServerInfo, int]:
    info = session._server()
    if info.env_kind != ENV_KIND_MULTI_AGENT or not info.agents:
        raise InvalidField(
            "the server does not serve a multi-agent env",
            expected=f"env_kind {ENV_KIND_MULTI_AGENT!r} with agents",
            got=f"env_kind {info.env_kind!r}, agents {info.agents!r}",
        )
    return info, len(info.agents)


def _rows_array(arrays: dict[str, np.ndarray], key: str, n: int) -> np.ndarray:
    arr = arrays.get(key)
    if arr is None or arr.shape != (n,):
        raise InvalidField(
            f"reply lacks {key!r} of shape ({n},)",
            expected=f"{key} ({n},)",
            got=None if arr is None else list(arr.shape),
        )
    return arr


def _env_ids_of(arrays: dict[str, np.ndarray]) -> np.ndarray:
    env_ids = arrays.get("env_ids")
    if env_ids is None or env_ids.ndim != 1:
        raise InvalidField("reply lacks 1-D 'env_ids'", expected="env_ids", got=sorted(arrays))
    return env_ids


def parse_multi_agent_reset(session: ClientSession, frames: Sequence[Any]) -> MultiAgentReset:
    """Parses a multi-agent ``reset`` reply (after a handshake with a multi-agent server)."""
    msg = session.parse(frames, "reset")
    info, num_agents = _multi_agent_info(session)
    env_ids = _env_ids_of(msg.arrays)
    n = env_ids.size * num_agents
    check_batch(info.observation_space, msg.arrays, "obs", n)
    mask = _rows_array(msg.arrays, "agent_mask", n)
    infos = infos_from_wire(msg.body, n)
    obs = unflatten_batch(info.observation_space, msg.arrays, "obs")
    return MultiAgentReset(obs, mask, infos, env_ids)


def parse_multi_agent_step(session: ClientSession, frames: Sequence[Any]) -> MultiAgentStep:
    """Parses a multi-agent ``step`` reply; ``final_obs`` is rebuilt for every row."""
    msg = session.parse(frames, "step")
    info, num_agents = _multi_agent_info(session)
    reply = decode_step_reply(
        MULTI_AGENT_STEP, info.observation_space, msg, rows_per_env=num_agents
    )
    return MultiAgentStep(reply.step(MultiAgentBatchStep), reply.env_ids, reply.faults)
