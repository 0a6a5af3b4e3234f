"""Reference environments written with the simkit SDK.

Importing this package only registers ids; each env module is imported on first ``make``.

| id | contract | task |
|---|---|---|
| ``simkit/CartPole-v0`` | Env, Discrete | balance a pole on a cart |
| ``simkit/BatchCartPole-v0`` | BatchEnv, Discrete | N cart-poles as numpy/torch arrays |
| ``simkit/BatchCheetah-v0`` | BatchMujocoEnv, Box(6) | N planar runners, thread-pooled MuJoCo |
| ``simkit/Cheetah-v0`` | MujocoEnv, Box(6) | planar MuJoCo runner, run forward |
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
    "simkit/BatchCheetah-v0",
    "simkit.envs.batch_cheetah:BatchCheetah",
    kind=EnvKind.BATCH,
    description="N planar MuJoCo runners stepped as a batch (bit-identical to N Cheetah-v0)",
)
