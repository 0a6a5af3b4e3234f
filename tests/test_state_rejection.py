"""Rejected snapshots change nothing, and state attributes are checked by type, dtype, shape.

Regression tests for issue 9's bugs 1 and 3: a snapshot whose author data is rejected must
leave an ``Env``, ``MultiAgentEnv``, ``MujocoEnv``, ``BatchEnv`` and both vectors exactly
as they were, and a ``state_attributes`` value of the wrong type, dtype or shape must be
refused with ``InvalidState`` naming the attribute instead of planting a broken env.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

import simkit
from simkit._state import check_observation
from simkit.errors import InvalidState
from simkit.snapshot import states_equal
from simkit.vector import MultiAgentVectorEnv, VectorEnv

CARTPOLE = "simkit/CartPole-v0"


def _cartpole_after(steps: int) -> Any:
    env = simkit.make(CARTPOLE)
    env.reset(seed=1)
    for _ in range(steps):
        env.step(1)
    return env


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("garbage", r"'state' must be a float64 array of shape \(4,\), got str"),
        (
            np.zeros(4, dtype=np.float32),
            r"'state' must be a float64 array of shape \(4,\), got float32 array of shape \(4,\)",
        ),
        (
            np.zeros(3),
            r"'state' must be a float64 array of shape \(4,\), got float64 array of shape \(3,\)",
        ),
        ([0.0, 0.0, 0.0, 0.0], r"'state' must be a float64 array of shape \(4,\), got list"),
    ],
)
def test_state_attribute_checked_against_current_value(bad: Any, match: str) -> None:
    env = _cartpole_after(3)
    before = env.unwrapped.get_state()
    state = copy.deepcopy(before)
    state["data"]["state"] = bad
    with pytest.raises(InvalidState, match=match):
        env.unwrapped.set_state(state)
    assert states_equal(env.unwrapped.get_state(), before)
    env.step(0)


def test_scalar_state_attribute_checked_by_type() -> None:
    class Counter(simkit.Env[np.ndarray, int]):
        state_attributes = ("count", "label")

        def __init__(self) -> None:
            super().__init__()
            self.observation_space = spaces.Box(0, 100, (1,), np.float32)
            self.action_space = spaces.Discrete(2)
            self.count = 0
            self.label = "x"

        def reset_episode(self, rng: Any, params: Any, options: Any) -> Any:
            self.count = 0
            return np.zeros(1, np.float32), {}

        def step_episode(self, action: int, rng: Any) -> Any:
            self.count += 1
            return np.full(1, self.count, np.float32), 0.0, False, {}

    env = Counter()
    env.reset(seed=0)
    env.step(1)
    state = env.get_state()
    state["data"]["count"] = 2.5
    with pytest.raises(InvalidState, match=r"'count' must be an int, got float"):
        env.set_state(state)
    state["data"]["count"] = True
    with pytest.raises(InvalidState, match=r"'count' must be an int, got bool"):
        env.set_state(state)
    state["data"]["count"] = np.int64(5)
    env.set_state(state)
    assert env.count == 5


class TuplePosition(simkit.Env[np.ndarray, int]):
    """Keeps its state attribute as a tuple."""

    max_episode_steps = 20
    state_attributes = ("pos",)

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = spaces.Discrete(2)
        self.pos = (0.0, 0.0)

    def reset_episode(self, rng: Any, params: Any, options: Any) -> Any:
        self.pos = (float(rng.uniform()), 0.0)
        return np.array(self.pos), {}

    def step_episode(self, action: int, rng: Any) -> Any:
        self.pos = (self.pos[0] + action, self.pos[1] + 1.0)
        return np.array(self.pos), 0.0, False, {}


def test_a_tuple_state_attribute_restores_from_its_round_tripped_snapshot() -> None:
    """msgpack has no tuple: ``loads(dumps(get_state()))`` holds a list, which
    ``set_state`` refused ("must be a tuple, got list"), so the env failed the kit on its
    own snapshot. The list a snapshot makes of a tuple restores as the tuple."""
    from simkit import snapshot, testing

    env = TuplePosition()
    env.reset(seed=0)
    env.step(1)
    state = snapshot.loads(snapshot.dumps(env.get_state()))
    env.step(0)
    env.set_state(state)
    assert env.pos == (state["data"]["pos"][0], state["data"]["pos"][1])
    assert type(env.pos) is tuple
    state["data"]["pos"] = "xy"
    with pytest.raises(InvalidState, match=r"'pos' must be a tuple \(or the list a snapshot"):
        env.set_state(state)
    testing.check_env(TuplePosition, steps=20)


def test_rejected_mujoco_extra_state_leaves_physics() -> None:
    env = simkit.make("simkit/Cheetah-v0")
    env.reset(seed=2)
    for _ in range(3):
        env.step(env.action_space.sample())
    before = env.unwrapped.get_state()
    other = simkit.make("simkit/Cheetah-v0")
    other.reset(seed=9)
    state = other.unwrapped.get_state()
    state["data"]["extra"] = {"not_an_attribute": 1}
    with pytest.raises(InvalidState, match="state must hold"):
        env.unwrapped.set_state(state)
    assert states_equal(env.unwrapped.get_state(), before)


def test_rejected_batch_snapshot_leaves_counters_and_seeds() -> None:
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=4)
    env.reset(seed=3)
    for _ in range(3):
        env.step(np.ones(4, dtype=np.int64))
    assert env.elapsed_steps.tolist() == [3, 3, 3, 3]
    before = env.get_state()
    other = simkit.make("simkit/BatchCartPole-v0", num_envs=4)
    other.reset(seed=7)
    state = other.get_state()
    state["data"]["state"] = "garbage"
    with pytest.raises(InvalidState, match=r"'state' must be a float64 array of shape \(4, 4\)"):
        env.set_state(state)
    assert env.elapsed_steps.tolist() == [3, 3, 3, 3]
    assert states_equal(env.get_state(), before)


def test_rejected_vector_snapshot_leaves_earlier_envs() -> None:
    v = VectorEnv(CARTPOLE, 3)
    v.reset(seed=5)
    v.step(np.ones(3, dtype=np.int64))
    before = v.get_state()
    other = VectorEnv(CARTPOLE, 3)
    other.reset(seed=6)
    state = other.get_state()
    state["envs"][2]["data"]["state"] = np.zeros(2)
    with pytest.raises(InvalidState, match="'state' must be"):
        v.set_state(state)
    assert states_equal(v.get_state(), before)
    v.close()
    other.close()


def test_rejected_multi_agent_vector_snapshot_leaves_earlier_envs() -> None:
    kw = {"n_agents": 2}
    v = MultiAgentVectorEnv("simkit/GoalNav-v0", num_envs=3, env_kwargs=kw)
    v.reset(seed=5)
    v.step(np.zeros((6, 2), dtype=np.float32))
    before = v.get_state()
    other = MultiAgentVectorEnv("simkit/GoalNav-v0", num_envs=3, env_kwargs=kw)
    other.reset(seed=6)
    state = other.get_state()
    state["envs"][2]["data"]["pos"] = "garbage"
    with pytest.raises(InvalidState, match="'pos' must be"):
        v.set_state(state)
    assert states_equal(v.get_state(), before)


# ------------------------------------------------------------- every kind, hypothesis


def _single(env_id: str) -> tuple[Any, Callable[[Any], Any]]:
    env = simkit.make(env_id).unwrapped
    return env, lambda rng: env.action_space.sample()


def _make_kind(kind: str) -> tuple[Any, Callable[[np.random.Generator], Any]]:
    if kind == "env":
        env = simkit.make(CARTPOLE).unwrapped
        return env, lambda rng: int(rng.integers(2))
    if kind == "mujoco":
        env = simkit.make("simkit/Reacher-v0").unwrapped
        return env, lambda rng: rng.uniform(-1, 1, 2).astype(np.float32)
    if kind == "multi_agent":
        env = simkit.make("simkit/GoalNav-v0", n_agents=2)
        return env, lambda rng: {a: rng.uniform(-1, 1, 2).astype(np.float32) for a in env.agents}
    if kind == "batch":
        env = simkit.make("simkit/BatchCartPole-v0", num_envs=3)
        return env, lambda rng: rng.integers(2, size=3)
    if kind == "batch_mujoco":
        env = simkit.make("simkit/BatchCheetah-v0", num_envs=2)
        return env, lambda rng: rng.uniform(-1, 1, (2, 6)).astype(np.float32)
    if kind == "vector":
        env = VectorEnv(CARTPOLE, 2)
        return env, lambda rng: rng.integers(2, size=2)
    env = MultiAgentVectorEnv("simkit/GoalNav-v0", num_envs=2, env_kwargs={"n_agents": 2})
    return env, lambda rng: rng.uniform(-1, 1, (4, 2)).astype(np.float32)


def _leaves(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in _leaves(v, (*path, k))]
    if isinstance(tree, list) and tree and isinstance(tree[0], dict):
        return [p for i, v in enumerate(tree) for p in _leaves(v, (*path, i))]
    return [path]


def _data_leaves(state: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [p for p in _leaves(state) if "data" in p]


def _set(tree: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


_CORRUPTIONS: dict[str, Callable[[Any], Any]] = {
    "string": lambda v: "garbage",
    "none": lambda v: None,
    "wrong_dtype": lambda v: (
        np.asarray(v).astype(np.float32)
        if np.asarray(v).dtype != np.float32
        else np.asarray(v).astype(np.float64)
    ),
    "wrong_shape": lambda v: np.zeros((*np.shape(v), 2)),
    "list": lambda v: np.asarray(v).tolist() if np.ndim(v) else [v],
}


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(
        ["env", "mujoco", "multi_agent", "batch", "batch_mujoco", "vector", "ma_vector"]
    ),
    steps=st.integers(0, 4),
    corruption=st.sampled_from(sorted(_CORRUPTIONS)),
    pick=st.integers(0, 1000),
    seed=st.integers(0, 2**16),
)
def test_rejected_snapshots_leave_every_kind_bit_identical(
    kind: str, steps: int, corruption: str, pick: int, seed: int
) -> None:
    env, act = _make_kind(kind)
    twin, _ = _make_kind(kind)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    twin.reset(seed=seed)
    for _ in range(steps):
        a = act(rng)
        for e in (env, twin):
            if kind == "multi_agent" and not e.agents:
                e.reset(seed=seed + 1)
            e.step(copy.deepcopy(a))
    before = env.get_state()
    donor, _ = _make_kind(kind)
    donor.reset(seed=seed + 1)
    state = donor.get_state()
    leaves = [p for p in _data_leaves(state) if not isinstance(_get(state, p), dict)]
    path = leaves[pick % len(leaves)]
    _set(state, path, _CORRUPTIONS[corruption](_get(state, path)))
    with pytest.raises(InvalidState):
        env.set_state(state)
    assert states_equal(env.get_state(), before)
    a = act(rng)
    if kind == "multi_agent" and not env.agents:
        return
    out, twin_out = env.step(copy.deepcopy(a)), twin.step(copy.deepcopy(a))
    assert states_equal(
        simkit.snapshot.to_plain(_plain(out)), simkit.snapshot.to_plain(_plain(twin_out))
    )


def _plain(x: Any) -> Any:
    if hasattr(x, "__dataclass_fields__"):
        return {k: _plain(getattr(x, k)) for k in x.__dataclass_fields__}
    if isinstance(x, tuple | list):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, np.generic):
        return x.item()
    return x


_OBS_SPACE = spaces.Dict(
    {
        "pos": spaces.Box(-1, 1, shape=(2,), dtype=np.float32),
        "pair": spaces.Tuple((spaces.Discrete(3, start=1), spaces.MultiBinary(2))),
    }
)


@pytest.mark.parametrize(
    ("value", "rows", "match"),
    [
        ({"pos": np.zeros(2, np.float32)}, None, r"obs must be a dict of keys \['pair', 'pos'\]"),
        (
            {"pos": np.zeros(2, np.float64), "pair": (1, np.zeros(2, np.int8))},
            None,
            r"obs\['pos'\] must be a float32 array of shape \(2,\), got float64",
        ),
        (
            {"pos": np.zeros(2, np.float32), "pair": [1]},
            None,
            r"obs\['pair'\] must be a tuple of 2 entries, got 1 entries",
        ),
        (
            {"pos": np.zeros(2, np.float32), "pair": (0, np.zeros(2, np.int8))},
            None,
            r"obs\['pair'\]\[0\] must be an int in \[1, 4\), got 0",
        ),
        (
            {"pos": np.zeros((3, 2), np.float32), "pair": (np.ones(3, np.int64), "x")},
            3,
            r"obs\['pair'\]\[1\] must be a int8 array of shape \(3, 2\), got str",
        ),
    ],
)
def test_a_snapshot_observation_must_fit_the_space(value: Any, rows: Any, match: str) -> None:
    with pytest.raises(InvalidState, match=match):
        check_observation(_OBS_SPACE, value, "obs", rows)


def test_snapshot_observations_that_fit_pass() -> None:
    check_observation(
        _OBS_SPACE, {"pos": np.zeros(2, np.float32), "pair": [2, np.ones(2, np.int8)]}, "obs"
    )
    batch = {
        "pos": np.zeros((3, 2), np.float32),
        "pair": (np.ones(3, np.int64), np.ones((3, 2), np.int8)),
    }
    check_observation(_OBS_SPACE, batch, "obs", rows=3)


def _vector_of_cartpoles() -> Any:
    envs = VectorEnv(CARTPOLE, 2)
    envs.reset(seed=0)
    return envs


def _batch_of_cartpoles() -> Any:
    batch = simkit.make("simkit/BatchCartPole-v0", num_envs=2)
    batch.reset(seed=0)
    return batch


@pytest.mark.parametrize(
    ("make", "key", "match"),
    [
        (lambda: _cartpole_after(2), "format", "state format must be 1"),
        (lambda: _cartpole_after(2), "env", "state belongs to env"),
        (_batch_of_cartpoles, "format", "state format must be 1"),
        (_batch_of_cartpoles, "env", "state belongs to env"),
        (_batch_of_cartpoles, "num_envs", "state holds array"),
        (_vector_of_cartpoles, "format", "state format must be 1"),
        (_vector_of_cartpoles, "num_envs", "state holds array"),
    ],
)
@pytest.mark.parametrize("value", [np.array([1, 1]), np.array(["a", "b"]), np.array([])])
def test_an_array_as_a_snapshots_tag_is_invalid_state(
    make: Callable[[], Any], key: str, match: str, value: np.ndarray
) -> None:
    """A snapshot (a peer's, a file's) whose ``format``, ``env`` or ``num_envs`` is an
    array is ``InvalidState`` naming the field, not numpy's "truth value of an array
    with more than one element is ambiguous" (an empty array passed as the tag)."""
    env = make()
    state = env.get_state()
    before = copy.deepcopy(state)
    state[key] = value
    with pytest.raises(InvalidState, match=match):
        env.set_state(state)
    assert states_equal(env.get_state(), before)
