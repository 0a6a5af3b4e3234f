"""Multi-agent goal navigation: point masses that leave the episode on reaching their goals."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

import simkit
from simkit.randomization import Params

__all__ = ["GoalNav"]


SPACE_COPIES = 4
"""Float32 arrays of one agent's observation size that exist per agent: its space's low
and high, its observation, and the parts that observation is built from."""


def _check_size(n_agents: int) -> None:
    """Refuses ``n_agents`` whose spaces and observations (``n_agents`` of ``6 + 3 (N - 1)``
    floats each, :data:`SPACE_COPIES` times) do not fit the memory free, before any is
    built: the size may come from a file's or a command line's ``env_kwargs``.

    Raises:
        ValueError: naming ``n_agents``, the bytes needed and those free.
    """
    from simkit._limits import check_memory

    check_memory(
        n_agents * (6 + 3 * (n_agents - 1)) * 4 * SPACE_COPIES,
        f"GoalNav with n_agents={n_agents:,} ({n_agents:,} observation spaces of "
        f"{6 + 3 * (n_agents - 1):,} floats)",
        "fewer agents",
    )


class GoalNav(simkit.MultiAgentEnv[str, np.ndarray, np.ndarray]):
    """N point masses in a square arena, each steering to its own goal (PettingZoo Parallel).

    Agents ``"agent_0"`` .. ``"agent_{N-1}"`` do not collide; each is pushed by its own
    force. An agent that comes within ``goal_radius`` of its goal terminates and leaves
    ``env.agents``, so agents leave at different steps; the rest are truncated at 200.

    - Observation (per agent): ``Box(6 + 3 (N - 1),) float32`` = own position (2), own
      velocity (2), goal minus own position (2), then for every other agent in id order
      its position relative to this one (2); then, for the same others, 1.0 if still
      in the episode else 0.0. A departed agent's relative position reads as zeros.
    - Action (per agent): ``Box(-1, 1, (2,)) float32``, force ``action * 1.0`` N.
    - Dynamics (``dt = 0.1``): ``v += (F / mass - drag * v) dt``, speed clipped to 2 m/s,
      ``x += v dt``; the arena's walls stop the agent (position clipped, velocity into
      the wall zeroed).
    - Reward (per agent): ``10 * (previous distance - distance) - 0.01``, plus 10 on
      the step the goal is reached.
    - Termination: ``distance < goal_radius``. Truncation at 200 steps.
    - Start: per agent in id order, start uniform in the arena, then its goal uniform
      in the arena, redrawn until at least ``arena_size / 2`` from the start.
    - Randomization: ``mass ~ LogUniform(0.5, 2.0)`` kg, ``drag ~ U(0.1, 1.0)`` 1/s,
      ``goal_radius ~ U(0.1, 0.3)`` m, ``arena_size ~ U(1.5, 2.5)`` m (half-width);
      shared by all agents in an episode.

    Args:
        n_agents: N, at least 1.
        **kwargs: passed to :class:`simkit.MultiAgentEnv`.
    """

    metadata: dict[str, Any] = {"render_modes": [], "name": "goal_nav_v0"}
    max_episode_steps = 200
    randomization = {
        "mass": simkit.LogUniform(0.5, 2.0),
        "drag": simkit.Uniform(0.1, 1.0),
        "goal_radius": simkit.Uniform(0.1, 0.3),
        "arena_size": simkit.Uniform(1.5, 2.5),
    }
    state_attributes = ("pos", "vel", "goal")

    dt = 0.1
    max_force = 1.0
    max_speed = 2.0
    progress_weight = 10.0
    step_cost = 0.01
    goal_bonus = 10.0

    def __init__(self, n_agents: int = 3, **kwargs: Any) -> None:
        if isinstance(n_agents, bool) or not isinstance(n_agents, int):
            raise TypeError(f"n_agents must be an int, got {type(n_agents).__name__}")
        if n_agents < 1:
            raise ValueError(f"n_agents must be at least 1, got {n_agents}")
        _check_size(n_agents)
        super().__init__(**kwargs)
        self.n_agents = n_agents
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        half = 2.5  # the largest arena_size
        others = n_agents - 1
        high = np.concatenate(
            [
                np.full(2, half),
                np.full(2, self.max_speed),
                np.full(2 + 2 * others, 2 * half),
                np.ones(others),
            ]
        ).astype(np.float32)
        low = -high
        low[6 + 2 * others :] = 0.0
        self.observation_spaces = {
            agent: spaces.Box(low, high, dtype=np.float32) for agent in self.possible_agents
        }
        self.action_spaces = {
            agent: spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
            for agent in self.possible_agents
        }
        self.pos = np.zeros((n_agents, 2))
        self.vel = np.zeros((n_agents, 2))
        self.goal = np.zeros((n_agents, 2))

    def _index(self, agent: str) -> int:
        return self.possible_agents.index(agent)

    def _observe(self, i: int, live: set[int]) -> np.ndarray:
        rel = np.zeros((self.n_agents - 1, 2))
        present = np.zeros(self.n_agents - 1)
        for k, j in enumerate(j for j in range(self.n_agents) if j != i):
            if j in live:
                rel[k] = self.pos[j] - self.pos[i]
                present[k] = 1.0
        parts = [self.pos[i], self.vel[i], self.goal[i] - self.pos[i], rel.ravel(), present]
        return np.concatenate(parts).astype(np.float32)

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        half = params["arena_size"]
        for i in range(self.n_agents):
            self.pos[i] = rng.uniform(-half, half, size=2)
            for _ in range(1000):
                self.goal[i] = rng.uniform(-half, half, size=2)
                if np.linalg.norm(self.goal[i] - self.pos[i]) >= half / 2:
                    break
        self.vel[:] = 0.0
        live = set(range(self.n_agents))
        observations = {agent: self._observe(i, live) for i, agent in enumerate(self.agents)}
        infos = {
            agent: {"distance": float(np.linalg.norm(self.goal[i] - self.pos[i]))}
            for i, agent in enumerate(self.agents)
        }
        return observations, infos

    def step_episode(
        self, actions: dict[str, np.ndarray], rng: np.random.Generator
    ) -> tuple[
        dict[str, np.ndarray],
        dict[str, float],
        dict[str, bool],
        dict[str, dict[str, Any]],
    ]:
        p = self._params
        half = p["arena_size"]
        stepping = [self._index(agent) for agent in self.agents]
        before = {i: float(np.linalg.norm(self.goal[i] - self.pos[i])) for i in stepping}
        for i in stepping:
            force = np.asarray(actions[self.possible_agents[i]], dtype=np.float64)
            force = force * self.max_force
            vel = self.vel[i] + (force / p["mass"] - p["drag"] * self.vel[i]) * self.dt
            speed = float(np.linalg.norm(vel))
            if speed > self.max_speed:
                vel = vel * (self.max_speed / speed)
            pos = self.pos[i] + vel * self.dt
            hit = np.abs(pos) > half
            self.pos[i] = np.clip(pos, -half, half)
            self.vel[i] = np.where(hit, 0.0, vel)
        rewards: dict[str, float] = {}
        terminations: dict[str, bool] = {}
        infos: dict[str, dict[str, Any]] = {}
        live = set()
        for i in stepping:
            agent = self.possible_agents[i]
            distance = float(np.linalg.norm(self.goal[i] - self.pos[i]))
            reached = distance < p["goal_radius"]
            reward = self.progress_weight * (before[i] - distance) - self.step_cost
            rewards[agent] = reward + (self.goal_bonus if reached else 0.0)
            terminations[agent] = reached
            infos[agent] = {"distance": distance, "reached": reached}
            if not reached:
                live.add(i)
        observations = {self.possible_agents[i]: self._observe(i, live) for i in stepping}
        return observations, rewards, terminations, infos
