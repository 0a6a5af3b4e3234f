"""The single-agent contract: seeding, params, time limits, misuse errors, snapshots."""

from __future__ import annotations

import re
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env as gym_check_env

import simkit
from simkit import snapshot
from simkit.errors import InvalidAction, InvalidParameter, InvalidState, ResetNeeded
from simkit.randomization import Params


class Drift(simkit.Env[np.ndarray, np.ndarray]):
    """A 1-D point pushed by the action plus noise drawn from the env's rng."""

    max_episode_steps = 5
    randomization = {
        "gain": simkit.Uniform(0.5, 2.0),
        "noise": simkit.LogUniform(0.01, 0.1),
        "mode": simkit.Choice(("calm", "windy")),
    }
    state_attributes = ("pos", "history")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float64)
        self.pos = np.zeros(1)
        self.history: list[float] = []

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.pos = rng.uniform(-1, 1, size=1) + options.get("offset", 0.0)
        self.history = []
        return self.pos.copy(), {"start": float(self.pos[0])}

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        p = self._params
        wind = rng.normal() if p["mode"] == "windy" else 0.0
        self.pos = self.pos + p["gain"] * action + p["noise"] * (rng.normal() + wind)
        self.history.append(float(self.pos[0]))
        return self.pos.copy(), -float(abs(self.pos[0])), bool(abs(self.pos[0]) > 3.0), {}


class Other(Drift):
    pass


class NoState(Drift):
    state_attributes = None


def _rollout(env: Drift, n: int, seed: int | None = 0) -> list[Any]:
    obs, info = env.reset(seed=seed)
    out: list[Any] = [obs.tobytes(), info["params"]["gain"]]
    for t in range(n):
        obs, reward, term, trunc, _ = env.step(np.array([np.sin(t)]))
        out.append((obs.tobytes(), reward, term, trunc))
        if term or trunc:
            break
    return out


def test_same_seed_same_episode_on_fresh_and_reused_instances() -> None:
    a, b = Drift(), Drift()
    first = _rollout(a, 5, seed=7)
    _rollout(a, 3, seed=99)
    assert _rollout(a, 5, seed=7) == first
    assert _rollout(b, 5, seed=7) == first
    assert _rollout(b, 5, seed=8) != first


def test_seed_none_continues_the_stream() -> None:
    a, b = Drift(), Drift()
    a.reset(seed=3)
    b.reset(seed=3)
    assert _rollout(a, 2, seed=None) == _rollout(b, 2, seed=None)
    b.reset(seed=3)
    assert _rollout(b, 2, seed=None) != _rollout(b, 2, seed=3)


def test_np_random_mirrors_gymnasium() -> None:
    env = Drift()
    env.reset(seed=5)
    assert env.np_random_seed == 5
    assert env.np_random is env._np_random
    entry: list[Any] = []

    class Probe(Drift):
        randomization = {}

        def reset_episode(self, rng: np.random.Generator, params: Params, options: Any) -> Any:
            entry.append((rng is self.np_random, rng.bit_generator.state))
            return super().reset_episode(rng, params, options)

    Probe().reset(seed=5)
    assert entry[0][0]
    assert entry[0][1] == gymnasium.utils.seeding.np_random(5)[0].bit_generator.state
    env.np_random = np.random.default_rng(1)
    assert env.np_random_seed == -1


def test_params_reported_and_overridden_per_reset() -> None:
    env = Drift()
    _, info = env.reset(seed=0)
    assert set(info["params"]) == {"gain", "noise", "mode"}
    assert info["params"] == env.params
    assert 0.5 <= info["params"]["gain"] <= 2.0
    _, info = env.reset(
        seed=0, options={"params": {"gain": 1.25, "noise": simkit.Uniform(0.02, 0.03)}}
    )
    assert info["params"]["gain"] == 1.25
    assert 0.02 <= info["params"]["noise"] <= 0.03
    _, info = env.reset(seed=0)
    assert info["params"]["gain"] != 1.25  # a per-reset override lasts one episode


def test_other_option_keys_reach_the_hook() -> None:
    env = Drift()
    _, plain = env.reset(seed=0)
    _, shifted = env.reset(seed=0, options={"offset": 10.0})
    assert shifted["start"] == plain["start"] + 10.0


def test_params_in_constructor_apply_to_every_episode() -> None:
    env = Drift(params={"mode": "calm", "gain": simkit.Uniform(1.0, 1.1)})
    for seed in range(3):
        _, info = env.reset(seed=seed)
        assert info["params"]["mode"] == "calm"
        assert 1.0 <= info["params"]["gain"] <= 1.1
    _, info = env.reset(seed=0, options={"params": {"mode": "windy"}})
    assert info["params"]["mode"] == "windy"


def test_bad_params_rejected_at_construction_and_reset() -> None:
    with pytest.raises(InvalidParameter, match=r"unknown randomization parameter 'gian'"):
        Drift(params={"gian": 1.0})
    with pytest.raises(
        InvalidParameter, match=r"value for 'gain' must lie in its declared domain \[0.5, 2.0\]"
    ):
        Drift(params={"gain": 3.0})
    env = Drift()
    with pytest.raises(InvalidParameter, match=r"override for 'noise' must stay inside"):
        env.reset(options={"params": {"noise": simkit.Uniform(0.001, 0.05)}})
    with pytest.raises(TypeError, match=r"reset options must be a dict or None, got list"):
        env.reset(options=[1])  # type: ignore[arg-type]


def test_params_property_is_a_copy() -> None:
    env = Drift()
    env.reset(seed=0)
    env.params["gain"] = 100.0
    assert env.params["gain"] != 100.0


def test_truncated_exactly_at_max_episode_steps() -> None:
    for limit in (1, 3, 5):
        env = Drift(max_episode_steps=limit, params={"gain": 0.5, "mode": "calm"})
        env.reset(seed=0)
        for step in range(1, limit + 1):
            _, _, term, trunc, _ = env.step(np.zeros(1))
            assert not term
            assert trunc == (step == limit)
            assert env.elapsed_steps == step
        with pytest.raises(ResetNeeded, match=r"step\(\) called after the episode ended"):
            env.step(np.zeros(1))


def test_no_time_limit_when_none() -> None:
    class Forever(Drift):
        max_episode_steps = None

    env = Forever(params={"gain": 0.5, "mode": "calm"})
    env.reset(seed=0)
    for _ in range(20):
        assert not env.step(np.zeros(1))[3]


def test_terminated_episode_needs_reset() -> None:
    env = Drift(max_episode_steps=100, params={"gain": 2.0, "mode": "calm"})
    env.reset(seed=0)
    term = False
    while not term:
        _, _, term, trunc, _ = env.step(np.ones(1))
        assert not trunc
    with pytest.raises(ResetNeeded, match=r"after the episode ended; call reset\(\) first"):
        env.step(np.ones(1))
    env.reset()
    env.step(np.ones(1))


def test_step_before_reset() -> None:
    env = Drift()
    with pytest.raises(
        ResetNeeded, match=r"step\(\) called before reset\(\); call reset\(\) first"
    ):
        env.step(np.zeros(1))
    with pytest.raises(ResetNeeded, match=r"get_state\(\) called before reset\(\)"):
        env.get_state()


def test_actions_validated_unless_disabled() -> None:
    env = Drift()
    env.reset(seed=0)
    with pytest.raises(InvalidAction, match=r"action must have shape \(1,\), got shape \(2,\)"):
        env.step(np.zeros(2))
    assert env.elapsed_steps == 0
    seen: list[Any] = []

    class Spy(Drift):
        def step_episode(self, action: Any, rng: np.random.Generator) -> Any:
            seen.append(action)
            return super().step_episode(np.zeros(1), rng)

    fast = Spy(validate_actions=False)
    fast.reset(seed=0)
    raw = np.array([5.0, 6.0])
    fast.step(raw)
    assert seen[-1] is raw  # no copy, no clip, no shape check
    checked = Spy()
    checked.reset(seed=0)
    checked.step(np.array([5.0]))
    assert seen[-1].tolist() == [1.0]


def test_raise_policy_from_metadata() -> None:
    class Strict(Drift):
        metadata = {"render_modes": [], "action_bounds": simkit.ActionBounds.RAISE}

    env = Strict()
    env.reset(seed=0)
    with pytest.raises(
        InvalidAction, match=r"action must lie in \[\[-1.0\], \[1.0\]\], got \[2.0\]"
    ):
        env.step(np.array([2.0]))


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (0, ValueError, r"max_episode_steps must be positive, got 0"),
        (-3, ValueError, r"max_episode_steps must be positive, got -3"),
        (2.5, TypeError, r"max_episode_steps must be an int or None, got float"),
        (True, TypeError, r"max_episode_steps must be an int or None, got bool"),
        (
            2**63,
            ValueError,
            r"max_episode_steps must be at most 2\*\*63 - 1 \(step counters are int64\), "
            r"got 9223372036854775808",
        ),
    ],
)
def test_max_episode_steps_validation(value: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Drift(max_episode_steps=value)
    with pytest.raises(error, match=match):
        simkit.make("simkit/BatchCartPole-v0", num_envs=2, max_episode_steps=value)


@pytest.mark.parametrize("kind", ["env", "batch"])
def test_a_snapshot_over_the_longest_time_limit_is_refused_whole(kind: str) -> None:
    """A limit past int64 wrapped in a torch batch's counters (every step truncated);
    a snapshot carrying one is refused, as a constructor argument is."""
    env: Any = simkit.make("simkit/CartPole-v0" if kind == "env" else "simkit/BatchCartPole-v0")
    env.reset(seed=0)
    state = env.get_state()
    state["max_episode_steps"] = 2**63
    with pytest.raises(InvalidState, match=r"state\['max_episode_steps'\] must be at most 2"):
        env.set_state(state)


def test_an_unsupported_render_mode_warns_as_gymnasium_does() -> None:
    """Gymnasium warns and keeps the mode (SB3's make_vec_env passes 'rgb_array' to
    every env): simkit does the same, with Gymnasium's words, once."""
    text = r"render_mode='human' that is not in the possible render_modes \(\[\]\)"
    with pytest.warns(UserWarning, match=text) as caught:
        env = Drift(render_mode="human")
    assert env.render_mode == "human"
    assert len(caught) == 1
    with pytest.warns(UserWarning, match=r"render_mode='rgb_array' that is not") as caught:
        env = gymnasium.make("simkit/Pendulum-v0", render_mode="rgb_array")
    assert env.unwrapped.render_mode == "rgb_array"
    assert len(caught) == 1  # gymnasium.make's warning; the env does not repeat it


def test_state_round_trip_continues_bit_identically() -> None:
    env = Drift(max_episode_steps=50)
    env.reset(seed=11)
    for t in range(3):
        env.step(np.array([0.1 * t]))
    state = env.get_state()
    wire = snapshot.loads(snapshot.dumps(state))
    assert snapshot.states_equal(wire, state)
    assert state["format"] == 1
    assert state["env"] == f"{__name__}:Drift"
    assert state["elapsed_steps"] == 3
    assert state["data"]["history"] == env.history
    expected = [env.step(np.array([0.3]))[:4] for _ in range(5)]
    for target in (env, Drift()):
        target.set_state(wire)
        got = [target.step(np.array([0.3]))[:4] for _ in range(5)]
        assert [(o.tobytes(), r, a, b) for o, r, a, b in got] == [
            (o.tobytes(), r, a, b) for o, r, a, b in expected
        ]


def test_state_restores_time_limit_and_episode_end() -> None:
    env = Drift(max_episode_steps=2, params={"gain": 0.5, "mode": "calm"})
    env.reset(seed=0)
    env.step(np.zeros(1))
    mid = env.get_state()
    env.step(np.zeros(1))
    ended = env.get_state()
    fresh = Drift()
    fresh.set_state(ended)
    with pytest.raises(ResetNeeded, match=r"after the episode ended"):
        fresh.step(np.zeros(1))
    fresh.set_state(mid)
    assert fresh.max_episode_steps == 2
    assert fresh.step(np.zeros(1))[3] is True


def test_state_shares_no_memory() -> None:
    env = Drift()
    env.reset(seed=0)
    env.step(np.zeros(1))
    state = env.get_state()
    before = snapshot.dumps(state)
    state["data"]["pos"][0] = 1e9
    state["data"]["history"].append(5.0)
    state["params"]["gain"] = 99.0
    assert env.pos[0] != 1e9
    assert env.history == [float(env.pos[0])]
    fresh = Drift()
    restore = snapshot.loads(before)
    fresh.set_state(restore)
    restore["data"]["pos"][0] = -1e9
    restore["data"]["history"].append(7.0)
    assert fresh.pos[0] != -1e9
    assert len(fresh.history) == 1
    env.step(np.zeros(1))
    assert snapshot.dumps(fresh.get_state()) == before


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (
            lambda s: s.pop("rng"),
            r"state is missing fields \['rng'\]; was it made by get_state\(\)\?",
        ),
        (lambda s: s.update(format=99), r"state format must be 1, got 99"),
        (lambda s: s.update(rng={"bit_generator": "PCG64", "state": 3}), r"malformed rng state"),
        (
            lambda s: s.update(elapsed_steps="3"),
            r"state\['elapsed_steps'\] must be an int >= 0, got '3'",
        ),
        (lambda s: s.update(elapsed_steps=-1), r"must be an int >= 0, got -1"),
        (
            lambda s: s.update(max_episode_steps=0),
            r"state\['max_episode_steps'\] must be a positive int, got 0",
        ),
        (
            lambda s: s.update(params=[1]),
            r"state\['params'\] must hold a value for each declared parameter \[.*\], got list",
        ),
        (
            lambda s: s.update(params={}),
            r"state\['params'\] must hold a value for each declared parameter "
            r"\['gain', 'mode', 'noise'\], got \[\]",
        ),
        (
            lambda s: s["params"].update(gain=-1e300),
            r"state\['params'\]: value for 'gain' must lie in its declared domain \[0.5, 2.0\]",
        ),
        (
            lambda s: s["params"].update(mode="storm"),
            r"value for 'mode' must lie in its declared domain one of \['calm', 'windy'\]",
        ),
        (
            lambda s: s["params"].update(gain=simkit.Uniform(0.6, 0.7)),
            r"state\['params'\]\['gain'\] must be a sampled value, got the distribution",
        ),
        (
            lambda s: s["rng"]["state"].update(state={"__int__": "0x" + "f" * 200}),
            r"malformed rng state in snapshot: OverflowError",
        ),
        (
            lambda s: s.update(episode_active=np.array([True, False])),
            r"state\['episode_active'\] must be a bool, got array",
        ),
        (
            lambda s: s.update(data={"pos": np.zeros(1)}),
            r"Drift state must hold \['history', 'pos'\], got \['pos'\]",
        ),
        (lambda s: s.update(data=5), r"Drift state must hold \['history', 'pos'\], got int"),
    ],
)
def test_malformed_state_rejected_and_env_untouched(mutate: Any, match: str) -> None:
    env = Drift()
    env.reset(seed=0)
    env.step(np.zeros(1))
    good = env.get_state()
    bad = env.get_state()
    mutate(bad)
    victim = Drift()
    victim.reset(seed=1)
    before = snapshot.dumps(victim.get_state())
    with pytest.raises(InvalidState, match=match):
        victim.set_state(bad)
    assert snapshot.dumps(victim.get_state()) == before
    victim.set_state(good)


def test_state_from_another_class_or_not_a_dict() -> None:
    other = Other()
    other.reset(seed=0)
    env = Drift()
    with pytest.raises(
        InvalidState, match=rf"state belongs to env '{__name__}:Other', expected '{__name__}:Drift'"
    ):
        env.set_state(other.get_state())
    with pytest.raises(InvalidState, match=r"state must be a dict from get_state\(\), got bytes"):
        env.set_state(b"x")  # type: ignore[arg-type]


def test_missing_state_attributes() -> None:
    env = NoState()
    env.reset(seed=0)
    with pytest.raises(
        NotImplementedError,
        match=r"NoState must declare state_attributes or override get_env_state\(\)",
    ):
        env.get_state()
    with pytest.raises(NotImplementedError, match=r"override set_env_state\(\)"):
        env.set_env_state({})


def test_unimplemented_hooks_named() -> None:
    class Bare(simkit.Env[Any, Any]):
        action_space = spaces.Discrete(2)

    env = Bare()
    with pytest.raises(NotImplementedError, match=r"Bare must implement reset_episode\(\)"):
        env.reset()


def test_cartpole_passes_gymnasium_check_env() -> None:
    gym_check_env(gymnasium.make("simkit/CartPole-v0").unwrapped)


def test_gymnasium_make_adds_no_time_limit() -> None:
    env = gymnasium.make("simkit/CartPole-v0")
    wrapper: Any = env
    while isinstance(wrapper, gymnasium.Wrapper):
        assert not isinstance(wrapper, gymnasium.wrappers.TimeLimit)
        wrapper = wrapper.env
    assert env.spec is not None
    assert env.spec.max_episode_steps is None
    env.reset(seed=0, options={"params": {"gravity": 9.3}})
    steps, trunc = 0, False
    while not trunc:
        state = env.unwrapped.state
        action = int(state[2] + 0.5 * state[3] > 0)  # a balancing controller
        _, _, term, trunc, _ = env.step(action)
        assert not term
        steps += 1
    assert steps == 500


@pytest.mark.parametrize(
    ("reward", "got"),
    [(np.array([1.0]), "ndarray of shape (1,)"), ("1", "str"), (None, "NoneType"), (1j, "complex")],
)
def test_a_reward_that_is_not_a_real_number_is_named(reward: Any, got: str) -> None:
    """``float(reward)`` raised numpy's "only 0-dimensional arrays can be converted"
    (or accepted the string "1"): the error now says what the hook must return."""

    class BadReward(Drift):
        def step_episode(self, action: Any, rng: np.random.Generator) -> Any:
            obs, _, terminated, info = super().step_episode(action, rng)
            return obs, reward, terminated, info

    env = BadReward()
    env.reset(seed=0)
    with pytest.raises(
        TypeError,
        match=rf"^step_episode must return the reward as a real number "
        rf"\(a float, int or numpy scalar\), got {re.escape(got)}$",
    ):
        env.step(np.zeros(1))
    for fine in (np.float32(0.5), np.array(2.0), 3, True):
        BadReward.step_episode = lambda self, a, rng, r=fine: (self.pos.copy(), r, False, {})  # type: ignore[method-assign]
        env.reset(seed=0)
        assert env.step(np.zeros(1))[1] == float(fine)
