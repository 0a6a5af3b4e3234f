"""ZeroMQ rollout servers: serve simkit (or Gymnasium) envs to remote learners.

See docs/server.md; the wire protocol is :mod:`simkit.protocol` (docs/protocol.md).
"""

from simkit.servers._batch_host import BatchEnvHost
from simkit.servers._cli import add_serve_arguments, run_serve
from simkit.servers._host import EnvListHost, make_env_factory
from simkit.servers._metrics import Metrics
from simkit.servers._server import RolloutServer, is_loopback

__all__ = [
    "RolloutServer",
    "EnvListHost",
    "BatchEnvHost",
    "make_env_factory",
    "Metrics",
    "is_loopback",
    "add_serve_arguments",
    "run_serve",
]
