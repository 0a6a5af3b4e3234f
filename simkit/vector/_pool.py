"""A minimal thread pool with one inbox per worker and one shared outbox.

Each hand-off is one ``SimpleQueue.put``/``get`` pair (a C-level queue), so dispatching
a chunk of envs to a worker costs one thread wake-up, not one per env.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

__all__ = ["WorkerPool"]

_LIVE: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    """Stops every pool still running at interpreter exit: a daemon worker in the middle of
    a step (a vector left with steps in flight) would run on while the interpreter tears
    down the env under it (MuJoCo: a segfault)."""
    for pool in list(_LIVE):
        pool.close(timeout=30.0)  # a hung env step must not hang the exit too


_Task = tuple[Callable[[Any], Any], Any, Any]


class WorkerPool:
    """``size`` daemon threads; task results (or exceptions) come back tagged.

    Args:
        size: number of worker threads.
        name: thread name prefix (shown by profilers).
    """

    def __init__(self, size: int, name: str = "simkit-vector") -> None:
        self.size = size
        self._inboxes: list[SimpleQueue[_Task | None]] = [SimpleQueue() for _ in range(size)]
        self._outbox: SimpleQueue[tuple[Any, Any, BaseException | None]] = SimpleQueue()
        self._threads = [
            threading.Thread(target=self._loop, args=(box,), name=f"{name}-{w}", daemon=True)
            for w, box in enumerate(self._inboxes)
        ]
        for thread in self._threads:
            thread.start()
        _LIVE.add(self)

    def _loop(self, inbox: SimpleQueue[_Task | None]) -> None:
        while True:
            task = inbox.get()
            if task is None:
                return
            fn, arg, tag = task
            try:
                self._outbox.put((tag, fn(arg), None))
            except BaseException as exc:  # re-raised in the caller's thread
                self._outbox.put((tag, None, exc))

    def submit(self, worker: int, fn: Callable[[Any], Any], arg: Any, tag: Any) -> None:
        """Queues ``fn(arg)`` on worker ``worker``; its result comes back with ``tag``."""
        self._inboxes[worker].put((fn, arg, tag))

    def get(self) -> tuple[Any, Any, BaseException | None]:
        """Blocks for the next finished task: ``(tag, result, exception or None)``."""
        return self._outbox.get()

    def close(self, timeout: float | None = None) -> None:
        """Stops every worker (after its queued tasks) and joins it, waiting at most
        ``timeout`` seconds for each (None: as long as it takes)."""
        _LIVE.discard(self)
        for box in self._inboxes:
            box.put(None)
        for thread in self._threads:
            thread.join(timeout)
