"""The exact bits of both local vectors, pinned by a committed trace.

Each scenario drives ``VectorEnv`` or ``MultiAgentVectorEnv`` through one of its paths
(the Gymnasium step in every autoreset mode, ``step_batch``, ``send``/``recv``, subset
steps and resets, per-env and whole snapshots, fault isolation, agents leaving) and
records a digest of everything each call returns. ``tests/data/vector_golden.json`` holds
the digests the vectors gave when the trace was written; a refactoring of the vector
core must reproduce them. Pure-Python envs only, so the digests do not depend on a
physics build. Regenerate (only for an intended behaviour change) with
``python tests/test_vector_golden.py --write`` in an interpreter started with
``simkit._kernels.pinned_env()`` (the tests run pinned).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from test_vector_faults import Flaky, FlakyNav

from simkit.snapshot import dumps, loads
from simkit.vector import MultiAgentVectorEnv, VectorEnv

GOLDEN = Path(__file__).parent / "data" / "vector_golden.json"

# The envs' numpy arithmetic rounds differently on AVX-512 and AVX2 paths: the trace is
# of the pinned kernels (tests/pinned_helpers.py), the bits of any x86-64 CPU.
pytestmark = pytest.mark.pinned


def _canon(x: Any) -> Iterator[str]:
    """A canonical token stream of a returned value (arrays by dtype, shape and bytes)."""
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            yield f"O{x.shape}"
            for v in x.ravel():
                yield from _canon(v)
        else:
            yield f"A{x.dtype.str}{x.shape}:{np.ascontiguousarray(x).tobytes().hex()}"
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        yield type(x).__name__
        for f in dataclasses.fields(x):
            yield f.name
            yield from _canon(getattr(x, f.name))
    elif isinstance(x, dict):
        yield "{"
        for k in sorted(x, key=repr):
            yield repr(k)
            yield from _canon(x[k])
        yield "}"
    elif isinstance(x, list | tuple):
        yield f"{type(x).__name__}["
        for v in x:
            yield from _canon(v)
        yield "]"
    elif isinstance(x, BaseException):
        yield f"{type(x).__name__}:{x}"
    elif isinstance(x, float | np.floating):
        yield f"{type(x).__name__}:{float(x).hex()}"
    else:
        yield f"{type(x).__name__}:{x!r}"


class Trace:
    def __init__(self) -> None:
        self.records: list[tuple[str, str]] = []

    def __call__(self, label: str, value: Any) -> None:
        digest = hashlib.sha256("\x00".join(_canon(value)).encode()).hexdigest()[:16]
        self.records.append((label, digest))


def _cartpoles(n: int, **kwargs: Any) -> VectorEnv:
    return VectorEnv("simkit/CartPole-v0", n, env_kwargs={"max_episode_steps": 6}, **kwargs)


def _sa_gym_modes(rec: Trace) -> None:
    for mode in AutoresetMode:
        for threads in (1, 2):
            vec = _cartpoles(4, num_threads=threads, autoreset_mode=mode)
            rng = np.random.default_rng(0)
            tag = f"sa/{mode.name}/t{threads}"
            rec(f"{tag}/reset", vec.reset(seed=5))
            for t in range(16):
                out = vec.step(rng.integers(0, 2, 4))
                rec(f"{tag}/step{t}", out)
                ended = out[2] | out[3]
                if mode is AutoresetMode.DISABLED and ended.any():
                    rec(f"{tag}/mask-reset{t}", vec.reset(options={"reset_mask": ended}))
            rec(f"{tag}/state", vec.get_state())
            vec.close()


def _sa_batch_and_async(rec: Trace) -> None:
    vec = _cartpoles(5, num_threads=2)
    rng = np.random.default_rng(1)
    vec.reset(seed=2)
    rec("sa/batch/reset", vec.reset(seed=[3, None, 7, None, 11]))
    for t in range(14):
        rec(f"sa/batch/step{t}", vec.step_batch(rng.integers(0, 2, 5)))
    snap = loads(dumps(vec.get_state()))
    rec("sa/batch/state", snap)
    other = _cartpoles(5)
    other.reset(seed=0)
    other.set_state(snap)
    for t in range(8):
        actions = rng.integers(0, 2, 5)
        rec(f"sa/batch/restored{t}", (vec.step_batch(actions), other.step_batch(actions)))
    vec.close()
    vec = _cartpoles(4, batch_size=2)
    vec.async_reset(seed=9)
    for t in range(12):
        step = vec.recv()
        rec(f"sa/async/recv{t}", step)
        vec.send(rng.integers(0, 2, len(step.env_ids)), step.env_ids)
    vec.recv()
    vec.recv()
    vec.step_async(rng.integers(0, 2, 4))
    rec("sa/async/wait", vec.step_wait())


def _sa_subsets_and_faults(rec: Trace) -> None:
    vec = _cartpoles(4)
    rng = np.random.default_rng(2)
    vec.reset(seed=4)
    for t in range(10):
        ids = rng.permutation(4)[: 1 + t % 4]
        rec(f"sa/subset/step{t}", vec.step_envs(ids, rng.integers(0, 2, len(ids))))
    params = [{"gravity": 9.5}, None]
    rec("sa/subset/reset", vec.reset_envs(np.array([2, 0]), seed=8, params=params))
    rec("sa/subset/reset-seeds", vec.reset_envs(np.array([3]), seeds=[12]))
    rec("sa/subset/reset-next", vec.reset_envs(np.array([1, 3])))
    states = vec.get_env_states(np.array([0, 1, 2, 3]))
    rec("sa/subset/env-states", states)
    before = vec.step_envs(np.arange(4), np.ones(4, dtype=np.int64))
    vec.set_env_states(np.array([1, 2]), loads(dumps(states[1:3])))
    rec("sa/subset/after-set", (before, vec.step_envs(np.arange(4), np.ones(4, dtype=np.int64))))
    vec = VectorEnv([Flaky for _ in range(3)], isolate_faults=True, num_threads=2)
    rec("sa/faults/reset", vec.reset(seed=6))
    for t in range(6):
        actions = np.zeros((3, 1), dtype=np.float32)
        actions[t % 3] = 1.0
        if t == 3:
            vec.envs[0].unwrapped.fail_reset = True  # type: ignore[attr-defined]
        rec(f"sa/faults/step{t}", vec.step_envs(np.arange(3), actions))
    vec.envs[0].unwrapped.fail_reset = False  # type: ignore[attr-defined]
    rec("sa/faults/reset-env", vec.reset_envs(np.array([0])))
    rec("sa/faults/after", vec.step_envs(np.arange(3), np.zeros((3, 1), dtype=np.float32)))
    vec.close()


def _ma_steps(rec: Trace) -> None:
    vec = MultiAgentVectorEnv("simkit/GoalNav-v0", 3, env_kwargs={"max_episode_steps": 9})
    rng = np.random.default_rng(3)
    vec.reset(seed=2)
    rec("ma/reset", vec.reset(seed=[1, None, 4]))
    for t in range(30):
        if t == 12:
            snap = loads(dumps(vec.get_state()))
            rec("ma/state", snap)
        actions = rng.uniform(-1, 1, (vec.num_rows, 2)).astype(np.float32)
        rec(f"ma/step{t}", vec.step(actions))
    other = MultiAgentVectorEnv("simkit/GoalNav-v0", 3, env_kwargs={"max_episode_steps": 9})
    other.reset(seed=0)
    other.set_state(snap)
    rec("ma/restored", other.step(np.full((other.num_rows, 2), 0.5, dtype=np.float32)))
    for t in range(6):
        ids = rng.permutation(3)[: 1 + t % 3]
        actions = rng.uniform(-1, 1, (len(ids) * vec.num_agents, 2)).astype(np.float32)
        rec(f"ma/subset{t}", vec.step_envs(ids, actions))
    rec(
        "ma/reset-envs",
        vec.reset_envs(np.array([2, 0]), seed=5, params=[{"arena_size": 2.2}, None]),
    )
    rec("ma/reset-seeds", vec.reset_envs(np.array([1]), seeds=[13]))
    states = vec.get_env_states(np.arange(3))
    rec("ma/env-states", states)
    vec.step(np.zeros((vec.num_rows, 2), dtype=np.float32))
    vec.set_env_states(np.array([0, 2]), loads(dumps([states[0], states[2]])))
    rec("ma/after-set", vec.step(np.zeros((vec.num_rows, 2), dtype=np.float32)))


def _ma_faults(rec: Trace) -> None:
    vec = MultiAgentVectorEnv([FlakyNav, FlakyNav, FlakyNav], isolate_faults=True)
    rec("ma/faults/reset", vec.reset(seed=7))
    for t in range(7):
        actions = np.zeros((vec.num_rows, 2), dtype=np.float32)
        actions[vec.row(t % 3, "agent_0")] = [1.0, 0.0]
        if t == 4:
            broken = vec.envs[1]
            broken.reset = _raise  # type: ignore[method-assign]
        rec(f"ma/faults/step{t}", vec.step_envs(np.arange(3), actions))
    del broken.reset
    rec("ma/faults/reset-env", vec.reset_envs(np.array([1])))
    rec("ma/faults/after", vec.step_envs(np.arange(3), np.zeros((9, 2), dtype=np.float32)))


def _raise(*args: Any, **kwargs: Any) -> Any:
    raise OSError("reset broke")


SCENARIOS: list[Callable[[Trace], None]] = [
    _sa_gym_modes,
    _sa_batch_and_async,
    _sa_subsets_and_faults,
    _ma_steps,
    _ma_faults,
]


def _trace(scenario: Callable[[Trace], None]) -> list[tuple[str, str]]:
    rec = Trace()
    scenario(rec)
    return rec.records


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__.strip("_"))
def test_vector_bits_match_the_committed_trace(scenario: Callable[[Trace], None]) -> None:
    expected = json.loads(GOLDEN.read_text())[scenario.__name__]
    got = _trace(scenario)
    assert [label for label, _ in got] == [label for label, _ in expected]
    for (label, digest), (_, want) in zip(got, expected, strict=True):
        assert digest == want, f"{label}: the vector returned other bits than the trace"


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.write_text(json.dumps({s.__name__: _trace(s) for s in SCENARIOS}, indent=0) + "\n")
