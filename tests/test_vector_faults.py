"""Fault isolation of the local vectors (``isolate_faults=True``), subset steps and
array-form resets: what the rollout server's hosts are built on, usable locally."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv

import simkit
from simkit._seeding import episode_seed
from simkit._types import StepFault
from simkit.envs.goal_nav import GoalNav
from simkit.errors import InvalidState
from simkit.snapshot import dumps, loads
from simkit.vector import MultiAgentVectorEnv, VectorEnv


class Flaky(simkit.Env[np.ndarray, np.ndarray]):
    """Counts steps; an action above 0.9 raises in step, ``fail_reset`` makes reset raise."""

    state_attributes = ("x",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Box(-100, 100, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Box(-1, 1, shape=(1,), dtype=np.float32)
        self.x = 0.0
        self.fail_reset = False

    def reset_episode(
        self, rng: Any, params: Any, options: Any
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if self.fail_reset:
            raise OSError("reset broke")
        self.x = float(rng.integers(10, 20))
        return np.array([self.x], dtype=np.float32), {}

    def step_episode(
        self, action: np.ndarray, rng: Any
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        if action[0] > 0.9:
            raise RuntimeError("boom")
        self.x += 1.0
        return np.array([self.x], dtype=np.float32), 1.0, False, {}


def flaky_vector(n: int, **kwargs: Any) -> VectorEnv:
    return VectorEnv([Flaky for _ in range(n)], **kwargs)


def test_a_failing_env_ends_its_episode_and_restarts_while_the_others_go_on() -> None:
    vec = flaky_vector(3, isolate_faults=True)
    first, _ = vec.reset(seed=4)
    actions = np.array([[0.0], [1.0], [0.0]], dtype=np.float32)
    step, faults = vec.step_envs(np.arange(3), actions)
    assert len(faults) == 1
    assert (faults[0].env_id, faults[0].during) == (1, "step")
    assert isinstance(faults[0].error, RuntimeError)
    assert step.truncated.tolist() == [False, True, False]
    assert step.reward.tolist() == [1.0, 0.0, 1.0]
    assert step.final_obs[1] == first[1]
    assert step.obs[[0, 2], 0].tolist() == (first[[0, 2], 0] + 1).tolist()
    # Env 1 restarted with its next episode's seed; the others are still in episode 0.
    assert vec.episode_index.tolist() == [0, 1, 0]
    expected, _ = Flaky().reset(seed=episode_seed(4, 1, 1))
    assert step.obs[1] == expected


def test_a_whole_restore_mends_an_env_whose_restart_failed() -> None:
    """``set_state`` of a snapshot taken while every env was healthy left a broken env
    broken (``set_env_states`` mended it): it never stepped again. It continues as the
    vector the snapshot was taken from did."""
    vec = flaky_vector(2, isolate_faults=True)
    vec.reset(seed=1)
    healthy = vec.get_state()
    action = np.zeros((2, 1), dtype=np.float32)
    expected, _ = vec.step_envs(np.arange(2), action)
    vec.set_state(healthy)
    vec.envs[0].unwrapped.fail_reset = True  # type: ignore[attr-defined]
    _, faults = vec.step_envs(np.arange(2), np.array([[1.0], [0.0]], dtype=np.float32))
    assert [(f.env_id, f.during) for f in faults] == [(0, "step"), (0, "reset")]
    vec.envs[0].unwrapped.fail_reset = False  # type: ignore[attr-defined]
    vec.set_state(healthy)
    step, faults = vec.step_envs(np.arange(2), action)
    assert faults == []
    np.testing.assert_array_equal(step.obs, expected.obs)


def test_without_isolation_the_error_propagates() -> None:
    vec = flaky_vector(2)
    vec.reset(seed=0)
    with pytest.raises(RuntimeError, match="boom"):
        vec.step_batch(np.array([[0.0], [1.0]], dtype=np.float32))


def test_a_failed_restart_is_reported_until_the_env_is_reset() -> None:
    vec = flaky_vector(2, isolate_faults=True)
    vec.reset(seed=1)
    vec.envs[0].unwrapped.fail_reset = True  # type: ignore[attr-defined]
    _, faults = vec.step_envs(np.arange(2), np.array([[1.0], [0.0]], dtype=np.float32))
    assert [(f.env_id, f.during) for f in faults] == [(0, "step"), (0, "reset")]
    step, faults = vec.step_envs(np.arange(2), np.zeros((2, 1), dtype=np.float32))
    assert faults == [StepFault(0, None, "broken")]
    assert step.truncated.tolist() == [True, False]
    vec.envs[0].unwrapped.fail_reset = False  # type: ignore[attr-defined]
    obs, _ = vec.reset_envs(np.array([0]), seeds=[9])
    assert obs[0] == Flaky().reset(seed=9)[0]
    _, faults = vec.step_envs(np.arange(2), np.zeros((2, 1), dtype=np.float32))
    assert faults == []


def test_subset_steps_and_resets_touch_only_the_listed_envs() -> None:
    vec = flaky_vector(4)
    obs, _ = vec.reset(seed=2)
    step, _ = vec.step_envs(np.array([3, 1]), np.zeros((2, 1), dtype=np.float32))
    assert step.env_ids.tolist() == [3, 1]
    assert step.obs[:, 0].tolist() == [obs[3, 0] + 1, obs[1, 0] + 1]
    states = vec.get_env_states(np.arange(4))
    assert [s["env"]["data"]["x"] for s in states] == [
        obs[0, 0],
        obs[1, 0] + 1,
        obs[2, 0],
        obs[3, 0] + 1,
    ]
    again, _ = vec.reset_envs(np.array([2]))
    assert again[0] == Flaky().reset(seed=episode_seed(2, 2, 1))[0]
    assert vec.episode_index.tolist() == [0, 0, 1, 0]


class FlakyNav(GoalNav):
    """GoalNav whose step raises when agent_0's first action component is above 0.9."""

    def step(self, actions: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
        if "agent_0" in actions and float(actions["agent_0"][0]) > 0.9:
            raise RuntimeError("boom")
        return super().step(actions)


def test_multi_agent_vector_isolates_faults_per_env() -> None:
    vec = MultiAgentVectorEnv([FlakyNav, FlakyNav], isolate_faults=True)
    vec.reset(seed=3)
    actions = np.zeros((vec.num_rows, 2), dtype=np.float32)
    actions[vec.row(1, "agent_0")] = [1.0, 0.0]
    step, faults = vec.step_envs(np.arange(2), actions)
    assert [(f.env_id, f.during) for f in faults] == [(1, "step")]
    assert step.env_reset.tolist() == [False, True]
    assert step.truncated[3:].all()
    assert not step.truncated[:3].any()
    assert step.reward[3:].tolist() == [0.0, 0.0, 0.0]
    assert vec.episode_index.tolist() == [0, 1]
    plain = MultiAgentVectorEnv([FlakyNav, FlakyNav])
    plain.reset(seed=3)
    with pytest.raises(RuntimeError, match="boom"):
        plain.step(actions)


class _NoSnapshots(ParallelEnv[str, np.ndarray, np.ndarray]):
    """A PettingZoo env with no get_state (not a simkit env)."""

    metadata: dict[str, Any] = {"name": "no_snapshots"}

    def __init__(self) -> None:
        self.possible_agents = ["a"]
        self.agents: list[str] = []
        self._space = spaces.Box(-1, 1, (1,), np.float32)

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self._space

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self._space

    def reset(self, seed: Any = None, options: Any = None) -> Any:
        self.agents = ["a"]
        return {"a": np.zeros(1, np.float32)}, {"a": {}}


@pytest.mark.parametrize("face", ["single", "multi"])
def test_both_vectors_check_snapshots_in_one_place(face: str) -> None:
    """One core validates whole and per-env snapshots for both faces, one wording."""

    def build(n: int) -> Any:
        if face == "single":
            return flaky_vector(n)
        return MultiAgentVectorEnv([FlakyNav] * n)

    vec = build(2)
    vec.reset(seed=0)
    state = vec.get_state()
    with pytest.raises(InvalidState, match="state must be a dict from get_state"):
        vec.set_state("junk")
    with pytest.raises(InvalidState, match=r"state is missing fields \['envs'\]"):
        vec.set_state({k: v for k, v in state.items() if k != "envs"})
    bigger = build(3)
    bigger.reset(seed=0)
    with pytest.raises(InvalidState, match="holds 3 envs, this vector has 2"):
        vec.set_state(bigger.get_state())
    with pytest.raises(
        InvalidState, match=r"a host snapshot holds \[.*'root_seed'\], got \['env'\]"
    ):
        vec.set_env_states([0], [{"env": None}])
    # Every env restored from per-env snapshots: the vector has been reset.
    fresh = build(2)
    fresh.set_env_states(np.arange(2), vec.get_env_states(np.arange(2)))
    fresh.step(np.zeros(fresh.action_space.shape, np.float32))


def test_multi_agent_snapshots_need_simkit_envs() -> None:
    vec = MultiAgentVectorEnv([_NoSnapshots])
    vec.reset(seed=0)
    with pytest.raises(TypeError, match="vector snapshots need simkit envs"):
        vec.get_state()
    with pytest.raises(TypeError, match="snapshots need simkit envs"):
        vec.get_env_states([0])


def _cartpoles() -> VectorEnv:
    vec = VectorEnv("simkit/CartPole-v0", 2)
    vec.reset(seed=0)
    vec.step(np.ones(2, np.int64))
    return vec


def _set_bad_env_state(vec: VectorEnv, change: Any) -> None:
    states = vec.get_env_states(np.arange(2))
    change(states)
    vec.set_env_states(np.arange(2), states)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda s: s[1].update(episode_index=2**64 - 1),
            r"state\['episode_index'\] must be an int in \[-1, 2\*\*63 - 2\], got 18446744073709551615",
        ),
        (
            lambda s: s[1].update(root_seed=2**63),
            r"state\['root_seed'\] must be None or an int in \[0, 2\*\*63\), got 9223372036854775808",
        ),
        (lambda s: s[1].update(episode_index=-2), r"episode_index'\] must be an int in \[-1"),
        (
            lambda s: s[0].update(obs="not an observation"),
            r"state\['obs'\] must be a float32 array of shape \(4,\), got str",
        ),
        (
            lambda s: s[0].update(obs=np.zeros(3, np.float32)),
            r"state\['obs'\] must be a float32 array of shape \(4,\), got float32 array of shape",
        ),
        (
            lambda s: s[0]["env"].update(params={}),
            r"state\['params'\] must hold a value for each declared parameter \['cart_mass'",
        ),
        (
            lambda s: s[1]["env"]["params"].update(gravity=-1e300),
            r"value for 'gravity' must lie in its declared domain",
        ),
    ],
)
def test_a_refused_per_env_snapshot_changes_no_env(change: Any, match: str) -> None:
    vec = _cartpoles()
    before = dumps(vec.get_state())
    with pytest.raises(InvalidState, match=match):
        _set_bad_env_state(vec, change)
    assert dumps(vec.get_state()) == before
    vec.step(np.ones(2, np.int64))  # still steps


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda s: s.update(root_seeds=[2**64 - 1, 1]),
            r"state\['root_seeds'\]\[0\] must be None or an int in \[0, 2\*\*63\)",
        ),
        (
            lambda s: s.update(episode_index=np.array([-7, 0])),
            r"state\['episode_index'\]\[0\] must be an int in \[-1, 2\*\*63 - 2\], got -7",
        ),
        (
            lambda s: s.update(env_offset=2**63 - 1),
            r"state\['env_offset'\] must be an int in \[0, 9223372036854775806\]",
        ),
        (
            lambda s: s.update(pending_reset=np.array([True])),
            r"state\['pending_reset'\] must be a bool array of shape \(2,\), got bool array of "
            r"shape \(1,\)",
        ),
        (
            lambda s: s["envs"][0].update(params={}),
            r"state\['params'\] must hold a value for each declared parameter",
        ),
        (
            lambda s: s["envs"][1]["rng"]["state"].update(state={"__int__": "0x" + "f" * 200}),
            r"malformed rng state in snapshot: OverflowError",
        ),
        (
            lambda s: s.update(envs=s["envs"][:1]),
            r"state\['envs'\] holds 1 env states, this vector has 2",
        ),
    ],
)
def test_a_refused_vector_snapshot_changes_nothing(change: Any, match: str) -> None:
    vec = _cartpoles()
    _refused_whole(vec, change, match)
    vec.step(np.ones(2, np.int64))


def _refused_whole(vec: Any, change: Any, match: str) -> str:
    """``vec.set_state`` of its own snapshot after ``change`` is refused naming ``match``,
    and ``vec`` holds what it held; returns that snapshot's bytes."""
    before = dumps(vec.get_state())
    bad = loads(before)
    change(bad)
    with pytest.raises(InvalidState, match=match):
        vec.set_state(bad)
    assert dumps(vec.get_state()) == before
    return before


def _env0(state: dict[str, Any]) -> dict[str, Any]:
    """Env 0's own snapshot in a whole vector snapshot or a per-env one."""
    env: dict[str, Any] = state["envs"][0] if "envs" in state else state["env"]
    return env


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s.update(obs_rows=s["obs_rows"][:2]), r"state\['obs_rows'\]"),
        (lambda s: s.update(obs_rows="not observations"), r"state\['obs_rows'\]"),
        (lambda s: s.update(obs_rows=s["obs_rows"].astype(np.float64)), r"state\['obs_rows'\]"),
        (lambda s: s.update(agent_mask=s["agent_mask"][:2]), r"state\['agent_mask'\]"),
        (lambda s: s.update(agent_mask=[1.5] * 6), r"state\['agent_mask'\]"),
        # The mask must be the env's own live agents (before, a row marked dead whose
        # agent the env still had acted unseen, and a row marked live whose agent the
        # env did not have was reported as acting).
        (
            lambda s: s["agent_mask"].__setitem__(0, False),
            r"state\['agent_mask'\](\[0:3\] \(env 0\))? must mark the live agents of "
            r"state\['envs?'\](\[0\])?\['agents'\] \['agent_0', 'agent_1', 'agent_2'\] "
            r"\(\[True, True, True\] for \['agent_0', 'agent_1', 'agent_2'\]\), "
            r"got \[False, True, True\]",
        ),
        (
            lambda s: _env0(s).update(agents=["agent_1"]),
            r"must mark the live agents of .*\['agent_1'\] .* got \[True, True, True\]",
        ),
        # ... and real agents of the env (before, an unknown one was accepted and every
        # later step raised KeyError).
        (lambda s: _env0(s).update(agents=["nobody"]), r"\['agents'\] names \['nobody'\]"),
        (lambda s: _env0(s).update(agents=[5]), r"\['agents'\] names \[5\]"),
        (lambda s: _env0(s).update(agents="agent_0"), r"\['agents'\] must be a list .* got str"),
        (lambda s: _env0(s).update(agents=None), r"\['agents'\] must be a list"),
        (
            lambda s: _env0(s).update(agents=["agent_0", "agent_0", "agent_1"]),
            r"\['agents'\] lists \['agent_0'\] more than once",
        ),
    ],
)
def test_a_refused_multi_agent_snapshot_changes_nothing(change: Any, match: str) -> None:
    """The multi-agent rows (observations and live agents) are checked as a single
    agent vector's are: a bad one is refused and nothing changes (before, a short
    ``obs_rows`` raised IndexError and a float mask was taken as live agents)."""
    vec = MultiAgentVectorEnv("simkit/GoalNav-v0", 2)
    vec.reset(seed=0)
    before = _refused_whole(vec, change, match)
    one = loads(dumps(vec.get_env_states([0])[0]))
    change(one)
    with pytest.raises(InvalidState, match=match):
        vec.set_env_states([0], [one])
    assert dumps(vec.get_state()) == before
    vec.step(np.zeros(vec.action_space.shape, np.float32))
