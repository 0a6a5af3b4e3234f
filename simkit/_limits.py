"""Bounds on what a command line or a file may ask of this machine, shared by every command.

Every number a user or a file gives that sizes something (envs, steps, threads, a
network, a buffer, a port, a timeout) is checked here before anything is allocated or
started, and a value out of bounds is one line naming the flag, what it must be and
what came (:class:`Range`, :func:`check_ranges`), or what it would need against the
memory this machine has free (:func:`check_memory`). JSON from a command line is parsed
with a nesting limit (:func:`loads_json`).
"""

from __future__ import annotations

import itertools
import math
import os
import resource
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_PORT",
    "ENV_BYTES",
    "MAX_ENV_ID_LENGTH",
    "Range",
    "TooDeep",
    "available_memory",
    "check_env_id",
    "check_memory",
    "check_network",
    "check_ranges",
    "human_bytes",
    "json_depth",
    "loads_json",
    "max_threads",
    "mlp_parameters",
]

MAX_JSON_DEPTH = 32
"""How deep a JSON value from a command line (``--env-kwarg KEY=VALUE``) may nest."""

MAX_PORT = 65535

ENV_BYTES = 4 << 10
"""The least memory one env takes (a CartPole instance, ~4 KiB; MuJoCo envs take
hundreds): ``num_envs`` envs need at least this many bytes each."""

_THREADS_PER_CORE = 4
_MIN_MAX_THREADS = 64


def max_threads() -> int:
    """The most threads one setting may ask for: 4 per core of this machine, at least 64
    (more only exhaust the host's threads: a million torch threads crashed the process)."""
    return max(_MIN_MAX_THREADS, _THREADS_PER_CORE * (os.cpu_count() or 1))


@dataclass(frozen=True)
class Range:
    """What a numeric flag must be: in ``[low, high]`` (``low_open``: ``(low, high]``;
    no ``high``: ``>= low``), finite; ``None`` passes where ``optional``. ``what`` words it instead of the
    interval (``"a port in [0, 65535]"``)."""

    flag: str
    low: float
    high: float = math.inf
    low_open: bool = False
    optional: bool = False
    what: str | None = None

    def wording(self) -> str:
        """``"in [1, 64]"``, ``"in (0, 86400]"``, or :attr:`what`."""
        if self.what is not None:
            return self.what
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        return f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}]"

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is within the range (a bool or a non-number never is)."""
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high


def _num(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:g}" if isinstance(x, float) else f"{x}"


def check_ranges(values: Iterable[tuple[Range, Any]]) -> None:
    """Raises for the first ``(range, value)`` whose value is out of its range.

    Raises:
        ValueError: ``"<flag> must be <range>, got <value>"``.
    """
    for bound, value in values:
        if not bound.holds(value):
            raise ValueError(f"{bound.flag} must be {bound.wording()}, got {value}")


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """Bytes this process's cgroup (v2, else v1) may still take, where it is limited."""
    pairs = (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    )
    for limit_file, usage_file in pairs:
        try:
            with open(limit_file) as f:
                raw = f.read().strip()
            if raw == "max":
                return None
            limit = int(raw)
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit >= 1 << 60:  # v1's "unlimited"
            return None
        return max(0, limit - usage)
    return None


def _address_space_room() -> int | None:
    """Bytes of address space left under ``RLIMIT_AS``, where it is set."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return soft
    return max(0, soft - used)


def available_memory() -> int:
    """Bytes this process can still allocate: the system's available memory, less where
    a cgroup limit or ``RLIMIT_AS`` leaves less."""
    candidates = [_meminfo_available(), _cgroup_room(), _address_space_room()]
    if candidates[0] is None:
        try:
            candidates[0] = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            candidates[0] = None
    known = [c for c in candidates if c is not None]
    return min(known) if known else 1 << 62


def human_bytes(n: float) -> str:
    """``"14.6 TiB"``, ``"512 KiB"``, ``"3 B"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_memory(nbytes: float, what: str, advice: str = "") -> None:
    """Refuses an allocation of ``nbytes`` that does not fit the memory available now.

    Raises:
        ValueError: ``"<what> needs <size>, more than the <size> of memory available
            (<advice>)"``.
    """
    free = available_memory()
    if nbytes > free:
        tail = f" ({advice})" if advice else ""
        raise ValueError(
            f"{what} needs {human_bytes(nbytes)}, more than the {human_bytes(free)} of memory "
            f"available{tail}"
        )


def mlp_parameters(widths: Iterable[int]) -> int:
    """Weights and biases of a stack of linear layers of these widths (input first)."""
    sizes = [int(w) for w in widths]
    return sum(a * b + b for a, b in itertools.pairwise(sizes))


NETWORK_BYTES_PER_PARAMETER = 16
"""float32 weights, their gradients and Adam's two moments."""


def check_network(widths: Iterable[int], copies: int = 1) -> None:
    """Refuses ``copies`` stacks of linear layers of these widths (input first) that do
    not fit the memory available, with their gradients and optimiser state, before a
    weight is allocated (``--hidden 1000000000`` grew to gigabytes).

    Raises:
        ValueError: one line with the widths, the parameters and the memory.
    """
    sizes = [int(w) for w in widths]
    params = mlp_parameters(sizes) * copies
    shown = ", ".join(f"{w:,}" for w in sizes[:8]) + (", ..." if len(sizes) > 8 else "")
    check_memory(
        params * NETWORK_BYTES_PER_PARAMETER,
        f"a network of layer widths [{shown}] ({params:,} parameters, with gradients and "
        "optimiser state)",
        "smaller hidden sizes",
    )


MAX_ENV_ID_LENGTH = 256
"""The longest env id accepted (registered, ``gym:`` or ``package.module:Class``);
``simkit.registry`` applies it to ids from files and peers."""


def check_env_id(env_id: str, flag: str = "ENV_ID") -> None:
    """Refuses an env id longer than :data:`MAX_ENV_ID_LENGTH` (the one bound, which the
    registry also applies to ids from files and peers).

    Raises:
        ValueError: one line with its length (not the id itself).
    """
    if len(env_id) > MAX_ENV_ID_LENGTH:
        raise ValueError(
            f"{flag} must be at most {MAX_ENV_ID_LENGTH} characters, got {len(env_id):,}"
        )


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (strings skipped),
    counted without parsing it (a parser recurses once per level)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


class TooDeep(ValueError):
    """JSON nested deeper than :data:`MAX_JSON_DEPTH`."""


def loads_json(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` of ``text`` refusing values nested deeper than ``max_depth``.

    Raises:
        TooDeep: nested deeper (a ``ValueError``, not a ``JSONDecodeError``).
        json.JSONDecodeError: not JSON.
    """
    import json

    depth = json_depth(text)
    if depth > max_depth:
        raise TooDeep(f"JSON nested {depth} levels deep, more than {max_depth}")
    return json.loads(text)
