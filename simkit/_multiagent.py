"""``simkit.MultiAgentEnv``: a PettingZoo ``ParallelEnv`` with the simkit contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, SupportsFloat, TypeAlias, TypeVar, Unpack

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from simkit._contract import ContractCore, ContractOptions, EnvKind
from simkit._validation import reward_of, validate_action
from simkit.errors import InvalidAction, InvalidState
from simkit.randomization import Params

__all__ = ["MultiAgentEnv", "ParallelStepResult", "check_agents"]

AgentID = TypeVar("AgentID")
ObsType = TypeVar("ObsType")
ActType = TypeVar("ActType")

ParallelStepResult: TypeAlias = tuple[
    dict[AgentID, ObsType],
    dict[AgentID, float],
    dict[AgentID, bool],
    dict[AgentID, bool],
    dict[AgentID, dict[str, Any]],
]
"""What PettingZoo's ``ParallelEnv.step`` returns: observations, rewards, terminations,
truncations and infos, each keyed by agent (``ParallelStepResult[AgentID, ObsType]``)."""


class MultiAgentEnv(
    ContractCore, ParallelEnv[AgentID, ObsType, ActType], Generic[AgentID, ObsType, ActType]
):
    """A deterministic, resettable, randomizable multi-agent env (PettingZoo Parallel API).

    Authors set ``possible_agents``, ``observation_spaces`` and ``action_spaces`` (dicts
    keyed by agent) in ``__init__`` and implement:

    - :meth:`reset_episode` ``(rng, params, options) -> (observations, infos)``; on
      entry ``self.agents`` is every possible agent, and the hook may narrow it.
    - :meth:`step_episode` ``(actions, rng) -> (observations, rewards, terminations,
      infos)`` keyed by the agents live at the start of the step (and any that join).

    The base class validates actions (every live agent, no others), adds time-limit
    truncations, and removes terminated or truncated agents from ``self.agents``.
    ``infos[agent]["params"]`` at reset holds the episode's sampled parameters.
    ``__init__`` takes :class:`simkit.Env`'s keyword options.
    """

    metadata: dict[str, Any] = {"render_modes": [], "name": "simkit_multi_agent"}
    env_kind: ClassVar[EnvKind] = EnvKind.MULTI_AGENT
    observation_spaces: dict[AgentID, spaces.Space[Any]]
    action_spaces: dict[AgentID, spaces.Space[Any]]

    def __init__(self, **options: Unpack[ContractOptions]) -> None:
        self.agents: list[AgentID] = []
        self._np_random = None
        self._np_random_seed = None
        self._init_contract(**options)

    @property
    def np_random(self) -> np.random.Generator:
        """The env's generator (created unseeded on first use, as in Gymnasium)."""
        return self._seed_generator(None)

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._np_random = value
        self._np_random_seed = -1  # as Gymnasium marks a generator set from outside

    @property
    def np_random_seed(self) -> int:
        """The seed of the env's generator; ``-1`` if it was set from outside."""
        self._seed_generator(None)
        assert self._np_random_seed is not None
        return self._np_random_seed

    def observation_space(self, agent: AgentID) -> spaces.Space[Any]:
        return self.observation_spaces[agent]

    def action_space(self, agent: AgentID) -> spaces.Space[Any]:
        return self.action_spaces[agent]

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[dict[AgentID, ObsType], dict[AgentID, dict[str, Any]]]:
        """Starts an episode; returns observations and infos for ``self.agents``."""
        raise NotImplementedError(f"{type(self).__name__} must implement reset_episode()")

    def step_episode(
        self, actions: dict[AgentID, ActType], rng: np.random.Generator
    ) -> tuple[
        Mapping[AgentID, ObsType],
        Mapping[AgentID, SupportsFloat],
        Mapping[AgentID, bool],
        Mapping[AgentID, dict[str, Any]],
    ]:
        """Advances one step; returns ``(observations, rewards, terminations, infos)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement step_episode()")

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[AgentID, ObsType], dict[AgentID, dict[str, Any]]]:
        """Starts a new episode; the same ``seed`` always gives the same episode."""
        rng, params, opts = self._begin_episode(seed, options)
        self.agents = list(self.possible_agents)
        observations, infos = self.reset_episode(rng, params, opts)
        infos = {agent: {**infos.get(agent, {}), "params": params} for agent in observations}
        return observations, infos

    def step(self, actions: dict[AgentID, ActType]) -> ParallelStepResult[AgentID, ObsType]:
        """Steps every live agent; raises ``InvalidAction`` naming missing/extra agents."""
        self._require_active("step()")
        if self.validate_actions:
            actions = self._validate_actions(actions)
        assert self._np_random is not None
        live = list(self.agents)
        observations, rewards, terminations, infos = self.step_episode(actions, self._np_random)
        _check_results(live, observations, rewards, terminations)
        truncate = self._count_step()
        rewards_out = {agent: reward_of(rewards[agent], agent) for agent in observations}
        terms_out = {agent: bool(terminations[agent]) for agent in observations}
        truncs_out = {agent: truncate for agent in observations}
        infos_out = {agent: infos.get(agent, {}) for agent in observations}
        self.agents = [a for a in observations if not (terms_out[a] or truncs_out[a])]
        if not self.agents:
            self._episode_active = False
        return dict(observations), rewards_out, terms_out, truncs_out, infos_out

    def _validate_actions(self, actions: Any) -> dict[AgentID, ActType]:
        if not isinstance(actions, Mapping):
            raise InvalidAction(
                f"actions must be a dict keyed by agent, got {type(actions).__name__}"
            )
        live = set(self.agents)
        missing = [a for a in self.agents if a not in actions]
        extra = [a for a in actions if a not in live]
        if missing or extra:
            raise InvalidAction(
                f"actions must cover exactly the live agents {list(self.agents)}; "
                f"missing {missing}, not live {extra}"
            )
        return {
            agent: validate_action(
                self.action_spaces[agent],
                actions[agent],
                bounds=self.action_bounds,
                name=f"action for {agent!r}",
            )
            for agent in self.agents
        }

    def _extra_state(self) -> dict[str, Any]:
        return {"agents": list(self.agents)}

    def _check_extra_state(self, state: Mapping[str, Any]) -> None:
        if "agents" not in state:
            raise InvalidState("state is missing field 'agents'; was it made by get_state()?")
        check_agents(self.possible_agents, state["agents"], "state['agents']")

    def _restore_extra_state(self, state: Mapping[str, Any]) -> None:
        self.agents = list(state["agents"])


def _check_results(
    live: list[Any],
    observations: Mapping[Any, Any],
    rewards: Mapping[Any, Any],
    terminations: Mapping[Any, Any],
) -> None:
    """Refuses ``step_episode`` results that leave out an agent live at the start of the
    step (it would vanish with no flag set) or an agent they observe (one may join).

    Raises:
        ValueError: naming the part and the agents it misses.
    """
    need = [*live, *(agent for agent in observations if agent not in live)]
    parts = {"observations": observations, "rewards": rewards, "terminations": terminations}
    for what, part in parts.items():
        missing = [agent for agent in need if agent not in part]
        if missing:
            raise ValueError(
                "step_episode must return an observation, a reward and a termination for "
                f"every agent live at the start of the step {live} and every agent it "
                f"observes; its {what} miss {missing}"
            )


def check_agents(possible_agents: Sequence[Any], agents: Any, where: str) -> list[Any]:
    """The live agents of a snapshot: a list of distinct agents of ``possible_agents``.

    Raises:
        InvalidState: not a list or tuple, an agent that is not a possible agent (a
            string is not taken as its letters), or an agent listed twice.
    """
    if not isinstance(agents, list | tuple):
        raise InvalidState(
            f"{where} must be a list of live agents drawn from {list(possible_agents)}, "
            f"got {type(agents).__name__}"
        )
    unknown = [a for a in agents if not _is_possible(a, possible_agents)]
    if unknown:
        raise InvalidState(
            f"{where} names {unknown!r:.200}, not agents of this env "
            f"(possible agents: {list(possible_agents)})"
        )
    repeated = [a for k, a in enumerate(agents) if a in agents[:k]]
    if repeated:
        raise InvalidState(f"{where} lists {repeated!r} more than once, got {list(agents)!r}")
    return list(agents)


def _is_possible(agent: Any, possible_agents: Sequence[Any]) -> bool:
    """``agent in possible_agents`` of the same type (``1 == True`` and ``1.0 == 1`` do
    not make a bool or a float an agent named by an int)."""
    return any(type(agent) is type(p) and agent == p for p in possible_agents)
