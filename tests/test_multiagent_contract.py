"""The multi-agent contract: PettingZoo Parallel API, agents leaving, truncation, state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.test import parallel_api_test

import simkit
from simkit import snapshot
from simkit.errors import InvalidAction, InvalidState, ResetNeeded
from simkit.randomization import Params


class Race(simkit.MultiAgentEnv[str, np.ndarray, int]):
    """Three runners; runner ``i`` finishes (terminates) after ``i + 2`` forward steps."""

    max_episode_steps = 6
    randomization = {"speed": simkit.Uniform(0.5, 1.5)}
    state_attributes = ("progress",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.possible_agents = ["r0", "r1", "r2"]
        self.observation_spaces = {
            a: spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
            for a in self.possible_agents
        }
        self.action_spaces = {a: spaces.Discrete(2) for a in self.possible_agents}
        self.progress = {a: 0 for a in self.possible_agents}

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.progress[agent], self._params["speed"]], dtype=np.float64)

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        self.progress = {a: 0 for a in self.agents}
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step_episode(self, actions: dict[str, int], rng: np.random.Generator) -> Any:
        noise = {a: float(rng.normal()) for a in self.agents}
        for agent, action in actions.items():
            self.progress[agent] += action
        obs = {a: self._obs(a) for a in self.agents}
        rewards = {a: float(actions[a]) + 0.01 * noise[a] for a in self.agents}
        done = {a: self.progress[a] >= int(a[1]) + 2 for a in self.agents}
        return obs, rewards, done, {a: {} for a in self.agents}


def test_pettingzoo_parallel_api() -> None:
    parallel_api_test(Race(max_episode_steps=50), num_cycles=100)


def test_reset_reports_params_per_agent() -> None:
    env = Race()
    obs, infos = env.reset(seed=0)
    assert env.agents == ["r0", "r1", "r2"]
    assert set(obs) == set(infos) == set(env.agents)
    speed = infos["r0"]["params"]["speed"]
    assert all(info["params"] == {"speed": speed} for info in infos.values())
    _, infos = env.reset(seed=0, options={"params": {"speed": 1.0}})
    assert infos["r2"]["params"]["speed"] == 1.0


def test_agents_leave_at_different_times() -> None:
    env = Race(max_episode_steps=100)
    env.reset(seed=0)
    left: list[tuple[int, list[str]]] = []
    for t in range(1, 5):
        live = list(env.agents)
        obs, rewards, terms, truncs, infos = env.step(dict.fromkeys(live, 1))
        assert set(obs) == set(rewards) == set(terms) == set(truncs) == set(infos) == set(live)
        assert not any(truncs.values())
        gone = [a for a in live if terms[a]]
        if gone:
            left.append((t, gone))
        assert env.agents == [a for a in live if not terms[a]]
    assert left == [(2, ["r0"]), (3, ["r1"]), (4, ["r2"])]
    with pytest.raises(ResetNeeded, match=r"step\(\) called after the episode ended"):
        env.step({})


def test_missing_and_extra_actions_named() -> None:
    env = Race(max_episode_steps=100)
    env.reset(seed=0)
    with pytest.raises(
        InvalidAction, match=r"live agents \['r0', 'r1', 'r2'\]; missing \['r2'\], not live \[\]"
    ):
        env.step({"r0": 1, "r1": 1})
    env.step({"r0": 1, "r1": 1, "r2": 1})
    env.step({"r0": 1, "r1": 0, "r2": 0})
    assert "r0" not in env.agents
    with pytest.raises(InvalidAction, match=r"missing \[\], not live \['r0'\]"):
        env.step({"r0": 1, "r1": 1, "r2": 1})
    with pytest.raises(InvalidAction, match=r"not live \['ghost'\]"):
        env.step({"r1": 1, "r2": 1, "ghost": 0})
    with pytest.raises(InvalidAction, match=r"action for 'r1' must be in \[0, 2\), got 3"):
        env.step({"r1": 3, "r2": 1})
    with pytest.raises(InvalidAction, match=r"actions must be a dict keyed by agent, got list"):
        env.step([1, 1])  # type: ignore[arg-type]
    assert env.elapsed_steps == 2


def test_truncation_at_the_limit_for_all_live_agents() -> None:
    env = Race(max_episode_steps=3)
    env.reset(seed=0)
    env.step({"r0": 1, "r1": 0, "r2": 0})
    env.step({"r0": 1, "r1": 0, "r2": 0})  # r0 terminates here
    assert env.agents == ["r1", "r2"]
    _, _, terms, truncs, _ = env.step({"r1": 0, "r2": 0})
    assert truncs == {"r1": True, "r2": True}
    assert terms == {"r1": False, "r2": False}
    assert env.agents == []
    with pytest.raises(ResetNeeded, match=r"after the episode ended"):
        env.step({})


def test_step_before_reset() -> None:
    with pytest.raises(ResetNeeded, match=r"step\(\) called before reset\(\)"):
        Race().step({})


def _play(env: Race, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        if not env.agents:
            break
        step = env.step(dict.fromkeys(env.agents, 1))
        out.append(snapshot.dumps(list(step)))
    return out


def test_state_includes_agents_and_continues_bit_identically() -> None:
    env = Race(max_episode_steps=100)
    env.reset(seed=4)
    _play(env, 2)
    state = env.get_state()
    assert state["agents"] == ["r1", "r2"]
    wire = snapshot.loads(snapshot.dumps(state))
    expected = _play(env, 5)
    assert expected
    for target in (env, Race()):
        target.set_state(wire)
        assert target.agents == ["r1", "r2"]
        assert _play(target, 5) == expected


def test_state_from_other_env_rejected() -> None:
    class Other(Race):
        pass

    other = Other()
    other.reset(seed=0)
    with pytest.raises(InvalidState, match=r"state belongs to env .*Other'"):
        Race().set_state(other.get_state())


@pytest.mark.parametrize(
    ("agents", "match"),
    [
        (["nobody"], r"state\['agents'\] names \['nobody'\], not agents of this env"),
        ([5], r"names \[5\], not agents"),
        ("r0", r"state\['agents'\] must be a list of live agents .* got str"),
        (None, r"must be a list of live agents .* got NoneType"),
        (["r1", "r1"], r"state\['agents'\] lists \['r1'\] more than once"),
        ([["r0"]], r"names \[\['r0'\]\], not agents"),
        ("missing", r"state is missing field 'agents'"),
    ],
)
def test_a_snapshot_whose_agents_are_not_possible_agents_changes_nothing(
    agents: Any, match: str
) -> None:
    """``agents`` is checked with the other fields, before anything is applied: a
    snapshot naming an unknown agent (or a string, taken as its letters) was accepted
    and every later step raised KeyError; ``None`` raised TypeError."""
    env = Race(max_episode_steps=100)
    env.reset(seed=4)
    _play(env, 2)
    before = snapshot.dumps(env.get_state())
    bad = snapshot.loads(before)
    if agents == "missing":
        del bad["agents"]
    else:
        bad["agents"] = agents
    bad["elapsed_steps"] = 7
    with pytest.raises(InvalidState, match=match):
        env.set_state(bad)
    assert snapshot.dumps(env.get_state()) == before
    assert env.agents == ["r1", "r2"]
    env.step({"r1": 1, "r2": 1})


def test_a_snapshot_may_list_agents_in_any_order() -> None:
    env = Race(max_episode_steps=100)
    env.reset(seed=4)
    state = env.get_state()
    state["agents"] = ["r2", "r0"]
    env.set_state(state)
    assert env.agents == ["r2", "r0"]
    env.step({"r0": 1, "r2": 1})


def test_np_random_created_lazily_like_gymnasium() -> None:
    env = Race()
    assert isinstance(env.np_random, np.random.Generator)
    env.reset(seed=1)
    assert env.np_random_seed == 1
    env.np_random = np.random.default_rng(2)
    assert env.np_random_seed == -1


def test_a_reward_that_is_not_a_real_number_names_the_agent() -> None:
    class BadReward(Race):
        def step_episode(self, actions: dict[str, int], rng: np.random.Generator) -> Any:
            obs, rewards, done, infos = super().step_episode(actions, rng)
            return obs, {**rewards, "r1": np.array([1.0, 2.0])}, done, infos

    env = BadReward()
    env.reset(seed=0)
    with pytest.raises(
        TypeError,
        match=r"^step_episode must return the reward of agent 'r1' as a real number \(a float, "
        r"int or numpy scalar\), got ndarray of shape \(2,\)$",
    ):
        env.step(dict.fromkeys(env.agents, 1))


class DropsR1(Race):
    """Leaves runner r1 out of every result: it vanished with no flag set."""

    def step_episode(self, actions: dict[str, int], rng: np.random.Generator) -> Any:
        obs, rewards, done, infos = super().step_episode(actions, rng)
        return (
            *({a: v for a, v in part.items() if a != "r1"} for part in (obs, rewards, done)),
            infos,
        )


class NoRewardForR1(Race):
    """Observes r1 but gives it no reward (a KeyError out of the base class before)."""

    def step_episode(self, actions: dict[str, int], rng: np.random.Generator) -> Any:
        obs, rewards, done, infos = super().step_episode(actions, rng)
        return obs, {a: r for a, r in rewards.items() if a != "r1"}, done, infos


@pytest.mark.parametrize(
    ("env_cls", "match"),
    [
        (DropsR1, r"its observations miss \['r1'\]$"),
        (NoRewardForR1, r"its rewards miss \['r1'\]$"),
    ],
)
def test_step_results_must_cover_exactly_the_live_agents(env_cls: type, match: str) -> None:
    """The live agents came from the keys of the hook's observations: an agent left out
    vanished without a termination or truncation, and the kit passed it (PettingZoo's
    parallel_api_test did not). Agents may join (they are observed), not vanish."""
    from simkit import testing

    env = env_cls()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"^step_episode must return an observation, .*" + match):
        env.step(dict.fromkeys(env.agents, 1))
    [result] = testing.run_checks([testing.check_spaces], env_cls, steps=20)
    assert result.status == "FAIL"
    assert "step_episode must return an observation" in result.message
