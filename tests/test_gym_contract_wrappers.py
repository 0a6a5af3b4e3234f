"""Gymnasium's vector wrappers over simkit's vectors, bit for bit against the same
wrappers over ``gymnasium.vector.SyncVectorEnv`` of the single envs (docs/vector.md,
"Gymnasium's vector wrappers"): what works in each autoreset mode, and Gymnasium's own
refusal of its observation wrappers under ``SAME_STEP``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import vector as vw

import simkit
import simkit.vector

N, LIMIT, SEEDS = 4, 9, [10, 11, 12, 13]
SINGLE = "simkit/Pendulum-v0"
KINDS: dict[str, Callable[[AutoresetMode], Any]] = {
    "vector": lambda mode: simkit.make_vec(
        SINGLE, N, autoreset_mode=mode, env_kwargs={"max_episode_steps": LIMIT}
    ),
    "batch": lambda mode: simkit.make(
        "simkit/BatchPendulum-v0",
        num_envs=N,
        max_episode_steps=LIMIT,
        autoreset_mode=mode,
        step_infos=True,  # the per-row torque infos a single Pendulum gives
    ),
}
ANY_MODE: dict[str, Callable[[Any], Any]] = {
    "RecordEpisodeStatistics": vw.RecordEpisodeStatistics,
    "NormalizeReward": vw.NormalizeReward,
    "ClipReward": lambda e: vw.ClipReward(e, -1.0, 0.0),
    "ClipAction": vw.ClipAction,
    "RescaleAction": lambda e: vw.RescaleAction(e, -1.0, 1.0),
    "DictInfoToList": vw.DictInfoToList,
}
NEXT_STEP_ONLY: dict[str, Callable[[Any], Any]] = {
    "NormalizeObservation": vw.NormalizeObservation,
    "TransformObservation": lambda e: vw.TransformObservation(e, lambda o: o * 2.0),
    "FlattenObservation": vw.FlattenObservation,
    "DtypeObservation": lambda e: vw.DtypeObservation(e, np.float64),
}


def _tree_equal(a: Any, b: Any, path: str = "") -> None:
    """Bit-exact equality of result trees; an episode's wall-clock time ``t`` aside."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            if key != "t":
                _tree_equal(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), path
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _tree_equal(x, y, f"{path}[{k}]")
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert a.shape == b.shape, path
        for k in range(len(a)):
            _tree_equal(a[k], b[k], f"{path}[{k}]")
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _assert_wrapped_equal(wrap: Callable[[Any], Any], kind: str, mode: AutoresetMode) -> None:
    ours = wrap(KINDS[kind](mode))
    fns = [lambda: simkit.make(SINGLE, max_episode_steps=LIMIT) for _ in range(N)]
    theirs = wrap(SyncVectorEnv(fns, autoreset_mode=mode))
    _tree_equal(ours.reset(seed=SEEDS), theirs.reset(seed=SEEDS), "reset")
    rng = np.random.default_rng(3)
    for t in range(3 * LIMIT):
        actions = rng.uniform(-3.0, 3.0, (N, 1)).astype(np.float32)  # beyond [-2, 2]
        _tree_equal(ours.step(actions), theirs.step(actions), f"step {t}")
    ours.close()
    theirs.close()


@pytest.mark.filterwarnings("ignore:.*precision lowered by casting:UserWarning")  # RescaleAction's
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", sorted(ANY_MODE))
def test_wrappers_of_either_mode_equal_sync_vector_env(
    name: str, kind: str, mode: AutoresetMode
) -> None:
    _assert_wrapped_equal(ANY_MODE[name], kind, mode)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # Box(float64)
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", sorted(NEXT_STEP_ONLY))
def test_observation_wrappers_need_next_step_as_on_sync_vector_env(name: str, kind: str) -> None:
    """Gymnasium's observation wrappers refuse ``SAME_STEP`` (their transform would miss
    ``info["final_obs"]``), on ``SyncVectorEnv`` as on simkit's vectors, whose default
    it is: ``autoreset_mode="NextStep"`` is the whole change, and then they agree."""
    _assert_wrapped_equal(NEXT_STEP_ONLY[name], kind, AutoresetMode.NEXT_STEP)
    for vec in (KINDS[kind](AutoresetMode.SAME_STEP), SyncVectorEnv([lambda: simkit.make(SINGLE)])):
        vec.metadata["autoreset_mode"] = AutoresetMode.SAME_STEP
        with pytest.raises(ValueError, match="autoreset_mode to be NEXT_STEP or DISABLED"):
            NEXT_STEP_ONLY[name](vec)


def _cleanrl_make_env(env_id: str) -> Callable[[], Any]:
    """CleanRL's ``make_env`` (ppo_continuous_action.py): wrappers on each single env."""

    def thunk() -> Any:
        env = gym.make(env_id, max_episode_steps=LIMIT)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(
            env, lambda obs: np.clip(obs, -10, 10), env.observation_space
        )
        env = gym.wrappers.NormalizeReward(env, gamma=0.99)
        return gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))

    return thunk


@pytest.mark.filterwarnings("ignore::UserWarning")  # Gymnasium's own, on both sides
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_cleanrl_env_fns_make_the_vector_sync_vector_env_makes(
    mode: AutoresetMode, num_threads: int
) -> None:
    """A CleanRL script's ``SyncVectorEnv([make_env(...) ...])`` becomes
    ``simkit.vector.VectorEnv([make_env(...) ...])`` and steps the same bits, per-env
    wrappers (statistics, normalization, clipping) and episode infos included."""
    fns = [_cleanrl_make_env(SINGLE) for _ in range(N)]
    ours = simkit.vector.VectorEnv(fns, num_threads=num_threads, autoreset_mode=mode)
    theirs = SyncVectorEnv([_cleanrl_make_env(SINGLE) for _ in range(N)], autoreset_mode=mode)
    _tree_equal(ours.reset(seed=SEEDS), theirs.reset(seed=SEEDS), "reset")
    rng = np.random.default_rng(5)
    for t in range(3 * LIMIT):
        actions = rng.uniform(-3.0, 3.0, (N, 1)).astype(np.float32)
        _tree_equal(ours.step(actions), theirs.step(actions), f"step {t}")
