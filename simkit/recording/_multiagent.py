"""The multi-agent episode and its record (kind 2): per-agent arrays of their own lengths.

A multi-agent episode is one episode of a PettingZoo Parallel env: ``T`` env steps, and
for every agent that took part its own trajectory, starting at the env step it first
acted (``start``) and lasting its own number of steps (agents leave early, or join
late). It is written by the same writer into the same chunk files as single-agent
episodes, with the frame kind byte 2 (docs/recording.md, "Multi-agent episode records").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simkit.recording._episode import (
    DECODE_ERRORS,
    Trajectory,
    checked_infos,
    decode_origin,
    decode_trajectory,
    encode_trajectory,
    pack_record,
    plain_body,
    record_origin_meta,
    undecodable,
    unpack_record,
    version_range,
)

__all__ = ["AgentEpisode", "MultiAgentEpisode", "encode_multi_agent", "decode_multi_agent"]


@dataclass
class AgentEpisode(Trajectory):
    """One agent's part of a multi-agent episode: ``L`` steps from env step ``start``.

    Step ``j`` of the agent is env step ``start + j``; the agent acted at every env step
    from ``start`` to ``start + L - 1`` and at no other.

    Attributes:
        start: the env step of the agent's first action; its first observation came
            from the reset (``start == 0``) or from env step ``start - 1`` (it joined).
        obs: ``(L + 1, ...)`` leaves: the first observation, then what each action led to
            (the final one included).
        actions: ``(L, ...)`` leaves.
        rewards: ``(L,)`` float64.
        terminated: ``(L,)`` bool.
        truncated: ``(L,)`` bool.
        infos: the ``L`` step infos of the agent.
        reset_info: the agent's info with its first observation (``params`` included
            for agents present at the reset).
        policy_version: ``(L,)`` int64, -1 where unknown; ``None``: unknown throughout.
    """

    start: int
    obs: Any
    actions: Any
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: list[dict[str, Any]] = field(default_factory=list)
    reset_info: dict[str, Any] = field(default_factory=dict)
    policy_version: np.ndarray | None = None


@dataclass
class MultiAgentEpisode:
    """One recorded episode of a multi-agent (PettingZoo Parallel) env.

    Attributes:
        env_id: the registered env id.
        agents: ``{agent id: AgentEpisode}`` for every agent that took part (ids are
            ``str`` or ``int``), in the order they are recorded.
        length: ``T``, the env steps of the episode (every agent is done after them).
        seed, options, params, env_kwargs, snapshots, versions, origin, kernels: as in
            :class:`~simkit.recording.Episode` (``snapshots[t]`` is the env's
            ``get_state()`` before env step ``t``; ``origin["kind"]`` is
            ``"multi_agent"``).
    """

    env_id: str
    agents: dict[Any, AgentEpisode]
    length: int
    seed: int | None = None
    options: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    snapshots: dict[int, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    origin: dict[str, Any] = field(default_factory=dict)
    kernels: dict[str, Any] | None = None

    @property
    def total_return(self) -> float:
        """The sum over agents of each agent's return."""
        return float(sum(a.total_return for a in self.agents.values()))

    @property
    def returns(self) -> dict[Any, float]:
        """Each agent's return."""
        return {agent: a.total_return for agent, a in self.agents.items()}

    @property
    def terminated(self) -> bool:
        """Every agent's last step was terminal."""
        ends = [bool(a.terminated[-1]) for a in self.agents.values() if a.length]
        return bool(ends) and all(ends)

    @property
    def truncated(self) -> bool:
        """Some agent's last step was truncated."""
        return any(bool(a.truncated[-1]) for a in self.agents.values() if a.length)

    def acting(self, t: int) -> list[Any]:
        """The agents that act at env step ``t``."""
        return [k for k, a in self.agents.items() if a.start <= t < a.start + a.length]


def _agent_id(agent: Any) -> Any:
    if isinstance(agent, bool) or not isinstance(agent, str | int | np.integer):
        raise TypeError(f"agent ids must be str or int to be recorded, got {agent!r}")
    return agent if isinstance(agent, str) else int(agent)


def encode_multi_agent(ep: MultiAgentEpisode) -> tuple[dict[str, Any], bytes]:
    """``(meta, blob)`` of one multi-agent record (docs/recording.md)."""
    arrays: list[tuple[str, np.ndarray]] = []
    agents_meta: list[dict[str, Any]] = []
    agents_body: list[dict[str, Any]] = []
    versions: list[np.ndarray] = []
    for j, (agent, a) in enumerate(ep.agents.items()):
        what = f"agent {agent!r}: "
        aid = _agent_id(agent)
        if a.start < 0 or a.start + a.length > ep.length:
            raise ValueError(
                f"{what}steps {a.start}..{a.start + a.length} must lie in the episode's "
                f"T = {ep.length} env steps"
            )
        obs_tree, act_tree, agent_arrays, infos = encode_trajectory(
            a, f"agents/{j}/", what, a.length + 1
        )
        arrays.extend(agent_arrays)
        versions.append(dict(agent_arrays)[f"agents/{j}/policy_version"])
        agents_body.append(
            {"reset_info": plain_body(a.reset_info, f"{what}reset_info")} | {"infos": infos}
        )
        agents_meta.append(
            {
                "id": aid,
                "start": int(a.start),
                "length": a.length,
                "return": a.total_return,
                "terminated": bool(a.length and a.terminated[-1]),
                "truncated": bool(a.length and a.truncated[-1]),
                "obs_tree": obs_tree,
                "action_tree": act_tree,
            }
        )
    if len({m["id"] for m in agents_meta}) != len(agents_meta):
        raise ValueError(f"agent ids must be distinct, got {[m['id'] for m in agents_meta]}")
    body = plain_body(
        {
            "options": ep.options,
            "snapshots": [[int(k), v] for k, v in sorted(ep.snapshots.items())],
        },
        "episode",
    ) | {"agents": agents_body}
    descriptors, blob = pack_record(body, arrays)
    meta = {
        **record_origin_meta(ep),
        "length": int(ep.length),
        "return": ep.total_return,
        "terminated": ep.terminated,
        "truncated": ep.truncated,
        "policy_version": version_range(versions),
        "agents": agents_meta,
        "arrays": descriptors,
    }
    return meta, blob


def decode_multi_agent(
    meta: dict[str, Any], blob: bytes, path: str, offset: int
) -> MultiAgentEpisode:
    """Inverse of :func:`encode_multi_agent` (the blob already checked and decompressed)."""
    try:
        body, arrays = unpack_record(meta, blob)
        agents: dict[Any, AgentEpisode] = {}
        for j, (m, b) in enumerate(zip(meta["agents"], body["agents"], strict=True)):
            t = len(arrays[f"agents/{j}/rewards"])
            start = int(m["start"])
            if start < 0 or start + t > int(meta["length"]):
                raise ValueError(f"agent {j}'s steps {start}..{start + t} leave the episode")
            agents[m["id"]] = AgentEpisode(
                start=start,
                **decode_trajectory(
                    arrays, f"agents/{j}/", m["obs_tree"], m["action_tree"], length=t
                ),
                infos=checked_infos(b["infos"], t),
                reset_info=b["reset_info"],
            )
        return MultiAgentEpisode(
            env_id=str(meta["env_id"]),
            agents=agents,
            length=int(meta["length"]),
            **decode_origin(meta, body),
        )
    except DECODE_ERRORS as exc:
        raise undecodable(path, offset, exc) from exc
