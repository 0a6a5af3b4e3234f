"""Learner-side clients of simkit rollout servers.

:class:`RemoteVectorEnv` is a ``gymnasium.vector.VectorEnv`` over the wire protocol
(one or several servers presented as one vector); :class:`ServerUnavailable` is raised
when a server does not answer in time. :class:`RemoteMultiAgentVectorEnv` (agent rows
with an agent mask) and :class:`RemoteParallelEnv` (a PettingZoo ``ParallelEnv``) drive
multi-agent servers. :class:`CurveKeys` connects them to servers that require CURVE. :class:`PolicyStream`
streams trajectory fragments from servers that run the learner's policy.
:func:`launch` starts such servers as Ray actors across a cluster (``simkit[ray]``) and
returns their endpoints and CURVE keys (:class:`RayServers`).
"""

from simkit.clients._connection import CurveKeys, ServerUnavailable
from simkit.clients._demo import DemoFigures, remote_demo
from simkit.clients._launch import RayServers, ServerInfo, launch
from simkit.clients._parallel import RemoteMultiAgentVectorEnv, RemoteParallelEnv
from simkit.clients._stream import PolicyStream, ServerStats, fragment_to_torch, stack_fragments
from simkit.clients._vector import RemoteVectorEnv

__all__ = [
    "RemoteVectorEnv",
    "RemoteMultiAgentVectorEnv",
    "RemoteParallelEnv",
    "ServerUnavailable",
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
]
