"""Batched execution of single-instance envs: ``VectorEnv`` and ``MultiAgentVectorEnv``.

See docs/vector.md for seeding, autoreset modes, threads and the async API.
"""

from simkit.vector._multiagent import MultiAgentBatchStep, MultiAgentVectorEnv
from simkit.vector._vector import VECTOR_STATE_FORMAT, VectorEnv, make_vec

__all__ = [
    "VectorEnv",
    "MultiAgentVectorEnv",
    "MultiAgentBatchStep",
    "make_vec",
    "VECTOR_STATE_FORMAT",
]
