"""N points on a line as one BatchEnv, equal instance by instance to a single-instance env."""

import numpy as np
from gymnasium import spaces

import simkit
import simkit.testing


class Point(simkit.Env):
    """One point on a line pushed by the action, under a randomized drag; reward = -|x|."""

    max_episode_steps = 200
    randomization = {"drag": simkit.Uniform(0.0, 0.2)}
    state_attributes = ("x",)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float64)
        self.x = np.zeros(1)

    def reset_episode(self, rng, params, options):
        self.x = rng.uniform(-0.5, 0.5, 1)
        return self.x.copy(), {}

    def step_episode(self, action, rng):
        self.x = self.x * (1.0 - self.params["drag"]) + 0.1 * action
        return self.x.copy(), float(-abs(self.x[0])), bool(abs(self.x[0]) > 1.0), {}


class BatchPoint(simkit.BatchEnv):
    """N Points stepped as arrays: instance i is Point reset with episode_seed(root, i, k)."""

    max_episode_steps = 200
    randomization = Point.randomization
    state_attributes = ("x",)  # the per-instance arrays that make up the state
    single_env = Point  # the kit checks instance i against it, bit for bit

    def __init__(self, num_envs=8, **kwargs):
        one = Point()
        super().__init__(
            num_envs,
            single_observation_space=one.observation_space,
            single_action_space=one.action_space,
            **kwargs,
        )
        self.x = np.zeros((num_envs, 1))

    def reset_instances(self, ids, rngs, params, options):
        # ids: sorted instance indices; rngs.uniform row k = instance ids[k]'s draw
        self.x[ids] = rngs.uniform(-0.5, 0.5, (1,))
        return self.x[ids].copy(), None  # None: no per-row infos

    def step_instances(self, actions, rngs):
        drag = self.param_arrays["drag"][:, None]  # (N, 1): this episode's params
        self.x = self.x * (1.0 - drag) + 0.1 * actions
        return self.x.copy(), -np.abs(self.x[:, 0]), np.abs(self.x[:, 0]) > 1.0, None

    def step_subset(self, ids, actions, rngs):  # optional: moves only the instances ids
        drag = self.param_arrays["drag"][ids, None]
        self.x[ids] = self.x[ids] * (1.0 - drag) + 0.1 * actions
        x = self.x[ids]
        return x.copy(), -np.abs(x[:, 0]), np.abs(x[:, 0]) > 1.0, None


if __name__ == "__main__":
    simkit.testing.check_batch_env(BatchPoint)  # ConformanceError names the first failure
    print("BatchPoint passes the batch conformance kit")
