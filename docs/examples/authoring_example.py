"""A point mass on a line, pushed toward the origin: randomized, seeded, snapshot-able."""

from typing import Any

import numpy as np
from gymnasium import spaces

import simkit


class PointMass(simkit.Env[np.ndarray, np.ndarray]):
    max_episode_steps = 200  # simkit truncates here; no TimeLimit wrapper needed
    randomization = {
        "mass": simkit.LogUniform(0.5, 2.0),  # sampled at every reset from the env's rng
        "friction": simkit.Uniform(0.0, 0.2),
        "noise": simkit.Choice((0.0, 0.01)),
    }
    state_attributes = ("x", "v")  # all the dynamic state: get_state/set_state copy these

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        big = np.finfo(np.float64).max  # "unbounded", but finite as Gymnasium prefers
        self.observation_space = spaces.Box(-big, big, shape=(2,), dtype=np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.x, self.v = 0.0, 0.0

    def reset_episode(
        self, rng: np.random.Generator, params: dict[str, Any], options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.x, self.v = float(rng.uniform(-1.0, 1.0)), 0.0
        return np.array([self.x, self.v]), {}

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        p, dt = self.params, 0.05
        force = float(action[0]) - p["friction"] * self.v + p["noise"] * rng.normal()
        self.v += dt * force / p["mass"]
        self.x += dt * self.v
        reached = abs(self.x) < 0.05 and abs(self.v) < 0.05
        return np.array([self.x, self.v]), -abs(self.x), reached, {}


if __name__ == "__main__":
    simkit.register("example/PointMass-v0", PointMass)
    env = simkit.make("example/PointMass-v0", params={"noise": 0.0})
    obs, info = env.reset(seed=0)
    print(obs, info["params"], env.step(np.array([-0.5]))[:4])
