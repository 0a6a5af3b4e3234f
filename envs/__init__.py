"""Reference environments written with the simkit SDK.

Importing this package only registers ids; each env module is imported on first ``make``.

| id | contract | task |
|---|---|---|
| ``simkit/CartPole-v0`` | Env, Discrete | balance a pole on a cart |
"""

from simkit.registry import register

__all__: list[str] = []

register(
    "simkit/CartPole-v0",
    "simkit.envs.cartpole:CartPole",
    description="balance a pole on a cart (discrete, randomized physics)",
)
