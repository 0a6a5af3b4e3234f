"""Reference environments written with the simkit SDK.

Importing this package only registers ids; each env module is imported on first ``make``.

| id | contract | task |
|---|---|---|
| ``simkit/CartPole-v0`` | Env, Discrete | balance a pole on a cart |
| ``simkit/BatchCartPole-v0`` | BatchEnv, Discrete | N cart-poles as numpy/torch arrays |
| ``simkit/BatchCheetah-v0`` | BatchMujocoEnv, Box(6) | N planar runners, MuJoCo batch stepping |
| ``simkit/Cheetah-v0`` | MujocoEnv, Box(6) | planar MuJoCo runner, run forward |
| ``simkit/Pendulum-v0`` | Env, Box(1) | swing a pendulum up and hold it |
| ``simkit/BatchPendulum-v0`` | BatchEnv, Box(1) | N pendulums as numpy/torch arrays |
| ``simkit/Reacher-v0`` | MujocoEnv, Box(2) | two-link arm reaching a random target |
| ``simkit/GoalNav-v0`` | MultiAgentEnv, Box(2) | N point masses to their goals, leaving early |
"""

from simkit.registry import EnvKind, register

__all__: list[str] = []

register(
    "simkit/CartPole-v0",
    "simkit.envs.cartpole:CartPole",
    description="balance a pole on a cart (discrete, randomized physics)",
)

register(
    "simkit/BatchCartPole-v0",
    "simkit.envs.batch_cartpole:BatchCartPole",
    kind=EnvKind.BATCH,
    description="N cart-poles stepped as arrays (bit-identical to N CartPole-v0)",
)

register(
    "simkit/Cheetah-v0",
    "simkit.envs.cheetah:Cheetah",
    description="planar MuJoCo runner: run forward (continuous, randomized physics)",
)

register(
    "simkit/Pendulum-v0",
    "simkit.envs.pendulum:Pendulum",
    description="pendulum swing-up (continuous torque, randomized physics)",
)

register(
    "simkit/BatchPendulum-v0",
    "simkit.envs.batch_pendulum:BatchPendulum",
    kind=EnvKind.BATCH,
    description="N pendulum swing-ups stepped as arrays, numpy or torch (bit-identical to N Pendulum-v0)",
)

register(
    "simkit/Reacher-v0",
    "simkit.envs.reacher:Reacher",
    description="two-link MuJoCo arm reaching a random target (randomized physics)",
)

register(
    "simkit/GoalNav-v0",
    "simkit.envs.goal_nav:GoalNav",
    kind=EnvKind.MULTI_AGENT,
    description="N point masses steering to their goals; agents leave on arrival",
)

register(
    "simkit/BatchCheetah-v0",
    "simkit.envs.batch_cheetah:BatchCheetah",
    kind=EnvKind.BATCH,
    description="N planar MuJoCo runners stepped as a batch (bit-identical to N Cheetah-v0)",
)
