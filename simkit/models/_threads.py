"""The compute threads of a process that acts and learns: torch's and numpy's BLAS.

:class:`~simkit.models._lean.LeanMLP` acts through numpy products of 16-row blocks,
too small for BLAS threads to pay off. numpy's OpenBLAS still wakes its threads for
them, and after each call they spin waiting for more work, on the cores that torch's
update needs. Where acting and learning alternate step by step (SAC at one gradient
step per env step, in process or beside a server), that halves the learner's speed
(docs/benchmarks.md). So every simkit process that runs a policy sets numpy's BLAS to
one thread when it sets torch's threads; one function does both.
"""

from __future__ import annotations

import torch
from threadpoolctl import threadpool_limits

__all__ = ["set_compute_threads"]


def set_compute_threads(torch_threads: int) -> None:
    """Sets torch's intra-op threads to ``torch_threads`` and numpy's BLAS to one
    thread, for the rest of the process.

    Raises:
        ValueError: ``torch_threads`` < 1.
    """
    if torch_threads < 1:
        raise ValueError(f"torch_threads must be >= 1, got {torch_threads}")
    torch.set_num_threads(torch_threads)
    threadpool_limits(limits=1, user_api="blas")
