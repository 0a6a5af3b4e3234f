"""Multi-agent hosting: N PettingZoo parallel envs as (env, agent) rows.

:class:`ParallelEnvHost` serves :class:`simkit.MultiAgentEnv` ids and plain PettingZoo
``ParallelEnv`` factories (``pz:<module>[:<factory>]``) with the semantics of
:class:`simkit.vector.MultiAgentVectorEnv`: fixed row layout, agent mask, an env reset
in the same step as its last live agent finishes, and the vector's seeding, so remote
data equals local data bit for bit.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

import simkit
from simkit._multiagent import MultiAgentEnv
from simkit.errors import UnknownEnv
from simkit.registry import EnvKind
from simkit.servers._host import GYM_PREFIX, VectorHost
from simkit.vector._multiagent import MultiAgentVectorEnv, homogeneous_agent_spaces

__all__ = [
    "PZ_PREFIX",
    "ParallelEnvHost",
    "is_multi_agent_id",
    "make_parallel_env_factory",
]

PZ_PREFIX = "pz:"

ParallelFactory = Callable[[], ParallelEnv[Any, Any, Any]]


def is_multi_agent_id(env_id: str) -> bool:
    """Whether ``env_id`` names a multi-agent env (``pz:...`` or a multi-agent simkit id)."""
    if env_id.startswith(PZ_PREFIX):
        return True
    if env_id.startswith(GYM_PREFIX):
        return False
    try:
        return simkit.spec(env_id).kind is EnvKind.MULTI_AGENT
    except UnknownEnv:
        return False  # the single-agent factory reports the unknown id


def make_parallel_env_factory(env_id: str, **kwargs: Any) -> ParallelFactory:
    """A zero-argument constructor of the multi-agent env ``env_id``.

    ``"pz:<module>:<factory>"`` imports ``<module>`` and calls ``<factory>(**kwargs)``;
    ``"pz:<module>"`` calls the module's ``parallel_env`` (PettingZoo's convention, e.g.
    ``pz:pettingzoo.butterfly.pistonball_v6``). Any other id is a registered
    :class:`simkit.MultiAgentEnv`.

    Raises:
        ValueError: a malformed ``pz:`` spec, a missing factory or a single-agent id.
        ModuleNotFoundError: the module is not installed.
        simkit.errors.UnknownEnv: the simkit id is not registered.
    """
    if env_id.startswith(PZ_PREFIX):
        module_name, _, attr = env_id[len(PZ_PREFIX) :].partition(":")
        if not module_name:
            raise ValueError(f"expected 'pz:<module>[:<factory>]', got {env_id!r}")
        module = importlib.import_module(module_name)
        factory = getattr(module, attr or "parallel_env", None)
        if not callable(factory):
            raise ValueError(
                f"{env_id!r}: module {module_name!r} has no callable "
                f"{attr or 'parallel_env'!r} returning a PettingZoo ParallelEnv"
            )
        return lambda: factory(**kwargs)
    env_spec = simkit.spec(env_id)
    if env_spec.kind is not EnvKind.MULTI_AGENT:
        raise ValueError(f"{env_id!r} is {env_spec.kind.value}, not a multi-agent env")
    return lambda: env_spec.make(**kwargs)


class ParallelEnvHost(VectorHost):
    """N PettingZoo parallel envs as ``N * len(possible_agents)`` rows, fault-isolated.

    A thin adapter over :class:`simkit.vector.MultiAgentVectorEnv` (with
    ``isolate_faults``), the same step loop a local learner runs. Every env must have
    the same ``possible_agents`` (strings) and every agent the same observation and
    action space. simkit envs have the ``state`` and ``params`` capabilities
    (``randomization`` when they declare parameters); plain PettingZoo envs have none.

    Args:
        envs: the env instances.

    Raises:
        ValueError: no envs, differing agents, non-str agent ids or heterogeneous spaces.
        TypeError: an env is not a PettingZoo ``ParallelEnv``.
    """

    def __init__(self, envs: Sequence[ParallelEnv[Any, Any, Any]]) -> None:
        if not envs:
            raise ValueError("a host needs at least one env, got none")
        for i, env in enumerate(envs):
            if not isinstance(env, ParallelEnv):
                raise TypeError(
                    f"env {i} must be a pettingzoo.ParallelEnv, got {type(env).__name__}"
                )
        first = envs[0]
        agents = list(first.possible_agents)
        bad = [a for a in agents if not isinstance(a, str)]
        if not agents or bad:
            raise ValueError(
                "served multi-agent envs need a non-empty list of str agent ids, "
                f"got possible_agents {agents!r}"
            )
        homogeneous_agent_spaces(envs, "served multi-agent envs need")
        self.vector = MultiAgentVectorEnv(
            [lambda e=e: e for e in envs],  # type: ignore[misc]
            validate_actions=False,
            isolate_faults=True,
        )
        self.envs = self.vector.envs
        self.possible_agents: list[str] = agents
        self.num_envs = self.vector.num_envs
        self.num_agents = self.vector.num_agents
        self.observation_space: spaces.Space[Any] = self.vector.single_observation_space
        self.action_space: spaces.Space[Any] = self.vector.single_action_space
        caps: set[str] = set()
        if all(isinstance(e, MultiAgentEnv) for e in envs):
            caps.update({"state", "params"})
            if getattr(first, "randomization", None):
                caps.add("randomization")
        self.capabilities = frozenset(caps)

    def agent_mask(self, env_ids: np.ndarray) -> np.ndarray:
        """Live rows of ``env_ids`` (a copy), in ``env_ids`` order."""
        rows = self.vector._global_rows(np.asarray(env_ids, dtype=np.int64))
        return self.vector.agent_mask[rows]
