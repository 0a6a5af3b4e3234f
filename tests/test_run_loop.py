"""The run's toolbox (``clients/learners/_run.py``) as an algorithm's ``learn`` uses it, with
a toy algorithm (no env, no torch model), and the algorithm registry."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from simkit.clients.learners._args import RunOptions
from simkit.clients.learners._run import ALGORITHMS, Run, learner_of
from simkit.clients.learners._sources import Rollout


@dataclass
class _Learner:
    model: Any = "weights"
    version: int = 0
    global_step: int = 0


class _Source:
    """Yields ``items`` (ints are fragments, ``None`` says the source changed)."""

    def __init__(self, items: list[int | None], log: list[str]) -> None:
        self.items = items
        self.log = log
        self.num_rows = 1
        self.not_exact = None

    def fragments(self) -> Iterator[int | None]:
        yield from self.items

    def push_weights(self, model: Any, *, version: int | None = None) -> int:
        self.log.append(f"push v{version}")
        return 0

    def close(self) -> None:
        self.log.append("close")


def _pairs(run: Run, items: list[int | None], total: int, log: list[str]) -> list[int]:
    """A toy ``learn``: a round is two fragments, ``total`` env steps in all (0: until
    stopped), a checkpoint due at every boundary. Returns what it held at the end."""
    learner = _Learner()
    run.rollout = Rollout(_Source(items, log))  # type: ignore[arg-type]
    run.checkpoint = lambda: log.append("checkpoint")  # type: ignore[assignment,method-assign,return-value]
    held: list[int] = []

    def take(fragment: Any) -> None:
        log.append(f"take {fragment}")
        if fragment is not None:
            held.append(fragment)

    with run.session(learner, env_id="toy", total=total, checkpoint=dict, policy=lambda: ({}, {})):
        while run.pull(lambda: len(held) >= 2, take):
            learner.global_step += len(held)
            learner.version += 1
            held.clear()
            log.append(f"update -> v{learner.version}")
            last = run.stopping(finished=bool(total and learner.global_step >= total))
            if not last:
                run.boundary(due=True)
            run.end_round([])
            log.append(f"round v{learner.version} last={last}")
            if last:
                break
    return held


def _run(tmp_path: Path, **options: Any) -> Run:
    return Run(
        RunOptions(logdir=tmp_path, tensorboard=False, **options), algo="toy", round_name="round"
    )


def test_a_round_checkpoints_then_pushes_and_the_last_round_pushes_nothing(tmp_path: Path) -> None:
    log: list[str] = []
    _pairs(_run(tmp_path), [1, None, 2, 3, 4, 5], 4, log)
    assert log == [
        "push v0",  # the first weights
        "take 1",
        "take None",  # the source changed: the loop asks again whether a round is ready
        "take 2",
        "update -> v1",
        "checkpoint",
        "push v1",
        "round v1 last=False",
        "take 3",
        "take 4",
        "update -> v2",
        "round v2 last=True",  # finished: its weights would be used by nobody
        "checkpoint",  # at the end, at that boundary
        "close",
    ]


@pytest.mark.parametrize("max_rounds", [1, 2])
def test_max_rounds_and_a_stop_request_end_the_loop_after_a_round(
    tmp_path: Path, max_rounds: int
) -> None:
    log: list[str] = []
    _pairs(_run(tmp_path, max_rounds=max_rounds), list(range(100)), 0, log)
    assert log.count("update -> v1") == 1
    assert log.count(f"update -> v{max_rounds + 1}") == 0
    assert log.count("push v1") == (max_rounds > 1)
    stopped = _run(tmp_path)
    stopped.stop.requested = True
    log.clear()
    _pairs(stopped, list(range(100)), 0, log)
    assert [line for line in log if line.startswith("update")] == ["update -> v1"]


def test_a_source_that_ends_ends_the_loop_without_a_partial_round(tmp_path: Path) -> None:
    log: list[str] = []
    held = _pairs(_run(tmp_path), [1, 2, 3], 0, log)
    assert [line for line in log if line.startswith("update")] == ["update -> v1"]
    assert held == [3]
    assert log[-2:] == ["checkpoint", "close"]


def test_the_registry_names_each_algorithms_learn() -> None:
    from simkit.clients.learners import ppo, sac

    assert learner_of("ppo") is ppo.learn
    assert learner_of("sac") is sac.learn
    assert sorted(ALGORITHMS) == ["ppo", "sac"]
    with pytest.raises(ValueError, match=r"algo must be one of \['ppo', 'sac'\], got 'dqn'"):
        learner_of("dqn")


def test_a_learner_that_cannot_restore_closes_the_open_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between opening the source and the session (the learner built and restored, the
    rollout state restored), an error closes what was opened: local servers would
    otherwise keep running and a recorder keep its lock."""
    import simkit
    from simkit.clients.learners import ppo
    from simkit.clients.learners._sources import LocalSource
    from simkit.errors import InvalidCheckpoint

    tiny = {"num_envs": 2, "num_steps": 16, "num_minibatches": 2, "update_epochs": 1}
    simkit.train("simkit/CartPole-v0", total_steps=32, logdir=tmp_path, servers=0, **tiny)
    closed: list[bool] = []
    close = LocalSource.close

    def closing(self: LocalSource) -> None:
        closed.append(True)
        close(self)

    def broken(learner: Any, ckpt: Any) -> None:
        raise InvalidCheckpoint(f"{ckpt.path}: cannot restore the learner: broken")

    monkeypatch.setattr(LocalSource, "close", closing)
    monkeypatch.setattr(ppo, "_restore", broken)
    with pytest.raises(InvalidCheckpoint, match="broken"):
        simkit.train("simkit/CartPole-v0", total_steps=64, resume=tmp_path, servers=0, **tiny)
    assert closed == [True]
