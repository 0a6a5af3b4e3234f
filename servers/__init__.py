"""ZeroMQ rollout servers: serve simkit, Gymnasium or PettingZoo envs to remote learners.

See docs/server.md; the wire protocol is :mod:`simkit.protocol` (docs/protocol.md).
"""

from simkit.servers._batch_host import BatchEnvHost
from simkit.servers._cli import PARENT_ENV, add_serve_arguments, run_serve
from simkit.servers._host import (
    PZ_PREFIX,
    EnvListHost,
    ParallelEnvHost,
    is_multi_agent_id,
    make_env_factory,
    make_parallel_env_factory,
)
from simkit.servers._prometheus import Metrics
from simkit.servers._server import BUSY_POLL_US, RolloutServer, is_loopback

__all__ = [
    "RolloutServer",
    "BUSY_POLL_US",
    "EnvListHost",
    "BatchEnvHost",
    "make_env_factory",
    "ParallelEnvHost",
    "make_parallel_env_factory",
    "is_multi_agent_id",
    "PZ_PREFIX",
    "Metrics",
    "is_loopback",
    "add_serve_arguments",
    "PARENT_ENV",
    "run_serve",
]
