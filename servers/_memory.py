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
import os
import re
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

from simkit.protocol import Busy

__all__ = [
    "DEFAULT_MAX_MEMORY",
    "MemoryBudget",
    "parse_bytes",
    "give_back_memory",
    "resident_bytes",
    "SlotCosts",
    "Reservation",
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
    """Bytes that sessions may hold beyond the server's idle footprint (thread-safe),
    in all and per peer: a peer (a CURVE key, a non-loopback address) may hold at most
    its ``share`` of the total, so one peer's sessions cannot starve every other peer.

    Args:
        total: the budget in bytes.
    """

    def __init__(self, total: int) -> None:
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise ValueError(f"max_memory must be a positive int of bytes, got {total!r}")
        self.total = total
        self.used = 0
        """Bytes reserved now."""
        self._by_peer: dict[str, int] = {}
        self._lock = threading.Lock()

    def held_by(self, peer: str | None) -> int:
        """Bytes ``peer`` holds now (0 for None: this machine's own processes)."""
        return 0 if peer is None else self._by_peer.get(peer, 0)

    def reserve(self, nbytes: int, peer: str | None = None, share: int | None = None) -> bool:
        """Reserves ``nbytes`` for ``peer`` if they fit in the total and, for a peer
        with a ``share``, in what it may hold; whether they did."""
        with self._lock:
            if self.used + nbytes > self.total:
                return False
            held = self.held_by(peer)
            if peer is not None and share is not None and held + nbytes > share:
                return False
            self.used += nbytes
            if peer is not None:
                self._by_peer[peer] = held + nbytes
            return True

    def release(self, nbytes: int, peer: str | None = None) -> None:
        """Gives back ``nbytes`` reserved earlier (for ``peer``)."""
        with self._lock:
            self.used = max(0, self.used - nbytes)
            if peer is not None:
                left = self.held_by(peer) - nbytes
                if left > 0:
                    self._by_peer[peer] = left
                else:
                    self._by_peer.pop(peer, None)


def resident_bytes() -> int:
    """This process's resident set size in bytes (0 where ``/proc`` has none)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name is not None else None
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


class SlotCosts:
    """What one env slot of a session costs the server, measured once per env id and
    kwargs: the growth of the resident set while ``PROBE`` slots are built (after one
    slot built and closed first, so that imports and one-time caches do not count),
    at least ``FLOOR`` bytes. A session reserves ``num_envs`` times that from the
    budget before its envs are built, so the budget bounds envs as well as fragments."""

    PROBE = 16
    FLOOR = 4096

    def __init__(self) -> None:
        self._known: dict[str, int] = {}
        self._lock = threading.Lock()

    def per_slot(self, key: str, build: Callable[[int], Any]) -> int:
        """Bytes of one slot of the envs ``key`` names; ``build(n)`` returns ``n`` slots
        of them as an object with ``close()``."""
        with self._lock:
            known = self._known.get(key)
            if known is not None:
                return known
            build(1).close()
            give_back_memory()
            before = resident_bytes()
            probe = build(self.PROBE)
            grown = resident_bytes() - before
            probe.close()
            give_back_memory()
            cost = max(self.FLOOR, grown // self.PROBE)
            self._known[key] = cost
            return cost


class Reservation:
    """What one session holds of a server's budget: reserved piece by piece as the
    session opens (its envs before they are built, then its fragments and model), for
    its peer within the peer's ``share``, and released whole when it ends.

    Args:
        budget: the server's budget.
        peer: the peer's quota key (None: this machine's own processes).
        share: the most the peer may hold in all (None: no per-peer limit).
    """

    def __init__(self, budget: MemoryBudget, peer: str | None = None, share: int | None = None):
        self.budget = budget
        self.peer = peer
        self.share = share
        self.held = 0

    def add(self, nbytes: int, what: str) -> None:
        """Reserves ``nbytes`` more for ``what`` (words for the message).

        Raises:
            Busy: the budget, or the peer's share of it, has less left.
        """
        budget = self.budget
        if budget.reserve(nbytes, self.peer, self.share):
            self.held += nbytes
            return
        left = budget.total - budget.used
        if self.peer is not None and self.share is not None:
            left = min(left, self.share - budget.held_by(self.peer))
            whose = f"this peer's share ({self.share:,} bytes) of the server's memory budget"
        else:
            whose = f"the server's memory budget ({budget.total:,} bytes)"
        raise Busy(
            f"{whose} has too little left for {what}; retry later, ask for fewer env "
            "slots or a shorter fragment_length, or give the server more (--max-memory)",
            expected=f"<= {max(0, left):,} bytes",
            got=nbytes,
        )

    def release(self) -> None:
        """Gives back everything held."""
        self.budget.release(self.held, self.peer)
        self.held = 0
