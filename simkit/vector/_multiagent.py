"""``simkit.vector.MultiAgentVectorEnv``: N multi-agent envs flattened into agent rows."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space, create_empty_array, iterate
from pettingzoo import ParallelEnv

from simkit._multiagent import MultiAgentEnv
from simkit._seeding import EpisodeSeeds
from simkit._state import restore_all
from simkit._types import MultiAgentBatchStep, StepFault
from simkit._validation import ActionBounds, check_send_ids, validate_action
from simkit.errors import InvalidState, ResetNeeded
from simkit.registry import make
from simkit.vector._actions import split_rows
from simkit.vector._vector import (
    VECTOR_STATE_FORMAT,
    _per_env_params,
    _positive_int,
    gather_rows,
    plan_env_resets,
)

__all__ = [
    "MultiAgentVectorEnv",
    "MultiAgentBatchStep",
    "homogeneous_agent_spaces",
    "zero_row",
]


def homogeneous_agent_spaces(envs: Sequence[Any], who: str) -> tuple[Any, Any]:
    """The one observation and action space every agent of every env shares.

    Args:
        envs: parallel multi-agent envs; the first one's ``possible_agents`` is the rule.
        who: what needs it, opening the error message (``"MultiAgentVectorEnv needs"``).

    Raises:
        ValueError: an env has other ``possible_agents``, or an agent other spaces.
    """
    agents = list(envs[0].possible_agents)
    obs_space = envs[0].observation_space(agents[0])
    act_space = envs[0].action_space(agents[0])
    for i, env in enumerate(envs):
        if list(env.possible_agents) != agents:
            raise ValueError(
                f"every env must have possible_agents {agents}, "
                f"env {i} has {list(env.possible_agents)}"
            )
        for agent in agents:
            obs, act = env.observation_space(agent), env.action_space(agent)
            if obs != obs_space or act != act_space:
                raise ValueError(
                    f"{who} homogeneous agents: every agent must share observation space "
                    f"{obs_space} and action space {act_space}; env {i} agent {agent!r} "
                    f"has {obs} and {act}"
                )
    return obs_space, act_space


def zero_row(space: Any) -> Any:
    """The all-zeros observation of ``space`` (any space the codec carries), for absent agents."""
    return next(iter(iterate(batch_space(space, 1), create_empty_array(space, 1, np.zeros))))


class MultiAgentVectorEnv:
    """N :class:`simkit.MultiAgentEnv` instances as one array of (env, agent) rows.

    The row layout is fixed: ``num_envs * len(possible_agents)`` rows, row ``r`` for
    agent ``possible_agents[r % A]`` of env ``r // A``; ``agent_mask`` says which rows
    are live. This is the layout a batched policy wants: one observation array in,
    one action array out. Every agent must share one observation space and one action
    space. An env is reset in the same step as its last live agent finishes. Seeding
    follows :class:`simkit.vector.VectorEnv`: episode ``k`` of env ``i`` uses
    ``episode_seed(root, i, k)``. Envs step inline on the calling thread.

    Args:
        env_fns: a registered multi-agent env id or a sequence of functions returning
            :class:`simkit.MultiAgentEnv` instances.
        num_envs: N; required with an id.
        params: randomization overrides (one mapping or N) for envs built from an id.
        env_kwargs: other constructor arguments for envs built from an id.
        validate_actions: check each action batch once; envs are built without
            their own validation.
        isolate_faults: an env whose ``step`` raises ends its episode (its acting rows
            truncated, reward 0) and is reset while the others go on; reported by
            :meth:`step_envs` as :class:`~simkit._types.StepFault` (what a rollout
            server needs). Off by default: the exception propagates.
    """

    def __init__(
        self,
        env_fns: str | Sequence[Callable[[], ParallelEnv[Any, Any, Any]]],
        num_envs: int | None = None,
        *,
        params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        validate_actions: bool = True,
        isolate_faults: bool = False,
    ) -> None:
        self.isolate_faults = isolate_faults
        if isinstance(env_fns, str):
            if num_envs is None:
                raise TypeError("num_envs is required when building envs from an id")
            n = _positive_int(num_envs, "num_envs")
            per_env = _per_env_params(params, n)
            kwargs = {**dict(env_kwargs or {}), "validate_actions": not validate_actions}
            self.envs: list[ParallelEnv[Any, Any, Any]] = [
                make(env_fns, **kwargs, **({"params": p} if p is not None else {})) for p in per_env
            ]
        else:
            if params is not None or env_kwargs is not None:
                raise ValueError(
                    "params and env_kwargs apply to envs built from an id; with env_fns, "
                    "pass them inside the functions"
                )
            if num_envs is not None and num_envs != len(env_fns):
                raise ValueError(f"num_envs={num_envs} but {len(env_fns)} env_fns were given")
            self.envs = [fn() for fn in env_fns]
            if not self.envs:
                raise ValueError("env_fns must hold at least one function, got none")
        for i, env in enumerate(self.envs):
            if not isinstance(env, ParallelEnv):
                raise TypeError(
                    f"env {i} must be a pettingzoo.ParallelEnv (e.g. a simkit.MultiAgentEnv), "
                    f"got {type(env).__name__}"
                )
            if validate_actions and isinstance(env, MultiAgentEnv):
                env.validate_actions = False
        first = self.envs[0]
        self.num_envs = len(self.envs)
        self.possible_agents: list[Any] = list(first.possible_agents)
        self.num_agents = len(self.possible_agents)
        self.num_rows = self.num_envs * self.num_agents
        self.single_observation_space, self.single_action_space = homogeneous_agent_spaces(
            self.envs, "MultiAgentVectorEnv needs"
        )
        self.observation_space = batch_space(self.single_observation_space, self.num_rows)
        self.action_space = batch_space(self.single_action_space, self.num_rows)
        self.validate_actions = validate_actions
        bounds = getattr(first, "action_bounds", ActionBounds.CLIP)
        self._bounds = bounds if isinstance(bounds, ActionBounds) else ActionBounds.CLIP
        self._slot = {agent: k for k, agent in enumerate(self.possible_agents)}
        self.row_env = np.repeat(np.arange(self.num_envs, dtype=np.int64), self.num_agents)
        """``(rows,)`` the env of each row."""
        self.seeds = EpisodeSeeds(self.num_envs)
        self._has_reset = False
        self._obs_rows: list[Any] = [self._zero_row() for _ in range(self.num_rows)]
        self._mask = np.zeros(self.num_rows, dtype=np.bool_)
        self._broken = np.zeros(self.num_envs, dtype=np.bool_)

    @property
    def episode_index(self) -> np.ndarray:
        """Each env's current episode number (a copy; -1 before the first reset)."""
        return self.seeds.episode.copy()

    def _zero_row(self) -> Any:
        return zero_row(self.single_observation_space)

    def row(self, env_index: int, agent: Any) -> int:
        """The row of ``agent`` in env ``env_index``."""
        return env_index * self.num_agents + self._slot[agent]

    @property
    def agent_mask(self) -> np.ndarray:
        """``(rows,)`` bool: rows whose agent is live now (a copy)."""
        return self._mask.copy()

    # ----------------------------------------------------------------------- reset

    def _reset_one(
        self, i: int, seed: int | None, options: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        observations, infos = self.envs[i].reset(seed=seed, options=options)
        base = i * self.num_agents
        self._mask[base : base + self.num_agents] = False
        row_infos: list[dict[str, Any]] = [{} for _ in range(self.num_agents)]
        for agent in self.possible_agents:
            self._obs_rows[base + self._slot[agent]] = self._zero_row()
        for agent, obs in observations.items():
            k = self._slot[agent]
            self._obs_rows[base + k] = obs
            row_infos[k] = dict(infos.get(agent, {}))
        for agent in self.envs[i].agents:
            self._mask[base + self._slot[agent]] = True
        return row_infos

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, np.ndarray, list[dict[str, Any]]]:
        """Resets every env; seeds as :meth:`simkit.vector.VectorEnv.reset`.

        Returns:
            ``(obs, agent_mask, infos)`` over all rows.
        """
        n = self.num_envs
        seeds = self.seeds.plan(np.arange(n), seed)
        self._broken[:] = False
        infos: list[dict[str, Any]] = []
        for i in range(n):
            infos.extend(self._reset_one(i, seeds[i], options))
        self._has_reset = True
        return self._gather(self._obs_rows), self._mask.copy(), infos

    def _gather(self, rows: list[Any]) -> Any:
        return gather_rows(self.single_observation_space, rows)

    # ------------------------------------------------------------------------ step

    def step(self, actions: Any) -> MultiAgentBatchStep:
        """Steps every env with one action row per (env, agent) row.

        Rows of agents that are not live are ignored. An env whose agents have all
        finished is reset in the same step (``env_reset``; its rows' infos hold
        ``"reset_info"``).

        Raises:
            ResetNeeded: before :meth:`reset`.
            InvalidAction: a live row's action does not fit (names env, agent and row).
        """
        if not self._has_reset:
            raise ResetNeeded("step() called before reset(); call reset() first")
        step, _ = self.step_envs(np.arange(self.num_envs, dtype=np.int64), actions)
        return step

    def _global_rows(self, env_ids: np.ndarray) -> np.ndarray:
        A = self.num_agents
        return (env_ids[:, None] * A + np.arange(A)).reshape(-1)

    def step_envs(
        self, env_ids: Any, actions: Any, *, check_ids: bool = True
    ) -> tuple[MultiAgentBatchStep, list[StepFault]]:
        """Steps only ``env_ids`` (in that order): ``len(env_ids) * A`` action rows.

        The one multi-agent step loop: :meth:`step` and the rollout server's host both
        run it.

        Args:
            env_ids: ``(k,)`` distinct env indices.
            actions: ``(k * A, *action_shape)`` rows, agent rows of each env in order.
            check_ids: ``False`` skips the env-id check (ids checked already, e.g. by a
                protocol session): ``env_ids`` must be ``(k,)`` int64, distinct, in range.

        Returns:
            The step of those envs' rows and the faults (with ``isolate_faults``).

        Raises:
            ResetNeeded: an env was never reset.
            ValueError: a bad or repeated env id.
            InvalidAction: a live row's action does not fit.
        """
        ids = check_send_ids(env_ids, self.num_envs, None) if check_ids else env_ids
        never = ids[self.seeds.episode[ids] < 0]
        if never.size:
            raise ResetNeeded(f"envs {never.tolist()} were never reset; send reset first")
        A = self.num_agents
        n = ids.size * A
        rows = split_rows(self.single_action_space, actions, n)
        grows = self._global_rows(ids)
        acted = self._mask[grows].copy()
        if self.validate_actions:
            for local in np.flatnonzero(acted).tolist():
                row = int(grows[local])
                agent = self.possible_agents[row % A]
                rows[local] = validate_action(
                    self.single_action_space,
                    rows[local],
                    bounds=self._bounds,
                    name=f"action for env {row // A} agent {agent!r} (row {row})",
                )
        reward = np.zeros(n, dtype=np.float64)
        term = np.zeros(n, dtype=np.bool_)
        trunc = np.zeros(n, dtype=np.bool_)
        env_reset = np.zeros(ids.size, dtype=np.bool_)
        infos: list[dict[str, Any]] = [{} for _ in range(n)]
        final_rows = [self._obs_rows[r] for r in grows]
        faults: list[StepFault] = []
        for k, i in enumerate(ids.tolist()):
            env, local, base = self.envs[i], k * A, i * A
            if self._broken[i]:
                faults.append(StepFault(i, None, "broken"))
                continue
            ended = False
            try:
                acts = {agent: rows[local + self._slot[agent]] for agent in env.agents}
                observations, rewards, terms, truncs, step_infos = env.step(acts)
                for agent, obs in observations.items():
                    s = self._slot[agent]
                    final_rows[local + s] = self._obs_rows[base + s] = obs
                    reward[local + s] = rewards[agent]
                    term[local + s] = terms[agent]
                    trunc[local + s] = truncs[agent]
                    infos[local + s] = dict(step_infos.get(agent, {}))
                live = list(env.agents)
            except Exception as exc:
                if not self.isolate_faults:
                    raise
                faults.append(StepFault(i, exc, "step"))
                live, ended = [], True
                for s in np.flatnonzero(acted[local : local + A]).tolist():
                    reward[local + s], term[local + s], trunc[local + s] = 0.0, False, True
                    infos[local + s] = {}
            self._mask[base : base + A] = False
            for agent in live:
                self._mask[base + self._slot[agent]] = True
            for s in range(A):
                if not self._mask[base + s]:
                    self._obs_rows[base + s] = self._zero_row()
            if ended or not live:
                env_reset[k] = True
                try:
                    reset_infos = self._reset_one(i, self.seeds.next_one(i), None)
                except Exception as exc:
                    if not self.isolate_faults:
                        raise
                    faults.append(StepFault(i, exc, "reset"))
                    self._broken[i] = True
                    self._mask[base : base + A] = False
                    continue
                for s in range(A):
                    infos[local + s] = {**infos[local + s], "reset_info": reset_infos[s]}
        step = MultiAgentBatchStep(
            obs=self._gather([self._obs_rows[r] for r in grows]),
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

    def reset_envs(
        self,
        env_ids: Any,
        *,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        options: Mapping[str, Any] | None = None,
        params: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets only ``env_ids`` (in that order), as :meth:`VectorEnv.reset_envs`.

        Returns:
            The observation rows and per-row infos of those envs.
        """
        ids = check_send_ids(env_ids, self.num_envs, None)
        plan = plan_env_resets(
            self.seeds, ids, seed=seed, seeds=seeds, options=options, params=params
        )
        infos: list[dict[str, Any]] = []
        for i, env_seed, opts in plan:
            infos.extend(self._reset_one(i, env_seed, opts))
            self._broken[i] = False
        self._has_reset = bool((self.seeds.episode >= 0).all())
        return self._gather([self._obs_rows[r] for r in self._global_rows(ids)]), infos

    # ------------------------------------------------------------------- snapshots

    def get_state(self) -> dict[str, Any]:
        """A plain-data snapshot: per-env snapshots, seeds, counters and the row layout."""
        if not self._has_reset:
            raise ResetNeeded("get_state() called before reset(); call reset() first")
        return {
            "format": VECTOR_STATE_FORMAT,
            "num_envs": self.num_envs,
            **self.seeds.get_state(),
            "obs_rows": self._gather(self._obs_rows),
            "agent_mask": self._mask.copy(),
            "envs": [env.get_state() for env in self.envs],
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a snapshot from :meth:`get_state`; the continuation is bit-identical.

        Raises:
            InvalidState: malformed, or from a vector of another size.
        """
        fields = {
            "format",
            "num_envs",
            "root_seeds",
            "episode_index",
            "obs_rows",
            "agent_mask",
            "envs",
        }
        if not isinstance(state, Mapping) or fields - set(state):
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise InvalidState(
                f"state must be a dict from get_state() with {sorted(fields)}, got {got}"
            )
        if state["format"] != VECTOR_STATE_FORMAT or state["num_envs"] != self.num_envs:
            raise InvalidState(
                f"state must have format {VECTOR_STATE_FORMAT} and {self.num_envs} envs, got "
                f"format {state['format']!r} and {state['num_envs']!r} envs"
            )
        seeds = EpisodeSeeds.parse_state(state, self.num_envs)
        mask = np.asarray(state["agent_mask"], dtype=np.bool_).copy()
        obs = state["obs_rows"]
        obs_rows = [np.array(obs[r], copy=True) for r in range(self.num_rows)]
        restore_all(self.envs, state["envs"])
        self.seeds.set_state(seeds)
        self._mask, self._obs_rows = mask, obs_rows
        self._has_reset = True

    def get_env_states(self, env_ids: Any) -> list[dict[str, Any]]:
        """Per-env snapshots: ``{"env", "root_seed", "episode_index", "obs_rows",
        "agent_mask"}`` each (the rollout server's form).

        Raises:
            ResetNeeded: an env was never reset.
            TypeError: an env is not a simkit env.
        """
        A, out = self.num_agents, []
        for i in np.asarray(env_ids, dtype=np.int64).tolist():
            if self.seeds.episode[i] < 0:
                raise ResetNeeded(f"env {i}: get_state before reset; reset first")
            env = self.envs[i]
            if not isinstance(env, MultiAgentEnv):
                raise TypeError(f"env {i} has no get_state(); snapshots need simkit envs")
            out.append(
                {
                    "env": env.get_state(),
                    **self.seeds.env_state(i),
                    "obs_rows": self._gather(copy.deepcopy(self._obs_rows[i * A : (i + 1) * A])),
                    "agent_mask": self._mask[i * A : (i + 1) * A].copy(),
                }
            )
        return out

    def set_env_states(self, env_ids: Any, states: Sequence[Mapping[str, Any]]) -> None:
        """Restores :meth:`get_env_states` snapshots, all or nothing.

        Raises:
            InvalidState: a malformed snapshot, or one an env rejects (nothing changes).
        """
        need = {"env", "root_seed", "episode_index", "obs_rows", "agent_mask"}
        A = self.num_agents
        ids = np.asarray(env_ids, dtype=np.int64).tolist()
        parsed = []
        for state in states:
            if not isinstance(state, Mapping) or need - set(state):
                raise InvalidState(
                    f"a multi-agent host snapshot holds {sorted(need)}, got "
                    f"{sorted(state) if isinstance(state, Mapping) else type(state).__name__}"
                )
            mask = np.asarray(state["agent_mask"], dtype=np.bool_)
            if mask.shape != (A,):
                raise InvalidState(f"agent_mask must have shape ({A},), got {mask.shape}")
            seeds = EpisodeSeeds.parse_env_state(state)
            rows = list(iterate(batch_space(self.single_observation_space, A), state["obs_rows"]))
            parsed.append((seeds, mask, copy.deepcopy(rows)))
        restore_all([self.envs[i] for i in ids], [s["env"] for s in states])
        for i, (seeds, mask, rows) in zip(ids, parsed, strict=True):
            self.seeds.set_env_state(i, seeds)
            self._obs_rows[i * A : (i + 1) * A] = rows
            self._mask[i * A : (i + 1) * A] = mask
            self._broken[i] = False

    def close(self) -> None:
        """Closes every env."""
        for env in self.envs:
            env.close()
