"""Learner-side clients of simkit rollout servers, in three sub-packages.

- ``simkit.clients.remote``, the protocol clients: :class:`RemoteVectorEnv` is a
  ``gymnasium.vector.VectorEnv`` over the wire protocol (one or several servers presented as
  one vector; :class:`ServerUnavailable` when a server does not answer in time);
  :class:`RemoteMultiAgentVectorEnv` (agent rows with an agent mask) and
  :class:`RemoteParallelEnv` (a PettingZoo ``ParallelEnv``) drive multi-agent servers;
  :class:`CurveKeys` connects them to servers that require CURVE; :class:`PolicyStream`
  streams trajectory fragments from servers that run the learner's policy.
- ``simkit.clients.learners``, the algorithms and the run they learn in: :class:`PPO`,
  :class:`SAC`, :class:`ReplayBuffer`, checkpoints, the run behind ``simkit train`` and
  :func:`simkit.train`, :class:`LearnerMetrics`.
- ``simkit.clients.launcher``: :func:`launch` starts servers as Ray actors across a cluster
  (``simkit[ray]``) and returns their endpoints and CURVE keys (:class:`RayServers`).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simkit.clients.launcher._launch import RayServers, ServerInfo, launch
    from simkit.clients.learners._learner_metrics import LearnerMetrics
    from simkit.clients.learners._replay import ReplayBatch, ReplayBuffer
    from simkit.clients.learners.ppo import PPO, PPOArgs, UpdateStats
    from simkit.clients.learners.sac import SAC, SACArgs, TwinQ
    from simkit.clients.remote._connection import (
        CurveKeys,
        ServerLost,
        ServerRefused,
        ServerUnavailable,
    )
    from simkit.clients.remote._demo import DemoFigures, remote_demo
    from simkit.clients.remote._parallel import RemoteMultiAgentVectorEnv, RemoteParallelEnv
    from simkit.clients.remote._stream import (
        PolicyStream,
        ServerStats,
        fragment_to_torch,
        stack_fragments,
    )
    from simkit.clients.remote._vector import RemoteVectorEnv

_MODULES = {
    "remote._vector": ("RemoteVectorEnv",),
    "remote._parallel": ("RemoteMultiAgentVectorEnv", "RemoteParallelEnv"),
    "remote._connection": ("ServerUnavailable", "ServerLost", "ServerRefused", "CurveKeys"),
    "remote._demo": ("remote_demo", "DemoFigures"),
    "remote._stream": ("PolicyStream", "ServerStats", "stack_fragments", "fragment_to_torch"),
    "launcher._launch": ("launch", "RayServers", "ServerInfo"),
    "learners.ppo": ("PPO", "PPOArgs", "UpdateStats"),
    "learners._replay": ("ReplayBuffer", "ReplayBatch"),
    "learners.sac": ("SAC", "SACArgs", "TwinQ"),
    "learners._learner_metrics": ("LearnerMetrics",),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
"""Where each public name lives: imported on first use, so a submodule (the command
line's) can be imported without loading torch."""


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"simkit.clients.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'simkit.clients' has no attribute {name!r}")


__all__ = [
    "RemoteVectorEnv",
    "RemoteMultiAgentVectorEnv",
    "RemoteParallelEnv",
    "ServerUnavailable",
    "ServerLost",
    "ServerRefused",
    "CurveKeys",
    "remote_demo",
    "DemoFigures",
    # policy serving
    "PolicyStream",
    "ServerStats",
    "stack_fragments",
    "fragment_to_torch",
    # scale-out
    "launch",
    "RayServers",
    "ServerInfo",
    # on-policy
    "PPO",
    "PPOArgs",
    "UpdateStats",
    # off-policy
    "ReplayBuffer",
    "ReplayBatch",
    "SAC",
    "SACArgs",
    "TwinQ",
    "LearnerMetrics",
]
