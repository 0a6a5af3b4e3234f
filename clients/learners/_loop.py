"""The one learning loop of every algorithm: fragments in, a round's update, new weights
out.

:func:`drive` pulls fragments from a source and gives each to the algorithm's
:class:`Rounds` until it says a round is ready, runs the round (an update: PPO's one
update, SAC's gradient steps), then, unless it was the last round, calls
``on_boundary()`` (in sync mode every source now waits at a fragment boundary, the one
point where a checkpoint captures its envs exactly) and pushes the new weights. The
last round's weights are not pushed (nothing would use them), so on return the source
is at that boundary too. :class:`simkit.clients.learners._run.Run` drives every algorithm
through it; :func:`simkit.clients.learners.ppo.train` and :func:`simkit.clients.learners.sac.train_sac`
are the same loop for a learner alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

__all__ = ["Learner", "Rounds", "drive"]


class Learner(Protocol):
    """What the loop and the run read of a learner (:class:`~simkit.clients.learners.ppo.PPO`,
    :class:`~simkit.clients.learners.sac.SAC`)."""

    model: Any
    """The policy pushed to the source after a round."""
    version: int
    """The version of the newest weights."""
    global_step: int
    """Env steps learned from."""


class Rounds(Protocol):
    """An algorithm's side of the loop (:class:`simkit.clients.learners.ppo.PPORounds`,
    :class:`simkit.clients.learners.sac.SACRounds`)."""

    def ready(self, source: Any) -> bool:
        """Whether the fragments taken make a round (asked before each pull)."""
        ...

    def take(self, fragment: Any) -> None:
        """One pulled fragment (``None``: the source changed, e.g. lost a server)."""
        ...

    def update(self) -> Any:
        """The round's update of what was taken; returns its statistics (with the
        ``episode_returns`` of the episodes that ended in it)."""
        ...

    def finished(self) -> bool:
        """Whether the run reached its ``total_steps``."""
        ...

    @property
    def learner(self) -> Learner:
        """The learner whose weights go out after a round."""
        ...


def drive(
    rounds: Rounds,
    source: Any,
    *,
    max_rounds: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_boundary: Callable[[], None] | None = None,
    on_round: Callable[[Any, float, bool], None] | None = None,
    on_fragment: Callable[[Any], None] | None = None,
) -> None:
    """Runs rounds of ``rounds`` over ``source`` until it is finished, ``max_rounds``
    rounds of this call are done, ``should_stop()`` turns true (checked after each
    round) or the source ends.

    ``on_fragment(fragment)`` sees every fragment pulled (before the algorithm takes
    it); ``on_round(stats, wait_s, last)`` gets each round's statistics, the seconds
    spent waiting for the source and whether it is the call's last round.
    """
    stream: Iterator[Any] = iter(source.fragments())
    end = object()
    done = 0
    while True:
        wait = 0.0
        while not rounds.ready(source):
            t_wait = time.perf_counter()
            fragment = next(stream, end)
            wait += time.perf_counter() - t_wait
            if fragment is end:
                return
            if fragment is not None and on_fragment is not None:
                on_fragment(fragment)
            rounds.take(fragment)
        stats = rounds.update()
        done += 1
        last = bool(
            rounds.finished()
            or (max_rounds is not None and done >= max_rounds)
            or (should_stop is not None and should_stop())
        )
        if not last:
            if on_boundary is not None:
                on_boundary()
            source.push_weights(rounds.learner.model, version=rounds.learner.version)
        if on_round is not None:
            on_round(stats, wait, last)
        if last:
            return
