"""The batch conformance kit: every shipped batch env passes it, and a small author batch
env with each of five planted bugs fails it with the right first message."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import Phase, settings

import simkit
from simkit import cli, testing
from simkit.errors import ConformanceError, InvalidState
from simkit.randomization import Params


class Point(simkit.Env[np.ndarray, np.ndarray]):
    """One point in the plane pushed by the action, under a randomized drag."""

    max_episode_steps = 50
    randomization = {"drag": simkit.Uniform(0.0, 0.2)}
    state_attributes = ("pos", "vel")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.pos = np.zeros(2)
        self.vel = np.zeros(2)

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.pos = rng.uniform(-1.0, 1.0, 2)
        self.vel = np.zeros(2)
        return np.concatenate([self.pos, self.vel]), {}

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        self.vel = self.vel * (1.0 - self._params["drag"]) + 0.1 * action
        self.pos = self.pos + 0.1 * self.vel
        distance = np.linalg.norm(self.pos)
        return np.concatenate([self.pos, self.vel]), float(-distance), bool(distance > 2.0), {}


class BatchPoint(simkit.BatchEnv):
    """N points: instance i is ``Point`` reset with ``episode_seed(root, i, k)``."""

    max_episode_steps = 50
    randomization = Point.randomization
    state_attributes = ("pos", "vel")
    single_env = Point

    def __init__(self, num_envs: int = 4, **kwargs: Any) -> None:
        box = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        obs = spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float64)
        super().__init__(num_envs, single_observation_space=obs, single_action_space=box, **kwargs)
        self.pos = np.zeros((num_envs, 2))
        self.vel = np.zeros((num_envs, 2))

    def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
        self.pos[ids] = rngs.uniform(-1.0, 1.0, (2,))
        self.vel[ids] = 0.0
        return np.concatenate([self.pos[ids], self.vel[ids]], axis=1), None

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        drag = self.param_arrays["drag"][:, None]
        self.vel = self.vel * (1.0 - drag) + 0.1 * actions
        self.pos = self.pos + 0.1 * self.vel
        distance = self.distance()
        obs = np.concatenate([self.pos, self.vel], axis=1)
        return obs, -distance, distance > 2.0, None

    def distance(self) -> np.ndarray:
        """Each row's ``np.linalg.norm(pos)``: the row-wise dot, as the 1-D norm does."""
        return np.sqrt(np.vecdot(self.pos, self.pos))


class GlobalRngPoint(BatchPoint):
    """Planted bug: a little noise from the global numpy RNG."""

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        noise = np.random.normal(0.0, 1e-3, size=actions.shape)  # noqa: NPY002 (the bug)
        return super().step_instances(actions + noise, rngs)


class ClockPoint(BatchPoint):
    """Planted bug: the start position depends on the clock."""

    def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
        obs, infos = super().reset_instances(ids, rngs, params, options)
        self.pos[ids] += 1e-9 * (time.perf_counter_ns() % 997)
        return obs, infos


class NormPoint(BatchPoint):
    """Planted bug: the batched reduction, not the single env's per-instance one."""

    def distance(self) -> np.ndarray:
        return np.linalg.norm(self.pos, axis=1)


class HashSeedPoint(BatchPoint):
    """Planted bug: a pull from a generator seeded with ``hash`` of a str, which follows
    the process's hash seed (the same in one process, so only another one shows it)."""

    single_env = None

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        pull = np.random.default_rng(abs(hash("pull"))).normal(0.0, 1e-3)
        return super().step_instances(actions + pull, rngs)


class SnapshotPoint(BatchPoint):
    """Planted bug: the velocity is not in the snapshot."""

    state_attributes = ("pos",)


class LeakyPoint(BatchPoint):
    """Planted bug: a reset keeps the previous episode's velocity."""

    def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
        self.pos[ids] = rngs.uniform(-1.0, 1.0, (2,))
        return np.concatenate([self.pos[ids], self.vel[ids]], axis=1), None


class SubsetPoint(BatchPoint):
    """A correct ``step_subset``: only the rows ``ids`` move."""

    def step_subset(self, ids: Any, actions: Any, rngs: Any) -> Any:
        drag = self.param_arrays["drag"][ids][:, None]
        vel = self.vel[ids] * (1.0 - drag) + 0.1 * actions
        pos = self.pos[ids] + 0.1 * vel
        self.vel[ids], self.pos[ids] = vel, pos
        distance = np.sqrt(np.vecdot(pos, pos))
        return np.concatenate([pos, vel], axis=1), -distance, distance > 2.0, None


class SubsetBugPoint(SubsetPoint):
    """Planted bug: the subset step reads every row's drag, not the stepped rows'."""

    def step_subset(self, ids: Any, actions: Any, rngs: Any) -> Any:
        drag = self.param_arrays["drag"][: len(ids)][:, None]
        vel = self.vel[ids] * (1.0 - drag) + 0.1 * actions
        pos = self.pos[ids] + 0.1 * vel
        self.vel[ids], self.pos[ids] = vel, pos
        distance = np.sqrt(np.vecdot(pos, pos))
        return np.concatenate([pos, vel], axis=1), -distance, distance > 2.0, None


class Float32Point(BatchPoint):
    """Planted bug: float32 observations for a float64 space (Space.contains accepts
    them; the batch then refuses its own snapshot)."""

    def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
        obs, infos = super().reset_instances(ids, rngs, params, options)
        return obs.astype(np.float32), infos

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        obs, *rest = super().step_instances(actions, rngs)
        return (obs.astype(np.float32), *rest)


class NumpyScalarPoint(BatchPoint):
    """Planted bug: a numpy scalar in the state (it comes back a Python int)."""

    steps_taken: Any = 0

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        self.steps_taken = np.int64(self.steps_taken + 1)
        return super().step_instances(actions, rngs)

    def get_env_state(self) -> dict[str, Any]:
        return {**super().get_env_state(), "steps_taken": self.steps_taken}

    def set_env_state(self, state: Any) -> None:
        super().set_env_state({k: v for k, v in state.items() if k != "steps_taken"})
        self.steps_taken = state["steps_taken"]


def first_failure(env: Any, **kwargs: Any) -> testing.CheckResult:
    results = testing.run_checks(testing.BATCH_CHECKS, env, seed=3, steps=60, **kwargs)
    return next(r for r in results if r.status == "FAIL")


BATCH_IDS = [
    i for i in simkit.env_ids(simkit.EnvKind.BATCH) if not i.startswith(("test/", "simkit-test/"))
]
TORCH = ["simkit/BatchCartPole-v0", "simkit/BatchPendulum-v0"]


def test_a_correct_author_batch_passes_and_says_what_it_skipped() -> None:
    results = testing.run_checks(testing.BATCH_CHECKS, SubsetPoint, seed=1, steps=60)
    assert [r.status for r in results] == ["PASS"] * 7 + ["SKIP", "PASS", "PASS"]
    assert results[7].name == "check_batch_device"
    skipped = testing.run_checks([testing.check_batch_subsets], BatchPoint)[0]
    assert skipped.status == "SKIP"
    assert "BatchPoint has no step_subset" in skipped.message
    testing.check_batch_env(BatchPoint, seed=2, steps=40, num_envs=3)


@pytest.mark.parametrize(
    ("env", "check", "words"),
    [
        (GlobalRngPoint, "check_batch_determinism", "the batch draws from a global RNG"),
        (ClockPoint, "check_batch_determinism", "so the cause is not the global RNG: the clock"),
        (NormPoint, "check_batch_singles", "np.linalg.norm(d) vs np.linalg.norm(d, axis=1)"),
        (SnapshotPoint, "check_batch_snapshot", "the snapshot is incomplete"),
        (HashSeedPoint, "check_batch_other_process", "PYTHONHASHSEED=1"),
        (LeakyPoint, "check_batch_reset_reuse", "leaves state of the previous episode"),
        (SubsetBugPoint, "check_batch_subsets", "self.param_arrays[name][ids]"),
        (
            Float32Point,
            "check_batch_spaces",
            "spaces: observations at reset must be a float64 array of shape (4, 4), got "
            "float32 array of shape (4, 4); return observations of exactly the space's dtype",
        ),
        (
            NumpyScalarPoint,
            "check_batch_snapshot",
            "snapshot: get_state()['data']['steps_taken']: numpy int64 ",
        ),
    ],
    ids=lambda x: x.__name__ if isinstance(x, type) else None,
)
def test_each_planted_bug_fails_first_with_its_message(env: type, check: str, words: str) -> None:
    failure = first_failure(env)
    assert failure.name == check
    assert words in failure.message
    assert "[probably follows" not in failure.message


def test_the_batch_refuses_its_own_snapshot_of_float32_observations() -> None:
    # What check_batch_spaces guards: the rule the batch's restore applies.
    batch = Float32Point(num_envs=2)
    batch.reset(seed=0)
    with pytest.raises(InvalidState, match=r"state\['obs'\] must be a float64 array"):
        batch.set_state(batch.get_state())
    with pytest.raises(ConformanceError, match=r"at step #\d+ final_obs must be a float64"):
        testing.check_batch_spaces(FinalFloat32Point, seed=3, steps=60)


class FinalFloat32Point(BatchPoint):
    """Planted bug: float64 observations but float32 final observations."""

    def step_batch(self, actions: Any, env_ids: Any = None) -> Any:
        res = super().step_batch(actions, env_ids)
        return dataclasses.replace(res, final_obs=res.final_obs.astype(np.float32))


def test_the_singles_message_names_instance_step_element_and_both_values() -> None:
    with pytest.raises(ConformanceError) as caught:
        testing.check_batch_singles(NormPoint, seed=3, steps=60)
    message = str(caught.value)
    assert message.startswith(
        "batch == singles (instance 0 vs Point reset with episode_seed(3, 0, k)): "
    )
    detail = message.split(": ", 1)[1]
    assert detail.split(" ")[0] in ("reward", "terminated")
    assert " of instance 0 differs at step #" in detail
    assert "(batch -" in detail
    assert " vs single -" in detail
    assert "1 ulp apart" in detail


def test_later_failures_say_they_follow_from_the_first() -> None:
    results = testing.run_checks(testing.BATCH_CHECKS, GlobalRngPoint, seed=3, steps=60)
    failed = [r for r in results if r.status == "FAIL"]
    assert failed[0].name == "check_batch_determinism"
    assert len(failed) >= 3
    for later in failed[1:]:
        assert "[probably follows from check_batch_determinism, which failed first: " in (
            later.message
        )


def test_a_non_batch_factory_is_refused() -> None:
    with pytest.raises(TypeError, match=r"must build a simkit\.BatchEnv, got Point"):
        testing.check_batch_determinism(lambda num_envs: Point())


@pytest.mark.parametrize("env_id", BATCH_IDS)
@pytest.mark.parametrize("check", testing.BATCH_CHECKS, ids=lambda c: c.__name__)
def test_every_shipped_batch_env_passes_the_kit(env_id: str, check: Any) -> None:
    try:
        check(env_id, seed=3, steps=40, num_envs=3)
    except testing.CheckNotApplicable:
        assert check is testing.check_batch_device  # a numpy batch: no device to compare


@pytest.mark.parametrize("env_id", TORCH)
@pytest.mark.parametrize("check", testing.BATCH_CHECKS, ids=lambda c: c.__name__)
def test_every_shipped_torch_batch_passes_the_kit_on_the_cpu(env_id: str, check: Any) -> None:
    pytest.importorskip("torch")
    try:
        check(env_id, seed=3, steps=40, num_envs=3, device="cpu")
    except testing.CheckNotApplicable:
        assert check is testing.check_batch_singles


@pytest.mark.parametrize("env_id", [*BATCH_IDS, "torch"])
def test_every_shipped_batch_env_passes_the_property_test(env_id: str) -> None:
    if env_id == "torch":
        pytest.importorskip("torch")
        testing.batch_property_test(TORCH[1], max_actions=20, max_envs=3, device="cpu")()
        return
    testing.batch_property_test(env_id, max_actions=30, max_envs=3)()


class AliasingPoint(BatchPoint):
    """Planted bug: the snapshot holds a live array that steps rewrite in place."""

    def __init__(self, num_envs: int = 4, **kwargs: Any) -> None:
        super().__init__(num_envs, **kwargs)
        self.steps_seen = np.zeros(num_envs)

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        self.steps_seen += 1.0
        return super().step_instances(actions, rngs)

    def get_env_state(self) -> dict[str, Any]:
        return {**super().get_env_state(), "steps_seen": self.steps_seen}

    def set_env_state(self, state: Any) -> None:
        super().set_env_state({k: v for k, v in state.items() if k != "steps_seen"})
        self.steps_seen = np.array(state["steps_seen"])


class KeepingPoint(AliasingPoint):
    """Planted bug: the restore keeps the snapshot's array, which steps rewrite in place."""

    def get_env_state(self) -> dict[str, Any]:
        return {**super().get_env_state(), "steps_seen": self.steps_seen.copy()}

    def set_env_state(self, state: Any) -> None:
        super().set_env_state(state)
        self.steps_seen = state["steps_seen"]


@pytest.mark.parametrize(
    ("env", "words"),
    [
        (KeepingPoint, r"stepping changed a snapshot given to set_state\(\); set_env_state\(\)"),
        (NumpyScalarPoint, r"snapshot: get_state\(\)\['data'\]\['steps_taken'\]: numpy int64"),
        (AliasingPoint, r"stepping changed a snapshot taken earlier; get_env_state\(\) must"),
    ],
)
def test_the_property_test_applies_the_snapshot_checks_rules(env: type, words: str) -> None:
    """batch_property_test's snapshots pass check_batch_snapshot's rules, with its message."""
    with pytest.raises(ConformanceError, match=words):
        testing.check_batch_snapshot(env, seed=1, steps=30)
    with pytest.raises(ConformanceError, match=words):
        settings(phases=[Phase.explicit, Phase.generate])(
            testing.batch_property_test(env, max_actions=30)
        )()


def test_the_property_test_catches_a_leak() -> None:
    with pytest.raises(ConformanceError, match="reset reuse"):
        settings(phases=[Phase.explicit, Phase.generate])(
            testing.batch_property_test(LeakyPoint, max_actions=30)
        )()


def test_simkit_check_runs_the_batch_kit_on_an_author_class(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    argv = ["check", "test_batch_kit:NormPoint", "--steps", "60", "--seed", "3"]
    assert cli.main([*argv, "--num-envs", "3"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[6].startswith(
        "FAIL  check_batch_singles: batch == singles (instance 0 vs Point reset with "
        "episode_seed(3, 0, k)): "
    )
    assert [ln.split(":")[0] for ln in out[:6]] == [
        f"PASS  {c.__name__}" for c in testing.BATCH_CHECKS[:5]
    ] + ["SKIP  check_batch_subsets"]
    assert out[-1] == "1 of 10 checks failed; fix check_batch_singles first"
    assert cli.main(["check", "test_batch_kit:GlobalRngPoint", "--steps", "30"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("FAIL  check_batch_determinism: determinism (two fresh batches")
    assert "[probably follows from check_batch_determinism" in out[2]


class SetInfoPoint(BatchPoint):
    """Step infos that hold a set: no recorder or server client can take them."""

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        obs, reward, terminated, _ = super().step_instances(actions, rngs)
        return obs, reward, terminated, [{"s": {1, 2}} for _ in range(self.num_envs)]


class ObjectResetInfoPoint(BatchPoint):
    def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
        obs, _ = super().reset_instances(ids, rngs, params, options)
        return obs, [{"bad": object()} for _ in ids]


@pytest.mark.parametrize(
    ("env", "where"),
    [(SetInfoPoint, r"step #\d+, instance 0"), (ObjectResetInfoPoint, r"reset, instance 0")],
)
def test_batch_infos_that_are_not_plain_data_are_caught(env: type, where: str) -> None:
    """check_spaces held single envs' infos to the recorder's rule; check_batch_spaces
    did not, and an object() in reset infos surfaced as a determinism failure."""
    with pytest.raises(ConformanceError, match=rf"spaces: info at {where} is not plain data"):
        testing.check_batch_spaces(env, steps=10)


class AliasingPoint(BatchPoint):
    """Returns its live state array as the observation; reset writes it in place."""

    state_attributes = ("obs_state",)

    def __init__(self, num_envs: int = 4, **kwargs: Any) -> None:
        super().__init__(num_envs, **kwargs)
        self.obs_state = np.zeros((num_envs, 4))

    def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
        obs, info = super().reset_instances(ids, rngs, params, options)
        self.obs_state[ids] = obs
        return obs, info

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        obs, reward, terminated, info = super().step_instances(actions, rngs)
        self.obs_state[:] = obs
        return self.obs_state, reward, terminated, info


def test_a_batch_returning_its_state_array_as_observations_is_caught() -> None:
    """Its final_obs showed the next episode's first observation; the kit's first
    failure was check_batch_independence, blaming a whole-batch reduction."""
    with pytest.raises(
        ConformanceError, match=r"step #\d+'s obs shares memory with state attribute 'obs_state'"
    ):
        testing.check_batch_spaces(AliasingPoint, steps=10)
