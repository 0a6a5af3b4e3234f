"""The one learning loop (``clients/learners/_loop.py``) and the algorithm registry of the training
run (``clients/learners/_run.py``), with a toy algorithm: no env, no torch model."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from simkit.clients.learners._loop import drive
from simkit.clients.learners._run import ALGORITHMS, algorithm


@dataclass
class _Learner:
    model: Any = "weights"
    version: int = 0
    global_step: int = 0


@dataclass
class _Stats:
    version: int
    episode_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))


class _Pairs:
    """A toy algorithm: a round is two fragments (ints), ``total`` env steps in all."""

    def __init__(self, total: int, log: list[str]) -> None:
        self.learner = _Learner()
        self.held: list[int] = []
        self.total = total
        self.log = log

    def ready(self, source: Any) -> bool:
        return len(self.held) >= 2

    def take(self, fragment: int | None) -> None:
        self.log.append(f"take {fragment}")
        if fragment is not None:
            self.held.append(fragment)

    def update(self) -> _Stats:
        self.learner.global_step += len(self.held)
        self.learner.version += 1
        self.held = []
        self.log.append(f"update -> v{self.learner.version}")
        return _Stats(self.learner.version)

    def finished(self) -> bool:
        return bool(self.total and self.learner.global_step >= self.total)


class _Source:
    def __init__(self, items: list[int | None], log: list[str]) -> None:
        self.items = items
        self.log = log

    def fragments(self) -> Iterator[int | None]:
        yield from self.items

    def push_weights(self, model: Any, *, version: int | None = None) -> int:
        self.log.append(f"push v{version}")
        return 0


def test_a_round_checkpoints_then_pushes_and_the_last_round_pushes_nothing() -> None:
    log: list[str] = []
    seen: list[int] = []
    drive(
        _Pairs(4, log),
        _Source([1, None, 2, 3, 4, 5], log),
        on_boundary=lambda: log.append("boundary"),
        on_round=lambda stats, wait, last: log.append(f"round v{stats.version} last={last}"),
        on_fragment=seen.append,
    )
    assert log == [
        "take 1",
        "take None",  # the source changed: the loop asks again whether a round is ready
        "take 2",
        "update -> v1",
        "boundary",
        "push v1",
        "round v1 last=False",
        "take 3",
        "take 4",
        "update -> v2",
        "round v2 last=True",  # finished: its weights would be used by nobody
    ]
    assert seen == [1, 2, 3, 4]  # every fragment, never the None


@pytest.mark.parametrize("max_rounds", [1, 2])
def test_max_rounds_and_a_stop_request_end_the_loop_after_a_round(max_rounds: int) -> None:
    log: list[str] = []
    rounds = _Pairs(0, log)  # 0: until stopped
    drive(rounds, _Source(list(range(100)), log), max_rounds=max_rounds)
    assert rounds.learner.version == max_rounds
    assert log.count("push v1") == (max_rounds > 1)
    stopped = _Pairs(0, log)
    drive(stopped, _Source(list(range(100)), log), should_stop=lambda: True)
    assert stopped.learner.version == 1


def test_a_source_that_ends_ends_the_loop_without_a_partial_round() -> None:
    log: list[str] = []
    rounds = _Pairs(0, log)
    drive(rounds, _Source([1, 2, 3], log))
    assert rounds.learner.version == 1
    assert rounds.held == [3]


def test_the_registry_names_each_algorithm_part() -> None:
    from simkit.clients.learners._train import PPOPart
    from simkit.clients.learners._train_sac import SACPart

    assert algorithm("ppo") is PPOPart
    assert algorithm("sac") is SACPart
    assert sorted(ALGORITHMS) == ["ppo", "sac"]
    assert [algorithm(n).name for n in ALGORITHMS] == list(ALGORITHMS)
    with pytest.raises(ValueError, match=r"algo must be one of \['ppo', 'sac'\], got 'dqn'"):
        algorithm("dqn")
