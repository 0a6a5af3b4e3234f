"""simkit.vector: Gymnasium parity, seeding, async stepping, snapshots, multi-agent rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from hypothesis import given
from hypothesis import strategies as st

import simkit
from simkit._seeding import episode_seed
from simkit.errors import InvalidAction, InvalidState, ResetNeeded
from simkit.snapshot import dumps, loads
from simkit.vector import MultiAgentVectorEnv, VectorEnv

CARTPOLE = "simkit/CartPole-v0"
SHORT = {"max_episode_steps": 12}


def _tree_equal(a: Any, b: Any, path: str = "") -> None:
    """Asserts bit-exact equality of two result trees (dicts, sequences, arrays)."""
    if isinstance(a, dict):
        assert isinstance(b, dict), path
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            _tree_equal(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, tuple | list):
        assert type(a) is type(b), path
        assert len(a) == len(b), path
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _tree_equal(x, y, f"{path}[{k}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), path
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (
            f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        )
        if a.dtype == object:
            for k in range(len(a)):
                _tree_equal(a[k], b[k], f"{path}[{k}]")
        else:
            assert a.tobytes() == b.tobytes(), f"{path}: {a} != {b}"
    else:
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert a == b, f"{path}: {a!r} != {b!r}"


class _DerivedSeeds(gym.Wrapper[Any, Any, Any, Any]):
    """Seeds every episode of env ``index`` with ``episode_seed(root, index, k)``."""

    def __init__(self, env: gym.Env[Any, Any], root: int, index: int) -> None:
        super().__init__(env)
        self.root, self.index, self.k = root, index, -1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.k += 1
        return self.env.reset(seed=episode_seed(self.root, self.index, self.k), options=options)


def _run_parity(
    ours: Any, theirs: Any, n: int, steps: int, reset_ours: Any, reset_theirs: Any
) -> int:
    _tree_equal(reset_ours(), reset_theirs())
    rng = np.random.default_rng(7)
    ends = 0
    for _ in range(steps):
        actions = rng.integers(0, 2, n)
        a, b = ours.step(actions), theirs.step(actions)
        for x, y, name in zip(
            a, b, ("obs", "reward", "terminated", "truncated", "info"), strict=True
        ):
            _tree_equal(x, y, name)
        ends += int(np.sum(a[2] | a[3]))
    return ends


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("num_threads", [1, 3])
def test_parity_with_sync_vector_env_root_seed(mode: AutoresetMode, num_threads: int) -> None:
    n, root = 5, 123
    ours = VectorEnv(CARTPOLE, n, num_threads=num_threads, autoreset_mode=mode, env_kwargs=SHORT)
    fns = [(lambda i=i: _DerivedSeeds(simkit.make(CARTPOLE, **SHORT), root, i)) for i in range(n)]
    theirs = SyncVectorEnv(fns, autoreset_mode=mode)
    assert ours.metadata["autoreset_mode"] is theirs.metadata["autoreset_mode"] is mode
    assert ours.observation_space == theirs.observation_space
    assert ours.action_space == theirs.action_space
    ends = _run_parity(
        ours, theirs, n, 40, lambda: ours.reset(seed=root), lambda: theirs.reset(seed=None)
    )
    assert ends >= n  # several autoresets (truncations at 12 steps) were compared
    ours.close()
    theirs.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_parity_with_sync_vector_env_list_seeds(mode: AutoresetMode) -> None:
    n = 4
    ours = VectorEnv(CARTPOLE, n, autoreset_mode=mode)
    theirs = SyncVectorEnv([lambda: simkit.make(CARTPOLE) for _ in range(n)], autoreset_mode=mode)
    ends = _run_parity(
        ours,
        theirs,
        n,
        60,
        lambda: ours.reset(seed=[10, 11, 12, 13]),
        lambda: theirs.reset(seed=10),
    )
    assert ends >= 1
    assert ours.root_seeds == [None] * n


def test_record_episode_statistics_reports_returns() -> None:
    v = RecordEpisodeStatistics(VectorEnv(CARTPOLE, 3, env_kwargs=SHORT))
    v.reset(seed=0)
    returns = np.zeros(3)
    seen = 0
    for _ in range(30):
        _, reward, term, trunc, info = v.step(np.ones(3, dtype=np.int64))
        returns += reward
        done = term | trunc
        if done.any():
            assert np.array_equal(info["_episode"], done)
            np.testing.assert_allclose(info["episode"]["r"][done], returns[done])
            seen += int(done.sum())
            returns[done] = 0.0
    assert seen >= 3


def test_no_gymnasium_vector_checker_exists() -> None:
    # docs/vector.md says Gymnasium 1.4 ships no vector-env checker; this pins it.
    import gymnasium.utils.env_checker as checker

    assert not [name for name in dir(checker) if "vec" in name.lower()]
    assert gym.__version__.startswith("1.")


def _policy(env_id: int, obs: np.ndarray) -> int:
    return int((obs[2] + 0.01 * env_id) > 0)


def _trajectories_sync(n: int, threads: int, root: int, steps: int) -> list[list[bytes]]:
    v = VectorEnv(CARTPOLE, n, num_threads=threads, env_kwargs=SHORT)
    obs, _ = v.reset(seed=root)
    out: list[list[bytes]] = [[obs[i].tobytes()] for i in range(n)]
    for _ in range(steps):
        actions = np.array([_policy(i, obs[i]) for i in range(n)])
        b = v.step_batch(actions)
        for i in range(n):
            out[i] += [b.final_obs[i].tobytes(), b.reward[i].tobytes(), b.obs[i].tobytes()]
        obs = b.obs
    v.close()
    return out


@given(
    n=st.integers(2, 6),
    threads=st.integers(2, 4),
    batch=st.integers(1, 6),
    root=st.integers(0, 2**63 - 1),
)
def test_same_root_seed_same_trajectories_any_schedule(
    n: int, threads: int, batch: int, root: int
) -> None:
    steps = 16
    reference = _trajectories_sync(n, 1, root, steps)
    assert _trajectories_sync(n, threads, root, steps) == reference
    for t in (1, threads):
        v = VectorEnv(CARTPOLE, n, num_threads=t, batch_size=min(batch, n), env_kwargs=SHORT)
        v.async_reset(seed=root)
        got: list[list[bytes]] = [[] for _ in range(n)]
        counts = np.zeros(n, dtype=np.int64)
        while counts.min() <= steps:
            b = v.recv()
            ids = b.env_ids
            for k, i in enumerate(ids):
                if counts[i] == 0:
                    got[i].append(b.obs[k].tobytes())
                else:
                    got[i] += [b.final_obs[k].tobytes(), b.reward[k].tobytes(), b.obs[k].tobytes()]
                counts[i] += 1
            v.send(np.array([_policy(int(i), b.obs[k]) for k, i in enumerate(ids)]), ids)
        v.close()
        for i in range(n):
            assert got[i][: len(reference[i])] == reference[i]


def test_final_obs_never_lost_matches_single_env_runs() -> None:
    n, root, steps = 3, 99, 50
    v = VectorEnv(CARTPOLE, n, num_threads=2, env_kwargs=SHORT)
    v.reset(seed=root)
    lengths: list[list[int]] = [[] for _ in range(n)]
    finals: list[list[bytes]] = [[] for _ in range(n)]
    current = np.zeros(n, dtype=np.int64)
    for t in range(steps):
        b = v.step_batch((np.arange(n) + t) % 2)
        current += 1
        for i in np.flatnonzero(b.done):
            lengths[i].append(int(current[i]))
            finals[i].append(b.final_obs[i].tobytes())
            assert "reset_info" in b.infos[i]
            assert not np.array_equal(b.obs[i], b.final_obs[i])
            current[i] = 0
    for i in range(n):
        env = simkit.make(CARTPOLE, **SHORT)
        t = 0
        for ep, length in enumerate(lengths[i]):
            env.reset(seed=episode_seed(root, i, ep))
            for step in range(length):
                obs, _, term, trunc, _ = env.step(int((i + t) % 2))
                t += 1
                assert (term or trunc) == (step == length - 1)
            assert obs.tobytes() == finals[i][ep]
        assert sum(lengths[i]) + int(current[i]) == steps


def test_per_env_params_are_honoured() -> None:
    gravities = [9.4, 9.8, 10.2]
    v = VectorEnv(CARTPOLE, 3, params=[{"gravity": g} for g in gravities])
    _, info = v.reset(seed=0)
    assert info["params"]["gravity"].tolist() == gravities
    assert [e.unwrapped.params["gravity"] for e in v.envs] == gravities
    with pytest.raises(ValueError, match="list of 3 mappings, got 2"):
        VectorEnv(CARTPOLE, 3, params=[{}, {}])


def test_get_set_state_continues_bit_identically() -> None:
    v = VectorEnv(CARTPOLE, 4, num_threads=2, env_kwargs=SHORT)
    v.reset(seed=5)
    for t in range(7):
        v.step_batch(np.full(4, t % 2))
    state = loads(dumps(v.get_state()))
    other = VectorEnv(CARTPOLE, 4, env_kwargs=SHORT)
    other.set_state(state)
    for t in range(30):
        a, b = v.step_batch(np.full(4, t % 3 % 2)), other.step_batch(np.full(4, t % 3 % 2))
        _tree_equal(a.obs, b.obs)
        _tree_equal(a.final_obs, b.final_obs)
        _tree_equal(a.reward, b.reward)
    assert np.array_equal(v.episode_index, other.episode_index)
    with pytest.raises(InvalidState, match="holds 4 envs, this vector has 2"):
        VectorEnv(CARTPOLE, 2).set_state(state)


def test_bad_actions_name_the_env() -> None:
    v = VectorEnv(CARTPOLE, 3)
    v.reset(seed=0)
    with pytest.raises(InvalidAction, match=r"env \[2\] got \[5\]"):
        v.step(np.array([0, 1, 5]))
    with pytest.raises(InvalidAction, match=r"shape \(3,\), got shape \(2,\)"):
        v.step(np.array([0, 1]))
    with pytest.raises(InvalidAction, match="integer array"):
        v.step(np.array([0.0, 1.0, 0.0]))
    box = VectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(3)])
    box.reset(seed=0)
    with pytest.raises(InvalidAction, match=r"no NaN or inf\); env \[1\] are not"):
        box.step(np.array([[0.0], [np.nan], [0.0]], dtype=np.float32))
    box.close()


def test_disabled_mode_and_reset_mask() -> None:
    v = VectorEnv(
        CARTPOLE, 2, autoreset_mode=AutoresetMode.DISABLED, env_kwargs={"max_episode_steps": 2}
    )
    v.reset(seed=1)
    v.step(np.zeros(2, dtype=np.int64))
    _, _, _, trunc, _ = v.step(np.zeros(2, dtype=np.int64))
    assert trunc.all()
    with pytest.raises(ResetNeeded, match="env 0 ended its episode"):
        v.step(np.zeros(2, dtype=np.int64))
    v.reset(options={"reset_mask": np.array([True, True])})
    assert v.episode_index.tolist() == [1, 1]
    v.step(np.zeros(2, dtype=np.int64))


def test_async_misuse_is_explained() -> None:
    v = VectorEnv(CARTPOLE, 3, num_threads=2, batch_size=2)
    v.async_reset(seed=0)
    v.recv()
    with pytest.raises(ValueError, match=r"envs \[2\] are already in flight"):
        v.send(np.zeros(1, dtype=np.int64), [2])
    with pytest.raises(RuntimeError, match="recv\\(\\) needs 2 envs in flight, only 1"):
        v.recv()
    with pytest.raises(RuntimeError, match="in flight"):
        v.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="batch_size must be <= num_envs=3"):
        VectorEnv(CARTPOLE, 3, batch_size=4)
    v.close()


def test_step_async_wait_matches_step() -> None:
    a = VectorEnv(
        CARTPOLE, 4, num_threads=2, autoreset_mode=AutoresetMode.NEXT_STEP, env_kwargs=SHORT
    )
    b = VectorEnv(CARTPOLE, 4, autoreset_mode=AutoresetMode.NEXT_STEP, env_kwargs=SHORT)
    _tree_equal(a.reset(seed=3), b.reset(seed=3))
    for t in range(20):
        actions = np.full(4, t % 2)
        a.step_async(actions)
        _tree_equal(a.step_wait(), b.step(actions))
    a.close()


def test_make_vec() -> None:
    v = simkit.make_vec(CARTPOLE, 2, num_threads=2)
    assert isinstance(v, gym.vector.VectorEnv)
    assert v.num_envs == 2
    assert v.observation_space.shape == (2, 4)
    v.close()


class _Tag(simkit.MultiAgentEnv[str, np.ndarray, int]):
    """Two agents walking to +3; ``a`` is done when it gets there, ``b`` at a time limit."""

    max_episode_steps = 8
    state_attributes = ("pos",)

    def __init__(self, hetero: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.possible_agents = ["a", "b"]
        box = spaces.Box(-10, 10, (1,), np.float32)
        self.observation_spaces = {"a": box, "b": box}
        self.action_spaces = {"a": spaces.Discrete(2), "b": spaces.Discrete(3 if hetero else 2)}
        self.pos = np.zeros(2)

    def reset_episode(self, rng: np.random.Generator, params: Any, options: Any) -> Any:
        self.pos = rng.integers(-2, 1, size=2).astype(np.float64)
        return {a: self.pos[k : k + 1].astype(np.float32) for k, a in enumerate(self.agents)}, {}

    def step_episode(self, actions: dict[str, int], rng: np.random.Generator) -> Any:
        for agent, act in actions.items():
            k = self.possible_agents.index(agent)
            self.pos[k] += 1.0 if act == 1 else -1.0
        obs = {
            a: self.pos[self.possible_agents.index(a) : self.possible_agents.index(a) + 1].astype(
                np.float32
            )
            for a in actions
        }
        terms = {a: a == "a" and self.pos[0] >= 3 for a in actions}
        return obs, {a: float(self.pos[self.possible_agents.index(a)]) for a in actions}, terms, {}


def test_multi_agent_rows_mask_and_autoreset() -> None:
    v = MultiAgentVectorEnv([_Tag, _Tag, _Tag])
    obs, mask, _ = v.reset(seed=4)
    assert obs.shape == (6, 1)
    assert mask.all()
    ep = v.episode_index
    saw_partial = saw_reset = False
    snapshot = None
    for t in range(20):
        if t == 3:
            snapshot = loads(dumps(v.get_state()))
        b = v.step(np.ones(6, dtype=np.int64))
        assert np.array_equal(b.acted, mask)
        assert not b.done[~b.acted].any()
        assert not b.obs[~b.agent_mask].any()
        assert not b.reward[~b.acted].any()
        partial = b.agent_mask.reshape(3, 2)
        saw_partial |= bool((partial[:, 0] != partial[:, 1]).any())
        for i in np.flatnonzero(b.env_reset):
            saw_reset = True
            assert b.agent_mask[2 * i : 2 * i + 2].all()
            assert "reset_info" in b.infos[2 * i]
            assert b.truncated[2 * i + 1]  # b's final step was the time limit
        mask = b.agent_mask
    assert saw_partial
    assert saw_reset
    assert (v.episode_index > ep).all()
    w = MultiAgentVectorEnv([_Tag, _Tag, _Tag])
    w.reset(seed=0)
    assert snapshot is not None
    w.set_state(snapshot)
    v.set_state(snapshot)
    for _ in range(12):
        x, y = v.step(np.ones(6, dtype=np.int64)), w.step(np.ones(6, dtype=np.int64))
        _tree_equal(x.obs, y.obs)
        _tree_equal(x.final_obs, y.final_obs)
        _tree_equal(x.agent_mask, y.agent_mask)


def test_multi_agent_errors() -> None:
    with pytest.raises(ValueError, match="homogeneous agents"):
        MultiAgentVectorEnv([lambda: _Tag(hetero=True)])
    v = MultiAgentVectorEnv([_Tag, _Tag])
    v.reset(seed=0)
    with pytest.raises(
        InvalidAction, match=r"action for env 1 agent 'a' \(row 2\) must be in \[0, 2\)"
    ):
        v.step(np.array([0, 1, 7, 0]))


def test_goal_nav_vector_steers_agents_and_snapshots() -> None:
    v = MultiAgentVectorEnv("simkit/GoalNav-v0", 2, env_kwargs={"max_episode_steps": 15})
    obs, mask, infos = v.reset(seed=11)
    assert obs.shape == (6, 12)
    assert mask.all()
    assert infos[0]["params"] == infos[1]["params"]  # agents of one env share params
    state = loads(dumps(v.get_state()))

    def steer(o: np.ndarray) -> np.ndarray:
        return np.clip(o[:, 4:6] * 4.0, -1.0, 1.0).astype(np.float32)

    resets, first = 0, []
    for _ in range(40):
        b = v.step(steer(obs))
        first.append(b.final_obs.tobytes())
        resets += int(b.env_reset.sum())
        assert not b.reward[~b.acted].any()
        obs = b.obs
    assert resets >= 2
    assert int(v.episode_index.sum()) == resets
    w = MultiAgentVectorEnv("simkit/GoalNav-v0", 2, env_kwargs={"max_episode_steps": 15})
    w.set_state(state)
    obs = loads(dumps(state))["obs_rows"]
    for k in range(40):
        b = w.step(steer(obs))
        assert b.final_obs.tobytes() == first[k]
        obs = b.obs


def test_vector_of_cartpoles_equals_batch_cartpole() -> None:
    # One seed derivation for both batched styles: env i of a VectorEnv and instance i
    # of the BatchEnv see the same episode seeds, so their data is bit-identical.
    batch = simkit.make("simkit/BatchCartPole-v0", num_envs=3, **SHORT)
    vec = VectorEnv(CARTPOLE, 3, env_kwargs=SHORT)
    _tree_equal(batch.reset(seed=5)[0], vec.reset(seed=5)[0])
    ends = 0
    for t in range(40):
        actions = np.array([t % 2, (t // 2) % 2, 1])
        x, y = batch.step_batch(actions), vec.step_batch(actions)
        for name in ("obs", "final_obs", "reward", "terminated", "truncated"):
            _tree_equal(getattr(x, name), getattr(y, name), name)
        ends += int(y.done.sum())
    assert ends >= 3


def test_worker_threads_stop_on_close_and_collection() -> None:
    import gc
    import threading

    def workers() -> int:
        return sum(t.name.startswith("simkit-vector") for t in threading.enumerate())

    before = workers()
    v = VectorEnv(CARTPOLE, 4, num_threads=3)
    assert workers() == before + 3
    v.close()
    assert workers() == before
    v = VectorEnv(CARTPOLE, 4, num_threads=2)
    del v
    gc.collect()
    assert workers() == before


def test_exiting_with_steps_in_flight_does_not_crash(tmp_path: Path) -> None:
    # The documented send/recv loop ends with steps still running on the worker threads;
    # the interpreter tore MuJoCo down under them (exit by SIGSEGV) unless they are stopped
    # first.
    script = (
        "import numpy as np\n"
        "from simkit.vector import VectorEnv\n"
        "envs = VectorEnv('simkit/Cheetah-v0', 64, num_threads=2, batch_size=16)\n"
        "envs.async_reset(seed=0)\n"
        "for _ in range(20):\n"
        "    step = envs.recv()\n"
        "    envs.send(np.zeros((len(step.env_ids), 6), np.float32), step.env_ids)\n"
        "print('done')\n"
    )
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        assert (done.returncode, done.stdout.strip()) == (0, "done"), done.stderr[-2000:]


@pytest.mark.parametrize("env_id", ["simkit/CartPole-v0", "simkit/GoalNav-v0"])
def test_the_row_face_is_the_step_without_infos(env_id: str) -> None:
    """``step_rows``/``reset_rows`` give the rows ``step_batch`` (``step`` for many
    agents) gives, as fresh arrays, for either vector; episodes end on the way."""

    def vector() -> Any:
        if env_id.endswith("GoalNav-v0"):
            return MultiAgentVectorEnv(env_id, 3)
        return VectorEnv(env_id, 3)

    rows, typed = vector(), vector()
    obs, mask = rows.reset_rows(7)
    if isinstance(typed, MultiAgentVectorEnv):
        want_obs, want_mask, _ = typed.reset(seed=7)
    else:
        (want_obs, _), want_mask = typed.reset(seed=7), np.ones(3, dtype=np.bool_)
    assert np.array_equal(obs, want_obs)
    assert np.array_equal(mask, want_mask)
    space = rows.single_action_space
    space.seed(0)
    ended = 0
    for _ in range(210):
        n = obs.shape[0]
        actions = np.stack([space.sample() for _ in range(n)]) if n else None
        got = rows.step_rows(actions)
        if isinstance(typed, MultiAgentVectorEnv):
            want = typed.step(actions)
            want_mask = want.agent_mask
        else:
            want = typed.step_batch(actions)
            want_mask = np.ones(3, dtype=np.bool_)
        for name in ("obs", "reward", "terminated", "truncated", "final_obs"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
        assert np.array_equal(got.mask, want_mask)
        assert got.reward.dtype == np.float64
        ended += int((got.terminated | got.truncated).sum())
        got.obs[...] = 0  # fresh arrays: the next step is not disturbed
        obs = got.obs
    assert ended > 0
    rows.close()
    typed.close()


@pytest.mark.parametrize("multi_agent", [False, True])
def test_a_reset_refused_for_an_override_advances_no_episode_counter(multi_agent: bool) -> None:
    """Gymnasium-style ``reset(options={"params": ...})`` of every env: an override no
    env declares is refused before any seed is planned, so the next reset draws what it
    would have drawn (before, every env's episode counter advanced first)."""
    from simkit.errors import InvalidParameter

    def make() -> Any:
        if multi_agent:
            return MultiAgentVectorEnv("simkit/GoalNav-v0", 2)
        return simkit.vector.make_vec("simkit/CartPole-v0", 2)

    refused, plain = make(), make()
    for vec in (refused, plain):
        vec.reset(seed=3)
    with pytest.raises(InvalidParameter, match="bogus"):
        refused.reset(options={"params": {"bogus": 1}})
    assert refused.episode_index.tolist() == [0, 0]
    np.testing.assert_array_equal(refused.reset()[0], plain.reset()[0])


@pytest.mark.parametrize("multi_agent", [False, True])
def test_a_list_of_seeds_refused_for_a_bad_entry_changes_no_seeding(multi_agent: bool) -> None:
    """``reset(seed=[5, -1])`` was refused only at the bad entry, after env 0 had been
    given seed 5's episode counter and lost its root: the next plain reset differed."""

    def make() -> Any:
        if multi_agent:
            return MultiAgentVectorEnv("simkit/GoalNav-v0", 2)
        return simkit.vector.make_vec("simkit/CartPole-v0", 2)

    refused, plain = make(), make()
    for vec in (refused, plain):
        vec.reset(seed=0)
    with pytest.raises(ValueError, match=r"seed\[1\] must be an int (in \[0, 2\*\*64\) )?or None"):
        refused.reset(seed=[5, -1])
    with pytest.raises(ValueError, match=r"seed\[1\] must be an int (in \[0, 2\*\*64\) )?or None"):
        refused.reset_envs([0, 1], seeds=[7, "x"])
    assert dumps(refused.seeds.get_state()) == dumps(plain.seeds.get_state())
    np.testing.assert_array_equal(refused.reset()[0], plain.reset()[0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"params": {"x": 1}}, r"params must be a sequence of 2 entries, one per env id, got dict"),
        ({"params": [None]}, r"params must be a sequence of 2 entries, one per env id, got 1"),
        ({"params": [None] * 3}, r"params must be a sequence of 2 entries, one per env id, got 3"),
        ({"params": [None, 5]}, r"params\[1\] must be a mapping .* or None, got int"),
        ({"seeds": [1]}, r"seeds must be a sequence of 2 entries, one per env id, got 1"),
        ({"seeds": 7}, r"seeds must be a sequence of 2 entries, one per env id, got int"),
        ({"seed": 1, "seeds": [1, 2]}, r"seed .* or seeds .*, not both"),
    ],
)
def test_reset_envs_refuses_malformed_arguments_and_changes_nothing(
    kwargs: dict[str, Any], match: str
) -> None:
    """``reset_envs``'s per-env arguments must hold one entry per id: a params mapping
    raised a bare KeyError, short params an IndexError, short seeds zip's message, extra
    entries were ignored, and ``seed`` with ``seeds`` silently dropped ``seeds``."""
    refused, plain = (simkit.vector.make_vec(CARTPOLE, 3) for _ in range(2))
    for vec in (refused, plain):
        vec.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        refused.reset_envs([0, 2], **kwargs)
    assert dumps(refused.seeds.get_state()) == dumps(plain.seeds.get_state())
    np.testing.assert_array_equal(refused.reset()[0], plain.reset()[0])


@pytest.mark.parametrize(
    ("ids", "match"),
    [([-1], r"must lie in \[0, 3\)"), ([3], r"must lie in \[0, 3\)"), ([1, 1], "must not repeat")],
)
def test_env_state_ids_are_checked(ids: list[int], match: str) -> None:
    """``get_env_states([-1])`` read the last env and ``set_env_states([-1], ...)`` wrote
    it (numpy's negative index); a repeated id restored one env twice."""
    vec = simkit.vector.make_vec(CARTPOLE, 3)
    vec.reset(seed=0)
    before = dumps(vec.get_state())
    with pytest.raises(ValueError, match=match):
        vec.get_env_states(ids)
    good = vec.get_env_states(list(range(len(ids))))
    with pytest.raises(ValueError, match=match):
        vec.set_env_states(ids, good)
    assert dumps(vec.get_state()) == before


def test_set_env_states_needs_one_state_per_id() -> None:
    """A short list of states restored the envs it covered, then failed in zip."""
    vec = simkit.vector.make_vec(CARTPOLE, 3)
    vec.reset(seed=0)
    states = vec.get_env_states([0, 1])
    vec.step(np.ones(3, dtype=np.int64))
    before = dumps(vec.get_state())
    with pytest.raises(ValueError, match=r"one state per env id: 2 ids, got 1 states"):
        vec.set_env_states([0, 1], states[:1])
    assert dumps(vec.get_state()) == before


def test_multi_agent_reset_mask_resets_only_the_masked_envs() -> None:
    """``MultiAgentVectorEnv.reset(options={"reset_mask": m})`` passed the mask on to
    every env's own reset and reset them all; now it resets the masked envs, as
    ``VectorEnv`` does, and leaves the others' rows as they were."""
    vec, ref = (MultiAgentVectorEnv("simkit/GoalNav-v0", 3) for _ in range(2))
    for v in (vec, ref):
        v.reset(seed=4)
    a = vec.num_agents
    actions = np.stack([vec.single_action_space.sample() for _ in range(3 * a)])
    for v in (vec, ref):
        v.step(actions)
    before = vec.get_env_states([0, 2])
    mask = np.array([False, True, False])
    obs, _, infos = vec.reset(options={"reset_mask": mask})
    assert len(infos) == 3 * a
    assert all(info == {} for info in infos[:a] + infos[2 * a :])
    assert dumps(vec.get_env_states([0, 2])) == dumps(before)
    assert vec.episode_index.tolist() == [0, 1, 0]
    ref_obs, _ = ref.reset_envs([1])
    np.testing.assert_array_equal(obs[a : 2 * a], ref_obs)
    with pytest.raises(ValueError, match=r"reset_mask'\] must be a bool array of shape \(3,\)"):
        vec.reset(options={"reset_mask": [True]})


@pytest.mark.parametrize(
    ("env_id", "hint"),
    [
        ("simkit/BatchCartPole-v0", "a vector itself"),
        ("simkit/GoalNav-v0", "simkit.vector.MultiAgentVectorEnv steps those"),
    ],
)
def test_a_vector_of_batch_or_multi_agent_envs_is_refused_by_kind(env_id: str, hint: str) -> None:
    """make_vec of a batch id built a VectorEnv of BatchEnvs that failed at reset with a
    seed out of range; of a multi-agent id, "every env must share one observation space;
    env 0 has <bound method ...>"."""
    with pytest.raises(TypeError, match=rf"^env 0 must be a gymnasium\.Env, got \w+, .*{hint}"):
        simkit.vector.make_vec(env_id, 2)


def test_empty_env_ids_are_refused_in_one_line() -> None:
    """``step_envs([])``, ``reset_envs([])`` and ``send([])`` failed in numpy ("need at
    least one array to stack"); a remote vector already said "env_ids must not be empty"."""
    vec = simkit.vector.make_vec(CARTPOLE, 2)
    multi = MultiAgentVectorEnv("simkit/GoalNav-v0", 2)
    vec.reset(seed=0)
    multi.reset(seed=0)
    empty = np.zeros(0, dtype=np.int64)
    for call in (
        lambda: vec.step_envs(empty, np.zeros(0, dtype=np.int64)),
        lambda: vec.reset_envs(empty),
        lambda: vec.send(np.zeros(0, dtype=np.int64), empty),
        lambda: multi.step_envs(empty, np.zeros((0, 2), dtype=np.float32)),
    ):
        with pytest.raises(ValueError, match=r"^env_ids must not be empty$"):
            call()
    vec.step(np.zeros(2, dtype=np.int64))  # nothing moved, nothing in flight


def test_set_attr_sets_each_envs_attribute_as_gymnasium_does() -> None:
    """``SyncVectorEnv.set_attr`` worked; simkit's vector had none (AttributeError)."""
    vec = simkit.vector.make_vec(CARTPOLE, 3)
    ref = SyncVectorEnv([lambda: simkit.make(CARTPOLE) for _ in range(3)])
    for v in (vec, ref):
        v.set_attr("tag", [1, 2, 3])
        assert v.get_attr("tag") == (1, 2, 3)
        v.set_attr("tag", "all")
        assert v.get_attr("tag") == ("all",) * 3
    with pytest.raises(ValueError, match=r"3 values, got 2$"):
        vec.set_attr("tag", [1, 2])


def test_info_row_inverts_gymnasiums_vector_info_for_every_reader() -> None:
    """``info_row`` gives back each env's info from what ``_add_info`` built (nested
    maps, rows without a key), leaves out masks and keys without one; the recorder, the
    BatchEnv server, the SB3 adapter and the kit read vector infos with this one
    function (three copies once disagreed on keys without a mask)."""
    import importlib
    import importlib.util

    from simkit.vector._vector import info_row

    rows = [{"a": 1, "p": {"g": 9.8}}, {}, {"a": 3, "p": {"g": 9.4, "l": 0.5}}]
    sync = SyncVectorEnv([lambda: simkit.make("simkit/CartPole-v0")] * 3)
    info: dict[str, Any] = {}
    for i, row in enumerate(rows):
        info = sync._add_info(info, row, i)
    sync.close()
    assert [info_row(info, i) for i in range(3)] == rows
    info["unmasked"] = np.arange(3)
    assert [info_row(info, i) for i in range(3)] == rows
    readers = ["simkit.servers._batch_host", "simkit.recording._wrapper"]
    if importlib.util.find_spec("stable_baselines3") is not None:  # the sb3 extra
        readers.append("simkit.integrations.sb3")
    assert all(importlib.import_module(name).info_row is info_row for name in readers)
