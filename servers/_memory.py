"""A rollout server's memory budget, and giving freed memory back to the system.

:class:`MemoryBudget` is the byte budget (``--max-memory``) stream sessions reserve
from when they open (their fragments in flight, their model and the weights that may
wait for a fragment's end) and requests waiting for a session's worker draw on; a
session that would exceed it is refused with ``busy`` instead of growing the process.
:func:`give_back_memory` returns what the C allocator keeps after sessions closed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import threading
from functools import cache
from typing import Any

__all__ = [
    "DEFAULT_MAX_MEMORY",
    "MemoryBudget",
    "parse_bytes",
    "give_back_memory",
]

DEFAULT_MAX_MEMORY = 2 << 30
"""2 GiB: the default ``--max-memory`` (an eighth of it, 256 MiB, is the default
largest message)."""

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"1.5G"``, ``"1048576"`` (binary units, optional ``iB``/``B``)
    as a number of bytes.

    Raises:
        ValueError: not a size, or not positive.
    """
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)(?:i?B)?\s*", text)
    if match is None:
        raise ValueError(f"expected a size such as 512M or 2G, got {text!r}")
    value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise ValueError(f"expected a positive size, got {text!r}")
    return value


class MemoryBudget:
    """Bytes that sessions may hold beyond the server's idle footprint (thread-safe).

    Args:
        total: the budget in bytes.
    """

    def __init__(self, total: int) -> None:
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise ValueError(f"max_memory must be a positive int of bytes, got {total!r}")
        self.total = total
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes reserved now."""
        return self._used

    def reserve(self, nbytes: int) -> bool:
        """Reserves ``nbytes`` if they fit; whether they did."""
        with self._lock:
            if self._used + nbytes > self.total:
                return False
            self._used += nbytes
            return True

    def release(self, nbytes: int) -> None:
        """Gives back ``nbytes`` reserved earlier."""
        with self._lock:
            self._used = max(0, self._used - nbytes)


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def give_back_memory() -> bool:
    """Returns the free memory glibc's allocator keeps in its heaps to the system
    (``malloc_trim(0)``, every arena); whether it could (False off glibc).

    A closed session's buffers go back to the allocator, not to the system: glibc keeps
    freed chunks inside its heaps (one per thread that allocated), so without this a
    server's resident size stays at its high-water mark.
    """
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
