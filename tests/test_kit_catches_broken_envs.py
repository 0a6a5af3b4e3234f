"""The conformance kit catches each class of broken env it claims to, with the right message."""

from __future__ import annotations

import random
import re
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import Phase, settings

import simkit
from simkit import testing
from simkit.errors import ConformanceError, InvalidState
from simkit.randomization import Params
from simkit.vector import VectorEnv


class Walker(simkit.Env[np.ndarray, np.ndarray]):
    """A correct toy env: a point drifting under a randomized pull, with noise from rng."""

    max_episode_steps = 25
    randomization = {"drift": simkit.Uniform(0.0, 1.0), "mode": simkit.Choice(("a", "b"))}
    state_attributes: Any = ("pos", "vel")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.pos = 0.0
        self.vel = 0.0

    def noise(self, rng: np.random.Generator) -> float:
        return float(rng.normal(0.0, 0.1))

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.pos = float(rng.uniform(-1.0, 1.0))
        self.vel = 0.0
        return self.obs(), {}

    def obs(self) -> np.ndarray:
        return np.array([self.pos, self.vel], dtype=np.float64)

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        self.vel += float(action[0]) + self._params["drift"] * 0.1 + self.noise(rng)
        self.pos += 0.1 * self.vel
        return self.obs(), -abs(self.pos), abs(self.pos) > 5.0, {}


class GlobalNumpyWalker(Walker):
    def noise(self, rng: np.random.Generator) -> float:
        return float(np.random.normal(0.0, 0.1))  # noqa: NPY002 (the bug under test)


class GlobalRandomWalker(Walker):
    def noise(self, rng: np.random.Generator) -> float:
        return random.gauss(0.0, 0.1)


class LeakyWalker(Walker):
    """Never resets its velocity: episodes inherit the previous one's."""

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.pos = float(rng.uniform(-1.0, 1.0))
        return self.obs(), {}


class SetOrderWalker(Walker):
    """Sums its thrusters' noise over a set of their names: a set of str iterates in an
    order that follows the hash seed, so each process pairs draws and gains differently."""

    GAINS = {"left": 1.0, "right": 0.5, "up": 0.25, "down": 0.125}

    def noise(self, rng: np.random.Generator) -> float:
        total = 0.0
        for name in set(self.GAINS):
            total += self.GAINS[name] * float(rng.normal(0.0, 0.1))
        return total


class HashSeededWalker(Walker):
    """Seeds a wind generator from ``hash`` of a str, which follows the hash seed."""

    def noise(self, rng: np.random.Generator) -> float:
        wind = np.random.default_rng(abs(hash("wind")))
        return float(rng.normal(0.0, 0.1)) + float(wind.normal(0.0, 0.01))


class ChattyWalker(Walker):
    """A correct env that prints at every step (a reply on stdout would be corrupted)."""

    def noise(self, rng: np.random.Generator) -> float:
        print("step")
        return super().noise(rng)


class IncompleteSnapshotWalker(Walker):
    state_attributes = ("pos",)


class FixedParamsWalker(Walker):
    """Samples its drift from a fixed-seed generator: never varies with the seed."""

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self._params["drift"] = float(np.random.default_rng(0).uniform(0.0, 1.0))
        return super().reset_episode(rng, params, options)


class UnseededParamsWalker(Walker):
    """Samples its drift from an unseeded generator: the same seed gives other params."""

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self._params["drift"] = float(np.random.default_rng().uniform(0.0, 1.0))
        return super().reset_episode(rng, params, options)


class Swarm(simkit.MultiAgentEnv[str, np.ndarray, np.ndarray]):
    """A correct toy multi-agent env: agents leave once they pass a line."""

    metadata: dict[str, Any] = {"render_modes": [], "name": "swarm_v0"}
    max_episode_steps = 20
    randomization = {"pull": simkit.Uniform(0.0, 0.5)}
    state_attributes: Any = ("pos",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.possible_agents = ["a0", "a1", "a2"]
        box = spaces.Box(-1e6, 1e6, shape=(1,), dtype=np.float64)
        self.observation_spaces = {a: box for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(3) for a in self.possible_agents}
        self.pos: dict[str, float] = {}

    def noise(self, rng: np.random.Generator) -> float:
        return float(rng.normal(0.0, 0.2))

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        self.pos = {a: float(rng.uniform(-1.0, 1.0)) for a in self.agents}
        return {a: np.array([p]) for a, p in self.pos.items()}, {}

    def step_episode(self, actions: dict[str, Any], rng: np.random.Generator) -> Any:
        for agent, action in actions.items():
            self.pos[agent] += (int(action) - 1) * 0.3 + self._params["pull"] + self.noise(rng)
        obs = {a: np.array([self.pos[a]]) for a in actions}
        return (
            obs,
            {a: -abs(self.pos[a]) for a in actions},
            {a: self.pos[a] > 2 for a in actions},
            {},
        )


class GlobalNumpySwarm(Swarm):
    def noise(self, rng: np.random.Generator) -> float:
        return float(np.random.normal(0.0, 0.2))  # noqa: NPY002 (the bug under test)


def test_correct_envs_pass_every_check() -> None:
    testing.check_env(Walker, steps=80)
    testing.check_env(Swarm, steps=80)


@pytest.mark.parametrize("env_cls", [GlobalNumpyWalker, GlobalRandomWalker, GlobalNumpySwarm])
def test_global_rng_is_caught(env_cls: type) -> None:
    with pytest.raises(ConformanceError, match=r"determinism.*global np\.random/random"):
        testing.check_determinism(env_cls, steps=30)
    with pytest.raises(ConformanceError, match=r"global RNG.*draws from a global RNG"):
        testing.check_no_global_rng(env_cls, steps=30)
    with pytest.raises(ConformanceError, match="determinism"):
        testing.check_env(env_cls, steps=30)


def test_state_leaking_across_resets_is_caught() -> None:
    testing.check_determinism(LeakyWalker, steps=60)  # two fresh instances leak alike
    with pytest.raises(ConformanceError, match=r"reset reuse.*leaves some state"):
        testing.check_reset_reuse(LeakyWalker, steps=60)


def test_incomplete_snapshot_is_caught() -> None:
    testing.check_reset_reuse(IncompleteSnapshotWalker, steps=60)
    with pytest.raises(ConformanceError, match=r"snapshot.*incomplete.*get_env_state"):
        testing.check_snapshot(IncompleteSnapshotWalker, steps=60)


class UprightWalker(Walker):
    """A correct env whose episodes always run to the time limit (never terminate)."""

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        obs, reward, _, info = super().step_episode(action, rng)
        return obs, reward, False, info


def test_snapshot_check_resets_when_the_warm_up_ends_an_episode() -> None:
    # The warm-up is steps // 3 = 25 steps: exactly one episode, so its last step truncates.
    # The kit must reset before the snapshot instead of stepping an ended episode (ResetNeeded),
    # as `simkit check simkit/CartPole-v0` did with the default seed and steps.
    testing.check_snapshot(UprightWalker, steps=75)
    testing.check_snapshot("simkit/CartPole-v0", seed=0, steps=100)


def test_params_ignoring_the_seed_are_caught() -> None:
    with pytest.raises(ConformanceError, match=r"'drift' took the same value .* ignores the seed"):
        testing.check_randomization(FixedParamsWalker)
    with pytest.raises(ConformanceError, match=r"seed 0 sampled different parameters"):
        testing.check_randomization(UnseededParamsWalker)


def test_checks_are_listed_and_accept_registered_ids() -> None:
    assert [
        testing.check_spaces,
        testing.check_determinism,
        testing.check_reset_reuse,
        testing.check_snapshot,
        testing.check_randomization,
        testing.check_no_global_rng,
        testing.check_other_process,
    ] == testing.CHECKS
    testing.check_determinism("simkit/CartPole-v0", steps=20)
    with pytest.raises(TypeError, match="env_fn must be an env id or a zero-argument callable"):
        testing.check_env(42, steps=5)  # type: ignore[arg-type]


class Float32Walker(Walker):
    """Returns float32 observations for its float64 space: Space.contains accepts them."""

    def obs(self) -> np.ndarray:
        return np.array([self.pos, self.vel], dtype=np.float32)


class Float32Swarm(Swarm):
    def step_episode(self, actions: dict[str, Any], rng: np.random.Generator) -> Any:
        obs, *rest = super().step_episode(actions, rng)
        return ({a: o.astype(np.float32) for a, o in obs.items()}, *rest)


def test_observations_of_another_dtype_than_the_space_are_caught() -> None:
    # The rule a vector's snapshot is restored by: a VectorEnv refuses its own snapshot.
    vec = VectorEnv([Float32Walker] * 2)
    vec.reset(seed=0)
    with pytest.raises(InvalidState, match="must be a float64 array"):
        vec.set_env_states([0], vec.get_env_states([0]))
    vec.close()
    with pytest.raises(
        ConformanceError,
        match=r"^spaces: observation at reset #0 must be a float64 array of shape \(2,\), "
        r"got float32 array of shape \(2,\); return observations of exactly the space's dtype",
    ):
        testing.check_spaces(Float32Walker, steps=30)
    with pytest.raises(ConformanceError, match=r"^spaces: observation at reset #0 must be"):
        testing.check_env(Float32Walker, steps=30)
    with pytest.raises(
        ConformanceError,
        match=r"^spaces: observation of 'a0' at step #1 must be a float64 array of shape "
        r"\(1,\), got float32",
    ):
        testing.check_spaces(Float32Swarm, steps=30)


class NumpyScalarWalker(Walker):
    """Keeps a numpy int64 (rng.integers) in its state: a snapshot restores a Python int."""

    state_attributes = ("pos", "vel", "kicks")

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.kicks = rng.integers(1, 10)  # the bug under test
        return super().reset_episode(rng, params, options)


def test_a_numpy_scalar_in_the_state_is_named_with_its_fix() -> None:
    with pytest.raises(ConformanceError) as caught:
        testing.check_snapshot(NumpyScalarWalker, seed=1, steps=40)
    message = str(caught.value)
    assert re.match(
        r"snapshot: get_state\(\)\['data'\]\['kicks'\]: numpy int64 (\d) becomes int \1 "
        r"through simkit.snapshot",
        message,
    ), message
    assert "store plain Python numbers (int(...), float(...), bool(...)) or numpy arrays" in (
        message
    )


test_walker_properties = testing.property_test(Walker)
test_swarm_properties = testing.property_test(Swarm)


class AliasingWalker(Walker):
    """Its snapshot holds the env's live array: stepping on rewrites an earlier snapshot."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trail = np.zeros(3)

    def get_env_state(self) -> dict[str, Any]:
        return {"pos": self.pos, "vel": self.vel, "trail": self.trail}  # the bug under test

    def set_env_state(self, state: dict[str, Any]) -> None:
        self.pos, self.vel = state["pos"], state["vel"]
        self.trail = np.array(state["trail"])

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        self.trail[:] = np.roll(self.trail, 1)
        self.trail[0] = self.pos
        return super().step_episode(action, rng)


@pytest.mark.parametrize(
    ("env_cls", "match"),
    [
        (GlobalNumpyWalker, r"determinism \(two fresh instances"),
        (LeakyWalker, r"reset reuse"),
        (IncompleteSnapshotWalker, r"snapshot \(set_state on a fresh instance"),
        (GlobalNumpySwarm, r"determinism \(two fresh instances"),
    ],
)
def test_property_test_catches_broken_envs(env_cls: type, match: str) -> None:
    with pytest.raises(ConformanceError, match=match):
        # Shrinking a failure is slow and proves nothing here.
        settings(phases=[Phase.explicit, Phase.generate])(testing.property_test(env_cls))()


class KeepingWalker(AliasingWalker):
    """Its restore keeps the snapshot's array: steps then rewrite the caller's snapshot,
    so restoring it again gives another state."""

    def get_env_state(self) -> dict[str, Any]:
        return {"pos": self.pos, "vel": self.vel, "trail": self.trail.copy()}

    def set_env_state(self, state: dict[str, Any]) -> None:
        self.pos, self.vel, self.trail = state["pos"], state["vel"], state["trail"]  # the bug


@pytest.mark.parametrize(
    ("env_cls", "match"),
    [
        (NumpyScalarWalker, r"snapshot: get_state\(\)\['data'\]\['kicks'\]: numpy int64"),
        (KeepingWalker, r"stepping changed a snapshot given to set_state\(\); set_env_state\(\) "),
        (AliasingWalker, r"stepping changed a snapshot taken earlier; get_state\(\) must return"),
    ],
)
def test_property_test_applies_check_snapshots_rules(env_cls: type, match: str) -> None:
    """The property test's snapshots pass the rules check_snapshot applies: a round trip
    that keeps every type, and no live arrays, each with check_snapshot's message."""
    with pytest.raises(ConformanceError, match=match):
        testing.check_snapshot(env_cls, seed=1, steps=40)
    with pytest.raises(ConformanceError, match=match):
        settings(phases=[Phase.explicit, Phase.generate])(testing.property_test(env_cls))()


class ArrayRewardWalker(Walker):
    """Returns its reward as an array of shape (1,): every check that steps it raises."""

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, Any, bool, dict[str, Any]]:
        obs, reward, terminated, info = super().step_episode(action, rng)
        return obs, np.array([reward]), terminated, info


def test_checks_failing_with_one_error_name_it_once_not_a_cause() -> None:
    """A later check failing with the very error an earlier one raised was told it
    "probably follows from check_determinism" (two runs that differ); it is the same
    error, and the report says so."""
    results = testing.run_checks(testing.CHECKS, ArrayRewardWalker, steps=20)
    failed = [r for r in results if r.status == "FAIL"]
    assert failed[0].name == "check_spaces"
    assert "step_episode must return the reward as a real number" in failed[0].message
    for r in failed[1:]:
        assert r.message.endswith(" [the same error as check_spaces]"), r.line()
        assert "probably follows" not in r.message


class InfoWalker(Walker):
    """Steps with the info ``Walker.bad_info`` (class-level, set per test)."""

    bad_info: Any = None

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        obs, reward, terminated, _ = super().step_episode(action, rng)
        return obs, reward, terminated, dict(self.bad_info)


class InfoSwarm(Swarm):
    bad_info: Any = None

    def step_episode(self, actions: dict[str, Any], rng: np.random.Generator) -> Any:
        obs, rewards, terminated, _ = super().step_episode(actions, rng)
        return obs, rewards, terminated, {a: dict(self.bad_info) for a in actions}


@pytest.mark.parametrize(
    ("info", "match"),
    [
        ({"s": {1, 2}}, r"info\.s: snapshots hold .* got set"),
        ({1: "a"}, r"info: snapshot keys must be str, got int"),
        ({"o": object()}, r"info\.o: .* got object"),
    ],
)
@pytest.mark.parametrize("base", [InfoWalker, InfoSwarm])
def test_infos_that_are_not_plain_data_are_caught(
    base: type, info: dict[Any, Any], match: str
) -> None:
    """An info holding a set, an int key or an object passed the whole kit, then broke
    the recorder (a TypeError, or an AttributeError for the int key) and the server's
    infos: check_spaces holds every info to the recorder's rule."""
    env_cls = type(base.__name__, (base,), {"bad_info": info})
    with pytest.raises(ConformanceError, match=r"spaces: info at step #\d+ is not plain data"):
        testing.check_spaces(env_cls, steps=10)
    with pytest.raises(ConformanceError, match=match):
        testing.check_spaces(env_cls, steps=10)


def test_the_recorder_names_an_info_key_that_is_not_a_str(tmp_path: Any) -> None:
    """It raised AttributeError: 'int' object has no attribute 'startswith'."""
    from simkit.recording import RecordEpisodes

    env_cls = type("IntKeyWalker", (InfoWalker,), {"bad_info": {1: "a"}})
    env = RecordEpisodes(
        VectorEnv([env_cls]), tmp_path / "rec", env_id="x:IntKeyWalker", background=False
    )
    env.reset(seed=0)
    for _ in range(InfoWalker.max_episode_steps - 1):
        env.step(np.zeros((1, 1), dtype=np.float32))
    with pytest.raises(TypeError, match=r"snapshot keys must be str, got int"):
        env.step(np.zeros((1, 1), dtype=np.float32))  # the episode ends and is written
    env.close()


def _with_randomization(declared: dict[str, Any], **kwargs: Any) -> Any:
    cls = type("RandomizedWalker", (Walker,), {"randomization": declared})
    return lambda: cls(**kwargs)


@pytest.mark.parametrize(
    "make",
    [
        _with_randomization({"mode": simkit.Choice(("a", "b"), weights=(1.0, 0.0))}),
        _with_randomization({"mode": simkit.Choice(("a", "b"), weights=(0.05, 0.95))}),
        _with_randomization(dict(Walker.randomization), params={"drift": 0.5}),
    ],
    ids=["zero-weight", "lopsided", "fixed-per-env"],
)
def test_check_randomization_passes_params_that_cannot_or_rarely_vary(make: Any) -> None:
    """A Choice whose other options weigh 0, a lopsided one (0.05/0.95: all 20 draws
    alike more than a third of the time) and a parameter the env instance fixes
    (``params={"drift": 0.5}``, the docs' own example) failed "randomization probably
    ignores the seed" for a correct env."""
    for seed in range(5):
        testing.check_randomization(make, seed=seed)


def test_check_randomization_still_catches_a_lopsided_choice_that_ignores_the_seed() -> None:
    class Stuck(Walker):
        randomization = {"mode": simkit.Choice(("a", "b"), weights=(0.05, 0.95))}

        def reset_episode(self, rng: Any, params: Params, options: Any) -> Any:
            self._params = {"mode": "b"}
            return super().reset_episode(rng, params, options)

    with pytest.raises(ConformanceError, match="'mode' took the same value 'b'"):
        testing.check_randomization(Stuck)


def test_the_kit_draws_actions_from_a_full_range_float64_box() -> None:
    """``rng.uniform(-max, max)`` overflows; five checks blamed the env for the kit's own
    "OverflowError: Range exceeds valid bounds"."""
    from simkit.testing._driver import sample

    big = np.finfo(np.float64).max
    space = spaces.Box(-big, big, (3,), np.float64)
    rng = np.random.default_rng(0)
    drawn = [sample(space, rng) for _ in range(50)]
    assert all(space.contains(a) for a in drawn)
    assert len({float(a[0]) for a in drawn}) == 50
    small = spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert sample(small, np.random.default_rng(3)).tolist() == (
        np.random.default_rng(3).uniform(-1.0, 1.0, size=(2,)).astype(np.float32).tolist()
    )


def test_check_snapshot_skips_an_env_without_snapshots() -> None:
    """``simkit check gym:Pendulum-v1`` failed check_snapshot with "'TimeLimit' object has
    no attribute 'get_state'": Gymnasium envs have no snapshots, so it does not apply."""
    results = testing.run_checks(testing.CHECKS, "gym:Pendulum-v1", steps=10)
    status = {r.name: r.status for r in results}
    assert status.pop("check_snapshot") == "SKIP"
    assert set(status.values()) == {"PASS"}


@pytest.mark.parametrize("env_cls", [SetOrderWalker, HashSeededWalker])
def test_an_env_that_depends_on_its_process_is_caught(env_cls: type) -> None:
    """Within one process these envs repeat themselves bit for bit, so every other check
    passed them; a rollout server, a replay worker or a Ray actor (another process, another
    hash seed) computed other bits from the same seed and actions."""
    testing.check_determinism(env_cls, steps=40)
    testing.check_no_global_rng(env_cls, steps=40)
    testing.check_snapshot(env_cls, steps=40)
    with pytest.raises(ConformanceError, match=r"other process.*PYTHONHASHSEED.*iterates a set"):
        testing.check_other_process(env_cls, steps=40)


def test_the_other_process_check_runs_what_a_new_process_can_build_and_skips_the_rest() -> None:
    import functools

    testing.check_other_process(ChattyWalker, steps=30)
    testing.check_other_process(functools.partial(Walker, max_episode_steps=7), steps=30)
    testing.check_other_process("simkit/GoalNav-v0", steps=30)
    results = testing.run_checks([testing.check_other_process], lambda: Walker(), steps=5)
    assert [r.status for r in results] == ["SKIP"]
    assert "cannot be rebuilt in a new process" in results[0].message


def test_check_env_skips_the_checks_that_do_not_apply_and_runs_the_rest() -> None:
    """check_env raised the SkipTest of a check that did not apply (gym:Pendulum-v1's
    snapshot): a pytest test of the env was reported skipped, and the later checks never
    ran; so was every env of a lambda factory, at the other-process check."""
    import unittest

    for env_fn in ("gym:Pendulum-v1", lambda: Walker()):
        try:
            testing.check_env(env_fn, steps=10)
        except unittest.SkipTest as exc:
            pytest.fail(f"check_env({env_fn!r}) raised SkipTest: {exc}")
