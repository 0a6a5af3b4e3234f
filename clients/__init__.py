"""Learner-side clients of simkit rollout servers.

:class:`RemoteVectorEnv` is a ``gymnasium.vector.VectorEnv`` over the wire protocol
(one or several servers presented as one vector); :class:`ServerUnavailable` is raised
when a server does not answer in time. :class:`RemoteMultiAgentVectorEnv` (agent rows
with an agent mask) and :class:`RemoteParallelEnv` (a PettingZoo ``ParallelEnv``) drive
multi-agent servers. :class:`CurveKeys` connects them to servers that require CURVE. :class:`PolicyStream`
streams trajectory fragments from servers that run the learner's policy.
:func:`launch` starts such servers as Ray actors across a cluster (``simkit[ray]``) and
returns their endpoints and CURVE keys (:class:`RayServers`).

Off-policy learning: :class:`ReplayBuffer` (transitions from fragments and recordings),
:class:`SAC` / :func:`train_sac` (the learner and its loops) and :func:`run_sac` (the
run behind ``simkit train ENV --algo sac``), :class:`LearnerMetrics` (its Prometheus
metrics).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simkit.clients._connection import CurveKeys, ServerUnavailable
    from simkit.clients._demo import DemoFigures, remote_demo
    from simkit.clients._launch import RayServers, ServerInfo, launch
    from simkit.clients._learner_metrics import LearnerMetrics
    from simkit.clients._parallel import RemoteMultiAgentVectorEnv, RemoteParallelEnv
    from simkit.clients._replay import ReplayBatch, ReplayBuffer
    from simkit.clients._stream import PolicyStream, ServerStats, fragment_to_torch, stack_fragments
    from simkit.clients._train_sac import run_sac
    from simkit.clients._vector import RemoteVectorEnv
    from simkit.clients.sac import SAC, SACArgs, TwinQ, train_sac

_WHERE = {
    "CurveKeys": "_connection",
    "ServerUnavailable": "_connection",
    "DemoFigures": "_demo",
    "remote_demo": "_demo",
    "RayServers": "_launch",
    "ServerInfo": "_launch",
    "launch": "_launch",
    "RemoteMultiAgentVectorEnv": "_parallel",
    "RemoteParallelEnv": "_parallel",
    "PolicyStream": "_stream",
    "ServerStats": "_stream",
    "fragment_to_torch": "_stream",
    "stack_fragments": "_stream",
    "RemoteVectorEnv": "_vector",
    "ReplayBuffer": "_replay",
    "ReplayBatch": "_replay",
    "SAC": "sac",
    "SACArgs": "sac",
    "TwinQ": "sac",
    "train_sac": "sac",
    "run_sac": "_train_sac",
    "LearnerMetrics": "_learner_metrics",
}
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
    # off-policy
    "ReplayBuffer",
    "ReplayBatch",
    "SAC",
    "SACArgs",
    "TwinQ",
    "train_sac",
    "run_sac",
    "LearnerMetrics",
]
