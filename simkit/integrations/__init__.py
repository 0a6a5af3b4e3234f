"""Adapters from simkit's vectors to other libraries' env interfaces.

Each submodule needs its library, an optional extra that importing the submodule names
when it is missing: :mod:`simkit.integrations.sb3` (Stable-Baselines3's ``VecEnv``,
extra ``sb3``) and :mod:`simkit.integrations.torchrl` (TorchRL's ``EnvBase``, extra
``torchrl``). This package itself imports neither.
"""
