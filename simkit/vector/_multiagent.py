"""``simkit.vector.MultiAgentVectorEnv``: N multi-agent envs flattened into agent rows.

The multi-agent face of :class:`simkit.vector._core.VectorCore` (one row per possible
agent of each env): how a PettingZoo ``ParallelEnv``'s dicts map onto its rows, the
live-agent mask and the per-row action check. Stepping, autoreset, seeding, subset
steps and snapshots are the core's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space, iterate
from pettingzoo import ParallelEnv

from simkit._multiagent import MultiAgentEnv, check_agents
from simkit._state import check_observation, state_array
from simkit._types import MultiAgentBatchStep, RowStep, StepFault
from simkit._validation import ActionBounds, check_send_ids, validate_action
from simkit.errors import InvalidState, ResetNeeded
from simkit.vector._actions import split_rows
from simkit.vector._build import build_envs, gather_rows, homogeneous_agent_spaces, zero_row
from simkit.vector._core import VectorCore

__all__ = [
    "MultiAgentVectorEnv",
    "MultiAgentBatchStep",
    "homogeneous_agent_spaces",
    "zero_row",
]


class MultiAgentVectorEnv(VectorCore):
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

    _state_fields = frozenset({"obs_rows", "agent_mask"})
    _env_state_fields = frozenset({"obs_rows", "agent_mask"})
    _undoes_autoresets = True

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
        extra = {"validate_actions": not validate_actions}
        envs: list[ParallelEnv[Any, Any, Any]] = build_envs(
            env_fns, num_envs, params, env_kwargs, extra if isinstance(env_fns, str) else None
        )
        for i, env in enumerate(envs):
            if not isinstance(env, ParallelEnv):
                raise TypeError(
                    f"env {i} must be a pettingzoo.ParallelEnv (e.g. a simkit.MultiAgentEnv), "
                    f"got {type(env).__name__}"
                )
            if validate_actions and isinstance(env, MultiAgentEnv):
                env.validate_actions = False
        first = envs[0]
        self.possible_agents: list[Any] = list(first.possible_agents)
        self.num_agents = len(self.possible_agents)
        self.num_rows = len(envs) * self.num_agents
        self.single_observation_space, self.single_action_space = homogeneous_agent_spaces(
            envs, "MultiAgentVectorEnv needs"
        )
        self.observation_space = batch_space(self.single_observation_space, self.num_rows)
        self.action_space = batch_space(self.single_action_space, self.num_rows)
        self.validate_actions = validate_actions
        self._slot = {agent: k for k, agent in enumerate(self.possible_agents)}
        bounds = getattr(first, "action_bounds", ActionBounds.CLIP)
        self._init_core(
            envs, self.num_agents, bounds=bounds, num_threads=1, live=False, first_obs=self._zero
        )
        self.row_env = np.repeat(np.arange(self.num_envs, dtype=np.int64), self.num_agents)
        """``(rows,)`` the env of each row."""

    def _zero(self) -> Any:
        return zero_row(self.single_observation_space)

    def row(self, env_index: int, agent: Any) -> int:
        """The row of ``agent`` in env ``env_index``."""
        return env_index * self.num_agents + self._slot[agent]

    @property
    def agent_mask(self) -> np.ndarray:
        """``(rows,)`` bool: rows whose agent is live now (a copy)."""
        return self._mask.copy()

    # ----------------------------------------------------- one env, one row per agent

    def _write_rows(self, i: int, result: tuple[Any, ...]) -> bool:
        env, base = self.envs[i], i * self.num_agents
        self._end_rows(i, truncate=False)
        observations, rewards, terms, truncs, step_infos = result
        for agent, obs in observations.items():
            r = base + self._slot[agent]
            self._final_rows[r] = self._obs_rows[r] = obs
            self._reward[r] = rewards[agent]
            self._term[r] = terms[agent]
            self._trunc[r] = truncs[agent]
            self._info_rows[r] = dict(step_infos.get(agent, {}))
        live = list(env.agents)
        self._set_live(i, live)
        return not live

    def _drop_rows(self, i: int) -> None:
        self._set_live(i, [])

    def _set_live(self, i: int, live: list[Any]) -> None:
        """Env ``i``'s live agents are ``live``; the others' rows read zeros."""
        base = i * self.num_agents
        self._mask[base : base + self.num_agents] = False
        for agent in live:
            self._mask[base + self._slot[agent]] = True
        for r in range(base, base + self.num_agents):
            if not self._mask[r]:
                self._obs_rows[r] = self._zero()

    def _reset_rows(
        self, i: int, seed: int | None, options: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        observations, infos = self.envs[i].reset(seed=seed, options=options)
        base = i * self.num_agents
        self._mask[base : base + self.num_agents] = False
        row_infos: list[dict[str, Any]] = [{} for _ in range(self.num_agents)]
        for agent in self.possible_agents:
            self._obs_rows[base + self._slot[agent]] = self._zero()
        for agent, obs in observations.items():
            k = self._slot[agent]
            self._obs_rows[base + k] = obs
            row_infos[k] = dict(infos.get(agent, {}))
        for agent in self.envs[i].agents:
            self._mask[base + self._slot[agent]] = True
        return row_infos

    def _action_rows(self, actions: Any, ids: np.ndarray) -> list[Any]:
        a = self.num_agents
        rows = split_rows(self.single_action_space, actions, ids.size * a)
        grows = self._global_rows(ids)
        if self.validate_actions:
            for local in np.flatnonzero(self._mask[grows]).tolist():
                row = int(grows[local])
                agent = self.possible_agents[row % a]
                rows[local] = validate_action(
                    self.single_action_space,
                    rows[local],
                    bounds=self._bounds,
                    name=f"action for env {row // a} agent {agent!r} (row {row})",
                )
        slot = self._slot
        return [
            {agent: rows[k * a + slot[agent]] for agent in self.envs[i].agents}
            for k, i in enumerate(ids.tolist())
        ]

    # ---------------------------------------------------------------- reset and step

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, np.ndarray, list[dict[str, Any]]]:
        """Resets every env, or ``options["reset_mask"]``'s; seeds and options as
        :meth:`simkit.vector.VectorEnv.reset`.

        Returns:
            ``(obs, agent_mask, infos)`` over all rows; the rows of envs not reset keep
            their observation and mask, and have empty infos.
        """
        reset = np.zeros(self.num_envs, dtype=np.bool_)
        reset[self._reset_every(seed, options)] = True
        a = self.num_agents
        infos = [self._info_rows[r] if reset[r // a] else {} for r in range(self.num_rows)]
        return self._gather(self._obs_rows, np.arange(self.num_rows)), self._mask.copy(), infos

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

    def step_rows(self, actions: Any) -> RowStep:
        """:meth:`step` as a rollout reads it (:class:`~simkit._types.RowStep`: every
        row's arrays, the rows live next step as its mask, no infos)."""
        step = self.step(actions)
        return RowStep(
            obs=np.asarray(step.obs),
            mask=np.asarray(step.agent_mask, dtype=np.bool_),
            reward=np.asarray(step.reward, dtype=np.float64),
            terminated=np.asarray(step.terminated, dtype=np.bool_),
            truncated=np.asarray(step.truncated, dtype=np.bool_),
            final_obs=np.asarray(step.final_obs),
        )

    def reset_rows(self, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`reset` as a rollout reads it: ``(obs, mask)`` of every row."""
        obs, mask, _ = self.reset(seed=seed)
        return np.asarray(obs), np.asarray(mask, dtype=np.bool_)

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
        ids = (
            check_send_ids(env_ids, self.num_envs, None, allow_empty=False)
            if check_ids
            else env_ids
        )
        grows = self._global_rows(ids)
        acted = self._mask[grows].copy()
        self._env_reset[ids] = False
        self._step_ids(ids, actions, check_ids=False)
        step = MultiAgentBatchStep(
            obs=self._gather(self._obs_rows, grows),
            agent_mask=self._mask[grows].copy(),
            reward=self._reward[grows],
            terminated=self._term[grows],
            truncated=self._trunc[grows],
            final_obs=self._gather(self._final_rows, grows),
            acted=acted,
            env_reset=self._env_reset[ids].copy(),
            infos=self._row_infos(grows),
        )
        return step, list(self._faults)

    # ------------------------------------------------------------------- snapshots

    def _rows_state(self) -> dict[str, Any]:
        return {
            "obs_rows": self._gather(self._obs_rows, np.arange(self.num_rows)),
            "agent_mask": self._mask.copy(),
        }

    def _restore_rows(self, state: Mapping[str, Any]) -> Callable[[], None]:
        mask = state_array(state["agent_mask"], "state['agent_mask']", "b", self.num_rows)
        a = self.num_agents
        for i, env_state in enumerate(state["envs"]):
            where = f"state['agent_mask'][{i * a}:{(i + 1) * a}] (env {i})"
            self._check_live(mask[i * a : (i + 1) * a], env_state, where, f"state['envs'][{i}]")
        obs = state["obs_rows"]
        space = self.single_observation_space
        check_observation(space, obs, "state['obs_rows']", rows=self.num_rows)
        obs_rows = copy.deepcopy(list(iterate(batch_space(space, self.num_rows), obs)))

        def apply() -> None:
            self._mask, self._obs_rows = mask, obs_rows

        return apply

    def _check_live(self, mask: np.ndarray, env_state: Any, where: str, env_where: str) -> None:
        """One env's rows of ``agent_mask`` must be the live agents of its own snapshot.

        Checked with the rows, before any env is restored, so a refusal changes nothing:
        a row marked dead whose agent the env still steps would act unseen, and a row
        marked live whose agent the env does not step would be reported as acting.

        Raises:
            InvalidState: the env snapshot's ``agents`` are malformed or disagree.
        """
        if not isinstance(env_state, Mapping) or "agents" not in env_state:
            return  # not a snapshot of a multi-agent env: the env's set_state refuses it
        agents = check_agents(self.possible_agents, env_state["agents"], f"{env_where}['agents']")
        live = np.array([agent in agents for agent in self.possible_agents], dtype=np.bool_)
        if not np.array_equal(mask, live):
            raise InvalidState(
                f"{where} must mark the live agents of {env_where}['agents'] {agents!r} "
                f"({live.tolist()} for {self.possible_agents}), got {mask.tolist()}"
            )

    def _env_rows_state(self, i: int) -> dict[str, Any]:
        a = self.num_agents
        return {
            "obs_rows": gather_rows(
                self.single_observation_space, copy.deepcopy(self._obs_rows[i * a : (i + 1) * a])
            ),
            "agent_mask": self._mask[i * a : (i + 1) * a].copy(),
        }

    def _restore_env_rows(self, state: Mapping[str, Any]) -> Callable[[int], None]:
        a = self.num_agents
        mask = state_array(state["agent_mask"], "state['agent_mask']", "b", a)
        self._check_live(mask, state["env"], "state['agent_mask']", "state['env']")
        space = self.single_observation_space
        check_observation(space, state["obs_rows"], "state['obs_rows']", rows=a)
        rows = copy.deepcopy(list(iterate(batch_space(space, a), state["obs_rows"])))

        def apply(i: int) -> None:
            self._obs_rows[i * a : (i + 1) * a] = rows
            self._mask[i * a : (i + 1) * a] = mask

        return apply

    def close(self) -> None:
        """Closes every env."""
        self._close_core()
