"""``simkit.vector.MultiAgentVectorEnv``: N multi-agent envs flattened into agent rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from simkit._multiagent import MultiAgentEnv
from simkit._seeding import MAX_ROOT_SEED, episode_seed
from simkit._state import restore_all
from simkit._types import MultiAgentBatchStep
from simkit._validation import ActionBounds, validate_action
from simkit.errors import InvalidState, ResetNeeded
from simkit.registry import make
from simkit.vector._actions import split_rows
from simkit.vector._vector import VECTOR_STATE_FORMAT, _per_env_params, _positive_int

__all__ = [
    "MultiAgentVectorEnv",
    "MultiAgentBatchStep",
    "homogeneous_agent_spaces",
    "zero_row",
    "gather_rows",
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


def gather_rows(space: Any, rows: list[Any]) -> Any:
    """Observations ``rows`` of ``space`` stacked into one batch of ``batch_space(space, n)``."""
    out: Any = create_empty_array(space, len(rows), np.zeros)
    return concatenate(space, rows, out)


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
    """

    def __init__(
        self,
        env_fns: str | Sequence[Callable[[], MultiAgentEnv[Any, Any, Any]]],
        num_envs: int | None = None,
        *,
        params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        validate_actions: bool = True,
    ) -> None:
        if isinstance(env_fns, str):
            if num_envs is None:
                raise TypeError("num_envs is required when building envs from an id")
            n = _positive_int(num_envs, "num_envs")
            per_env = _per_env_params(params, n)
            kwargs = {**dict(env_kwargs or {}), "validate_actions": not validate_actions}
            self.envs: list[MultiAgentEnv[Any, Any, Any]] = [
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
            if not isinstance(env, MultiAgentEnv):
                raise TypeError(f"env {i} must be a simkit.MultiAgentEnv, got {type(env).__name__}")
            if validate_actions:
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
        bounds = first.action_bounds
        self._bounds = bounds if isinstance(bounds, ActionBounds) else ActionBounds.CLIP
        self._slot = {agent: k for k, agent in enumerate(self.possible_agents)}
        self.row_env = np.repeat(np.arange(self.num_envs, dtype=np.int64), self.num_agents)
        """``(rows,)`` the env of each row."""
        self._roots: list[int | None] = [None] * self.num_envs
        self._episode = np.full(self.num_envs, -1, dtype=np.int64)
        self._has_reset = False
        self._obs_rows: list[Any] = [self._zero_row() for _ in range(self.num_rows)]
        self._mask = np.zeros(self.num_rows, dtype=np.bool_)

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
        seeds: list[int | None]
        if seed is None and not self._has_reset:
            seed = int(np.random.SeedSequence().entropy) % (MAX_ROOT_SEED + 1)  # type: ignore[arg-type]
        if seed is None:
            seeds = [self._next_seed(i) for i in range(n)]
        elif isinstance(seed, int | np.integer) and not isinstance(seed, bool):
            if not 0 <= seed <= MAX_ROOT_SEED:
                raise ValueError(f"seed must be in [0, 2**63), got {seed}")
            self._roots = [int(seed)] * n
            self._episode[:] = 0
            seeds = [episode_seed(int(seed), i, 0) for i in range(n)]
        elif isinstance(seed, Sequence) and len(seed) == n:
            seeds = []
            for i, s in enumerate(seed):
                if s is None:
                    seeds.append(self._next_seed(i))
                else:
                    self._roots[i] = None
                    self._episode[i] = 0
                    seeds.append(int(s))
        else:
            raise ValueError(
                f"seed must be an int, a list of {n} int | None, or None, got {seed!r}"
            )
        infos: list[dict[str, Any]] = []
        for i in range(n):
            infos.extend(self._reset_one(i, seeds[i], options))
        self._has_reset = True
        return self._gather(self._obs_rows), self._mask.copy(), infos

    def _next_seed(self, i: int) -> int | None:
        self._episode[i] += 1
        root = self._roots[i]
        return None if root is None else episode_seed(root, i, int(self._episode[i]))

    def _gather(self, rows: list[Any]) -> Any:
        return gather_rows(self.single_observation_space, rows)

    # ------------------------------------------------------------------------ step

    def step(self, actions: Any) -> MultiAgentBatchStep:
        """Steps every env with the live rows of ``actions`` (other rows are ignored).

        Args:
            actions: ``(rows, *action_shape)``, one row per (env, agent).

        Raises:
            ResetNeeded: called before :meth:`reset`.
            InvalidAction: a live row's action does not fit (names env and agent).
        """
        if not self._has_reset:
            raise ResetNeeded("step() called before reset(); call reset() first")
        rows = split_rows(self.single_action_space, actions, self.num_rows)
        acted = self._mask.copy()
        if self.validate_actions:
            for row in np.flatnonzero(acted):
                agent = self.possible_agents[row % self.num_agents]
                rows[row] = validate_action(
                    self.single_action_space,
                    rows[row],
                    bounds=self._bounds,
                    name=f"action for env {row // self.num_agents} agent {agent!r} (row {row})",
                )
        A = self.num_agents
        reward = np.zeros(self.num_rows, dtype=np.float64)
        term = np.zeros(self.num_rows, dtype=np.bool_)
        trunc = np.zeros(self.num_rows, dtype=np.bool_)
        env_reset = np.zeros(self.num_envs, dtype=np.bool_)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_rows)]
        final_rows = list(self._obs_rows)
        for i, env in enumerate(self.envs):
            base = i * A
            acts = {agent: rows[base + self._slot[agent]] for agent in env.agents}
            observations, rewards, terms, truncs, step_infos = env.step(acts)
            for agent, obs in observations.items():
                r = base + self._slot[agent]
                final_rows[r] = self._obs_rows[r] = obs
                reward[r] = rewards[agent]
                term[r] = terms[agent]
                trunc[r] = truncs[agent]
                infos[r] = dict(step_infos.get(agent, {}))
            self._mask[base : base + A] = False
            for agent in env.agents:
                self._mask[base + self._slot[agent]] = True
            for k in range(A):
                if not self._mask[base + k]:
                    self._obs_rows[base + k] = self._zero_row()
            if not env.agents:
                env_reset[i] = True
                reset_infos = self._reset_one(i, self._next_seed(i), None)
                for k in range(A):
                    infos[base + k] = {**infos[base + k], "reset_info": reset_infos[k]}
        return MultiAgentBatchStep(
            obs=self._gather(self._obs_rows),
            agent_mask=self._mask.copy(),
            reward=reward,
            terminated=term,
            truncated=trunc,
            final_obs=self._gather(final_rows),
            acted=acted,
            env_reset=env_reset,
            infos=infos,
        )

    # ------------------------------------------------------------------- snapshots

    def get_state(self) -> dict[str, Any]:
        """A plain-data snapshot: per-env snapshots, seeds, counters and the row layout."""
        if not self._has_reset:
            raise ResetNeeded("get_state() called before reset(); call reset() first")
        return {
            "format": VECTOR_STATE_FORMAT,
            "num_envs": self.num_envs,
            "root_seeds": list(self._roots),
            "episode_index": self._episode.copy(),
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
        roots = [None if r is None else int(r) for r in state["root_seeds"]]
        episode = np.asarray(state["episode_index"], dtype=np.int64).copy()
        mask = np.asarray(state["agent_mask"], dtype=np.bool_).copy()
        obs = state["obs_rows"]
        obs_rows = [np.array(obs[r], copy=True) for r in range(self.num_rows)]
        restore_all(self.envs, state["envs"])
        self._roots, self._episode, self._mask, self._obs_rows = roots, episode, mask, obs_rows
        self._has_reset = True

    def close(self) -> None:
        """Closes every env."""
        for env in self.envs:
            env.close()
