"""Multi-agent hosting: N PettingZoo parallel envs as (env, agent) rows.

:class:`ParallelEnvHost` serves :class:`simkit.MultiAgentEnv` ids and plain PettingZoo
``ParallelEnv`` factories (``pz:<module>[:<factory>]``) with the semantics of
:class:`simkit.vector.MultiAgentVectorEnv`: fixed row layout, agent mask, an env reset
in the same step as its last live agent finishes, and the vector's seeding, so remote
data equals local data bit for bit.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, iterate
from pettingzoo import ParallelEnv

import simkit
from simkit._multiagent import MultiAgentEnv
from simkit._seeding import episode_seed
from simkit.errors import InvalidState, ResetNeeded, UnknownEnv
from simkit.protocol import EnvFault, Unsupported, error_code_of
from simkit.registry import EnvKind
from simkit.servers._host import GYM_PREFIX, plan_reset_seed, require_params_capability
from simkit.vector import MultiAgentBatchStep
from simkit.vector._actions import split_rows
from simkit.vector._multiagent import gather_rows, homogeneous_agent_spaces, zero_row

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


class ParallelEnvHost:
    """N PettingZoo parallel envs as ``N * len(possible_agents)`` rows, fault-isolated.

    Every env must have the same ``possible_agents`` (strings) and every agent the same
    observation and action space. simkit envs have the ``state`` and ``params``
    capabilities (``randomization`` when they declare parameters); plain PettingZoo
    envs have none.

    Args:
        envs: the env instances.

    Raises:
        ValueError: no envs, differing agents, non-str agent ids or heterogeneous spaces.
        TypeError: an env is not a PettingZoo ``ParallelEnv``.
    """

    env_kind = "multi_agent"

    def __init__(self, envs: Sequence[ParallelEnv[Any, Any, Any]]) -> None:
        if not envs:
            raise ValueError("a host needs at least one env, got none")
        self.envs = list(envs)
        for i, env in enumerate(self.envs):
            if not isinstance(env, ParallelEnv):
                raise TypeError(
                    f"env {i} must be a pettingzoo.ParallelEnv, got {type(env).__name__}"
                )
        first = self.envs[0]
        self.possible_agents: list[str] = list(first.possible_agents)
        bad = [a for a in self.possible_agents if not isinstance(a, str)]
        if not self.possible_agents or bad:
            raise ValueError(
                "served multi-agent envs need a non-empty list of str agent ids, "
                f"got possible_agents {self.possible_agents!r}"
            )
        self.num_envs = len(self.envs)
        self.num_agents = len(self.possible_agents)
        spaces_ = homogeneous_agent_spaces(self.envs, "served multi-agent envs need")
        self.observation_space: spaces.Space[Any] = spaces_[0]
        self.action_space: spaces.Space[Any] = spaces_[1]
        self._simkit = all(isinstance(e, MultiAgentEnv) for e in self.envs)
        caps: set[str] = set()
        if self._simkit:
            caps.update({"state", "params"})
            if getattr(first, "randomization", None):
                caps.add("randomization")
        self.capabilities = frozenset(caps)
        self._slot = {agent: k for k, agent in enumerate(self.possible_agents)}
        self._roots: list[int | None] = [None] * self.num_envs
        self._episode = np.full(self.num_envs, -1, dtype=np.int64)
        self._rows: list[Any] = [self._zero_row() for _ in range(self.num_envs * self.num_agents)]
        self._mask = np.zeros(self.num_envs * self.num_agents, dtype=np.bool_)
        self._broken = np.zeros(self.num_envs, dtype=np.bool_)
        self._env_offset = 0

    def _zero_row(self) -> Any:
        return zero_row(self.observation_space)

    def _gather(self, rows: list[Any]) -> Any:
        return gather_rows(self.observation_space, rows)

    def _global_rows(self, env_ids: np.ndarray) -> np.ndarray:
        A = self.num_agents
        return (env_ids[:, None] * A + np.arange(A)).reshape(-1)

    def agent_mask(self, env_ids: np.ndarray) -> np.ndarray:
        """Live rows of ``env_ids`` (a copy), in ``env_ids`` order."""
        return self._mask[self._global_rows(np.asarray(env_ids, dtype=np.int64))]

    # ----------------------------------------------------------------------- reset

    def _reset_one(
        self,
        i: int,
        params: Mapping[str, Any] | None,
        options: Mapping[str, Any] | None,
        seed: int | None = None,
    ) -> list[dict[str, Any]]:
        """Starts env ``i``'s next episode (with ``seed`` exactly, else from its root)."""
        self._episode[i] += 1
        root = self._roots[i]
        if seed is None and root is not None:
            seed = episode_seed(root, self._env_offset + i, int(self._episode[i]))
        opts = dict(options) if options is not None else None
        if params:
            opts = dict(opts or {})
            opts["params"] = {**dict(opts.get("params") or {}), **params}
        env = self.envs[i]
        observations, infos = env.reset(seed=seed, options=opts)
        A = self.num_agents
        base = i * A
        self._mask[base : base + A] = False
        row_infos: list[dict[str, Any]] = [{} for _ in range(A)]
        for k in range(A):
            self._rows[base + k] = self._zero_row()
        for agent, obs in observations.items():
            k = self._slot[agent]
            self._rows[base + k] = obs
            row_infos[k] = dict(infos.get(agent, {}))
        for agent in env.agents:
            self._mask[base + self._slot[agent]] = True
        self._broken[i] = False
        return row_infos

    def reset(
        self,
        env_ids: np.ndarray,
        *,
        seed: int | None,
        seeds: list[int] | None,
        options: dict[str, Any] | None,
        params: list[dict[str, Any]] | None,
        env_offset: int = 0,
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets ``env_ids`` with the seeding of :class:`simkit.vector.MultiAgentVectorEnv`.

        ``seed`` (root): env ``i`` restarts at episode 0 with ``episode_seed(seed,
        env_offset + i, 0)``; ``seeds``: env ``env_ids[k]`` is reset with ``seeds[k]``
        exactly and later episodes continue its own generator; neither: each env starts
        its next episode (a random root on a first reset).

        Returns:
            The observation rows and per-row infos of ``env_ids``.
        """
        require_params_capability(self.capabilities, options, params)
        self._env_offset = env_offset
        infos: list[dict[str, Any]] = []
        for k, i in enumerate(env_ids.tolist()):
            explicit = plan_reset_seed(self._roots, self._episode, i, k, seed, seeds)
            infos.extend(self._reset_one(i, params[k] if params else None, options, explicit))
        rows = self._global_rows(env_ids)
        return self._gather([self._rows[r] for r in rows]), infos

    # ------------------------------------------------------------------------ step

    def step(self, env_ids: np.ndarray, actions: Any) -> tuple[MultiAgentBatchStep, list[EnvFault]]:
        """Steps ``env_ids`` with action rows; rows of agents that are not live are ignored.

        An env that raises ends its episode: its acting rows are truncated with reward
        0 and their previous observation as final observation, and it is reset.
        """
        never = [i for i in env_ids.tolist() if self._episode[i] < 0]
        if never:
            raise ResetNeeded(f"envs {never} were never reset; send reset first")
        A = self.num_agents
        n = env_ids.size * A
        rows = split_rows(self.action_space, actions, n)
        grows = self._global_rows(env_ids)
        acted = self._mask[grows].copy()
        reward = np.zeros(n, dtype=np.float64)
        term = np.zeros(n, dtype=np.bool_)
        trunc = np.zeros(n, dtype=np.bool_)
        env_reset = np.zeros(env_ids.size, dtype=np.bool_)
        infos: list[dict[str, Any]] = [{} for _ in range(n)]
        final_rows = [self._rows[r] for r in grows]
        faults: list[EnvFault] = []
        for k, i in enumerate(env_ids.tolist()):
            env, local, base = self.envs[i], k * A, i * A
            if self._broken[i]:
                faults.append(EnvFault(i, "reset_needed", f"env {i} failed to reset; reset it"))
                continue
            ended = False
            try:
                acts = {agent: rows[local + self._slot[agent]] for agent in env.agents}
                observations, rewards, terms, truncs, step_infos = env.step(acts)
                for agent, obs in observations.items():
                    s = self._slot[agent]
                    final_rows[local + s] = self._rows[base + s] = obs
                    reward[local + s] = rewards[agent]
                    term[local + s] = terms[agent]
                    trunc[local + s] = truncs[agent]
                    infos[local + s] = dict(step_infos.get(agent, {}))
                live = list(env.agents)
            except Exception as exc:  # fault isolation: this env's episode ends, others go on
                faults.append(EnvFault(i, error_code_of(exc), f"{type(exc).__name__}: {exc}"))
                live, ended = [], True
                for s in np.flatnonzero(acted[local : local + A]).tolist():
                    reward[local + s], term[local + s], trunc[local + s] = 0.0, False, True
                    infos[local + s] = {}
            self._mask[base : base + A] = False
            for agent in live:
                self._mask[base + self._slot[agent]] = True
            for s in range(A):
                if not self._mask[base + s]:
                    self._rows[base + s] = self._zero_row()
            if ended or not live:
                env_reset[k] = True
                try:
                    reset_infos = self._reset_one(i, None, None)
                except Exception as exc:
                    faults.append(
                        EnvFault(
                            i, error_code_of(exc), f"reset failed: {type(exc).__name__}: {exc}"
                        )
                    )
                    self._broken[i] = True
                    self._mask[base : base + A] = False
                    continue
                for s in range(A):
                    infos[local + s] = {**infos[local + s], "reset_info": reset_infos[s]}
        step = MultiAgentBatchStep(
            obs=self._gather([self._rows[r] for r in grows]),
            agent_mask=self._mask[grows].copy(),
            reward=reward,
            terminated=term,
            truncated=trunc,
            final_obs=self._gather(final_rows),
            acted=acted,
            env_reset=env_reset,
            infos=infos,
        )
        return step, faults

    # ------------------------------------------------------------------- snapshots

    def _require_state(self) -> None:
        if "state" not in self.capabilities:
            raise Unsupported("this env has no snapshots", expected="state capability", got="none")

    def get_state(self, env_ids: np.ndarray) -> list[dict[str, Any]]:
        """Snapshots of ``env_ids``: the env's own, its rows and the seeding bookkeeping."""
        self._require_state()
        A, out = self.num_agents, []
        for i in env_ids.tolist():
            if self._episode[i] < 0:
                raise ResetNeeded(f"env {i}: get_state before reset; reset first")
            env = self.envs[i]
            assert isinstance(env, MultiAgentEnv)
            out.append(
                {
                    "env": env.get_state(),
                    "root_seed": self._roots[i],
                    "episode_index": int(self._episode[i]),
                    "obs_rows": self._gather(copy.deepcopy(self._rows[i * A : (i + 1) * A])),
                    "agent_mask": self._mask[i * A : (i + 1) * A].copy(),
                }
            )
        return out

    def set_state(self, env_ids: np.ndarray, states: list[dict[str, Any]]) -> None:
        """Restores snapshots from :meth:`get_state`."""
        self._require_state()
        need = {"env", "root_seed", "episode_index", "obs_rows", "agent_mask"}
        A = self.num_agents
        for i, state in zip(env_ids.tolist(), states, strict=True):
            if not isinstance(state, Mapping) or need - set(state):
                raise InvalidState(
                    f"a multi-agent host snapshot holds {sorted(need)}, got "
                    f"{sorted(state) if isinstance(state, Mapping) else type(state).__name__}"
                )
            mask = np.asarray(state["agent_mask"], dtype=np.bool_)
            if mask.shape != (A,):
                raise InvalidState(f"agent_mask must have shape ({A},), got {mask.shape}")
            env = self.envs[i]
            assert isinstance(env, MultiAgentEnv)
            env.set_state(state["env"])
            self._roots[i] = state["root_seed"]
            self._episode[i] = int(state["episode_index"])
            rows = list(iterate(batch_space(self.observation_space, A), state["obs_rows"]))
            self._rows[i * A : (i + 1) * A] = copy.deepcopy(rows)
            self._mask[i * A : (i + 1) * A] = mask
            self._broken[i] = False

    def close(self) -> None:
        """Closes every env."""
        for env in self.envs:
            env.close()
