"""Hosts: N envs behind the :class:`simkit.protocol.Host` interface, with same-step autoreset.

One host, :class:`VectorHost`, over the local execution core: a single-agent env is a
multi-agent env with one agent row, so :class:`EnvListHost` (single-agent simkit or
Gymnasium envs through :class:`simkit.vector.VectorEnv`) and :class:`ParallelEnvHost`
(PettingZoo parallel envs as (env, agent) rows through
:class:`simkit.vector.MultiAgentVectorEnv`) are thin adapters that only build the vector
and check their envs. Remote data equals local data bit for bit.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from simkit._contract import ContractCore
from simkit._multiagent import MultiAgentEnv
from simkit._seeding import EpisodeSeeds
from simkit._types import BatchStep, MultiAgentBatchStep, StepFault
from simkit.errors import UnknownEnv
from simkit.protocol import EnvFault, ResetRequest, Unsupported, error_code_of
from simkit.registry import GYM_PREFIX, EnvKind, EnvSpec, spec
from simkit.vector import VectorEnv
from simkit.vector._multiagent import MultiAgentVectorEnv, homogeneous_agent_spaces

__all__ = [
    "EnvListHost",
    "ParallelEnvHost",
    "VectorHost",
    "env_fault",
    "make_env_factory",
    "make_parallel_env_factory",
    "is_multi_agent_id",
    "batch_spec_of",
    "GYM_PREFIX",
    "PZ_PREFIX",
]

PZ_PREFIX = "pz:"

ParallelFactory = Callable[[], ParallelEnv[Any, Any, Any]]


def make_env_factory(env_id: str, **kwargs: Any) -> Callable[[], gym.Env[Any, Any]]:
    """A zero-argument constructor for ``env_id``.

    ``"gym:CartPole-v1"`` builds the installed Gymnasium env; any other id is looked
    up in the simkit registry (raising :class:`simkit.errors.UnknownEnv` now, not later).
    """
    env_spec = spec(env_id)  # raises for unknown ids before any client connects
    if env_spec.kind is not EnvKind.SINGLE:
        raise ValueError(
            f"the rollout server hosts single-agent envs; {env_id!r} is {env_spec.kind.value}"
        )
    return lambda: env_spec.make(**kwargs)


def is_multi_agent_id(env_id: str) -> bool:
    """Whether ``env_id`` names a multi-agent env (``pz:...`` or a multi-agent simkit id)."""
    if env_id.startswith(PZ_PREFIX):
        return True
    if env_id.startswith(GYM_PREFIX):
        return False
    try:
        return spec(env_id).kind is EnvKind.MULTI_AGENT
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
    env_spec = spec(env_id)
    if env_spec.kind is not EnvKind.MULTI_AGENT:
        raise ValueError(f"{env_id!r} is {env_spec.kind.value}, not a multi-agent env")
    return lambda: env_spec.make(**kwargs)


def batch_spec_of(env_id: str) -> EnvSpec | None:
    """The registry spec of ``env_id`` if it is a :class:`simkit.BatchEnv`, else None."""
    env_spec = spec(env_id)
    return env_spec if env_spec.kind is EnvKind.BATCH else None


StepT = TypeVar("StepT", BatchStep, MultiAgentBatchStep)


class VectorHost(Generic[StepT]):
    """The host interface over a local vector (``self.vector``), written once.

    A subclass builds ``self.vector`` (a :class:`simkit.vector.VectorEnv` or
    :class:`simkit.vector.MultiAgentVectorEnv` with ``isolate_faults=True``) and
    ``self.capabilities``; resets, steps, seeding, autoreset and snapshots are the
    vector's, so remote data equals local data by construction. What this adds is the
    protocol's view: the session's ``env_offset``, randomization overrides refused for
    envs that take none, snapshots refused without the ``state`` capability, and faults
    as :class:`simkit.protocol.EnvFault` with wire error codes. ``env_ids`` arrive
    checked by the protocol session (int64, distinct, in range), so steps skip the
    vector's own id check.
    """

    vector: Any
    capabilities: frozenset[str]

    def _serve(
        self, kind: Any, envs: Sequence[Any], simkit_envs: bool, randomized: bool, **kwargs: Any
    ) -> None:
        """Builds the host's core, a ``kind`` vector of ``envs`` (fault-isolated, more
        ``kwargs``): its envs, size and per-row spaces, and the capabilities (simkit envs:
        ``state`` and ``params``, plus ``randomization`` when they declare parameters;
        plain Gymnasium/PettingZoo envs: none)."""
        factories = [lambda e=e: e for e in envs]  # type: ignore[has-type]
        self.vector = vector = kind(factories, isolate_faults=True, **kwargs)
        self.envs = vector.envs
        self.num_envs: int = vector.num_envs
        self.observation_space: spaces.Space[Any] = vector.single_observation_space
        self.action_space: spaces.Space[Any] = vector.single_action_space
        caps: set[str] = set()
        if simkit_envs:
            caps.update({"state", "params"})
            if randomized:
                caps.add("randomization")
        self.capabilities = frozenset(caps)

    def reset(self, request: ResetRequest) -> tuple[Any, list[dict[str, Any]]]:
        """Resets ``request.env_ids`` with the vector's seeding
        (:class:`simkit._seeding.EpisodeSeeds`).

        ``env_offset``: seeds index env ``i`` as ``env_offset + i`` (a client joining
        several servers into one vector). ``seed`` (root), ``seeds`` (``seeds[k]`` for
        ``env_ids[k]`` exactly) or neither (each env's next episode).

        A refused request keeps the seeding as it was (``env_offset``, roots, episode
        counters): overrides are refused before any env moves, and if an env raises in
        its reset the bookkeeping is put back.

        Returns:
            The observation rows and per-row infos of ``env_ids``.
        """
        r = request
        if "params" not in self.capabilities and (r.params or "params" in (r.options or {})):
            raise Unsupported(
                "this env takes no randomization overrides", expected="no params", got="params"
            )
        seeding = self.vector.seeds
        kept = seeding.get_state()
        seeding.env_offset = r.env_offset
        try:
            return self.vector.reset_envs(
                r.env_ids,
                seed=r.seed,
                seeds=r.seeds,
                options=r.options,
                params=r.params,
                replace_autoreset=r.replace_autoreset,
            )
        except BaseException:
            # Overrides are checked before anything moves (the vector's plan); what is
            # left is an env raising in its reset. The offset and the counters go back,
            # so the same request again gets the same seeds.
            seeding.set_state(EpisodeSeeds.parse_state(kept, self.num_envs))
            raise

    def step(self, env_ids: np.ndarray, actions: Any) -> tuple[StepT, list[EnvFault]]:
        """Steps ``env_ids``; an env that raises ends its episode (truncated) and resets.

        Raises:
            ResetNeeded: an env was never reset.
            InvalidAction: the batch does not fit the action space (nothing moved).
        """
        # The session checked the ids already (simkit._validation.checked_env_ids).
        step, faults = self.vector.step_envs(env_ids, actions, check_ids=False)
        return step, [env_fault(f) for f in faults]

    def get_state(self, env_ids: np.ndarray) -> list[dict[str, Any]]:
        """Snapshots of ``env_ids``: the env's own plus its seeding bookkeeping and rows."""
        self._require_state()
        return self.vector.get_env_states(env_ids)

    def set_state(self, env_ids: np.ndarray, states: list[dict[str, Any]]) -> None:
        """Restores snapshots from :meth:`get_state`, all or nothing."""
        self._require_state()
        self.vector.set_env_states(env_ids, states)

    def _require_state(self) -> None:
        if "state" not in self.capabilities:
            raise Unsupported("this env has no snapshots", expected="state capability", got="none")

    def close(self) -> None:
        """Stops the vector's worker threads and closes every env."""
        self.vector.close()


class EnvListHost(VectorHost[BatchStep]):
    """N single-agent envs behind the host interface: a thin adapter over
    :class:`simkit.vector.VectorEnv` (what it adds: :class:`VectorHost`).

    Args:
        envs: the env instances (all with equal spaces).
        num_threads: worker threads (1 = inline, no threads); at most ``len(envs)``.
    """

    def __init__(self, envs: Sequence[gym.Env[Any, Any]], *, num_threads: int = 1) -> None:
        if not envs:
            raise ValueError("a host needs at least one env, got none")
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
        first = envs[0]
        for env in envs[1:]:
            if (
                env.observation_space != first.observation_space
                or env.action_space != first.action_space
            ):
                raise ValueError("every env of a host must have the same spaces")
        is_simkit = all(isinstance(e.unwrapped, ContractCore) for e in envs)
        # simkit envs: one batch check here instead of one per env in env.step.
        check = is_simkit and all(getattr(e.unwrapped, "validate_actions", False) for e in envs)
        randomized = bool(getattr(first.unwrapped, "randomization", None))
        self._serve(
            VectorEnv, envs, is_simkit, randomized, num_threads=num_threads, validate_actions=check
        )
        self.num_threads = min(num_threads, self.num_envs)


class ParallelEnvHost(VectorHost[MultiAgentBatchStep]):
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
        simkit_envs = all(isinstance(e, MultiAgentEnv) for e in envs)
        randomized = bool(getattr(first, "randomization", None))
        self._serve(MultiAgentVectorEnv, envs, simkit_envs, randomized, validate_actions=False)
        self.possible_agents: list[str] = agents
        self.num_agents: int = self.vector.num_agents

    def agent_mask(self, env_ids: np.ndarray) -> np.ndarray:
        """Live rows of ``env_ids`` (a copy), in ``env_ids`` order."""
        rows = self.vector._global_rows(np.asarray(env_ids, dtype=np.int64))
        return self.vector.agent_mask[rows]


def env_fault(fault: StepFault) -> EnvFault:
    """The wire form of a vector's fault (error code and message)."""
    if fault.error is None:
        i = fault.env_id
        return EnvFault(i, "reset_needed", f"env {i} failed to reset; reset it")
    message = f"{type(fault.error).__name__}: {fault.error}"
    if fault.during == "reset":
        message = f"reset failed: {message}"
    return EnvFault(fault.env_id, error_code_of(fault.error), message)
