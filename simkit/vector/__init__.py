"""Batched execution of single-instance envs: ``VectorEnv`` and ``MultiAgentVectorEnv``.

Both are faces of one core, ``_core.VectorCore`` (each env as rows of agents; a
single-agent env is an env with one agent row). See docs/vector.md for seeding,
autoreset modes, threads, the async API and the core.
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
