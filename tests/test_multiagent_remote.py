"""Multi-agent serving: remote equals local, the PettingZoo API remotely, bad input refused."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test, parallel_seed_test

import simkit
from simkit import snapshot
from simkit.clients import RemoteMultiAgentVectorEnv, RemoteParallelEnv, RemoteVectorEnv
from simkit.protocol import (
    ClientSession,
    Message,
    RemoteError,
    decode,
    encode,
    parse_multi_agent_reset,
    parse_multi_agent_step,
)
from simkit.servers import ParallelEnvHost, RolloutServer, is_multi_agent_id
from simkit.vector import MultiAgentBatchStep, MultiAgentVectorEnv

GOALNAV = "simkit/GoalNav-v0"
GOALNAV_KW = {"n_agents": 3, "max_episode_steps": 6}
TINY = f"pz:{__name__}:make_tiny"
FAULTY = f"pz:{__name__}:make_faulty"
STEP_FIELDS = ("obs", "agent_mask", "reward", "terminated", "truncated", "final_obs", "acted")


class Tiny(ParallelEnv[str, np.ndarray, np.int64]):
    """A plain PettingZoo env: agent "b" leaves after one step, "a" is truncated at 3."""

    metadata: dict[str, Any] = {"render_modes": [], "name": "tiny_v0"}

    def __init__(self, b_space: spaces.Space[Any] | None = None) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self._obs = spaces.Box(-10.0, 10.0, (2,), np.float32)
        self._act = spaces.Discrete(3)
        self._b_act = b_space or self._act
        self.rng = np.random.default_rng()
        self.t = 0

    @functools.cache  # noqa: B019
    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self._obs

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self._b_act if agent == "b" else self._act

    def _o(self) -> np.ndarray:
        return self.rng.uniform(-1, 1, 2).astype(np.float32)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        return {a: self._o() for a in self.agents}, {a: {"t": 0} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
        if set(actions) != set(self.agents):
            raise ValueError(f"actions for {sorted(actions)}, live {self.agents}")
        self.t += 1
        obs = {a: self._o() + float(actions[a]) for a in self.agents}
        rew = {a: float(actions[a]) for a in self.agents}
        term = {a: a == "b" for a in self.agents}
        trunc = {a: self.t >= 3 for a in self.agents}
        infos = {a: {"t": self.t} for a in self.agents}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, infos


FAIL_RESET = {"on": False}
"""Makes :class:`Faulty` resets raise (the server runs in this process)."""


class Faulty(Tiny):
    """Tiny, but agent a's action 2 raises in step, and resets raise while FAIL_RESET."""

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        if FAIL_RESET["on"]:
            raise OSError("reset broke")
        return super().reset(seed, options)

    def step(self, actions: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
        if "a" in actions and int(actions["a"]) == 2:
            raise RuntimeError("boom")
        return super().step(actions)


def make_tiny() -> Tiny:
    return Tiny()


def make_faulty() -> Tiny:
    return Faulty()


def make_mixed() -> Tiny:
    return Tiny(b_space=spaces.Discrete(5))


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``serve(env_id, num_envs, **env_kwargs)``: the endpoint of a module-lived server."""
    root = tmp_path_factory.mktemp("ma")
    servers: dict[tuple[Any, ...], RolloutServer] = {}

    def start(env_id: str, num_envs: int, **kw: Any) -> str:
        key = (env_id, num_envs, tuple(sorted(kw.items())))
        if key not in servers:
            bind = f"ipc://{root}/s{len(servers)}.sock"
            servers[key] = RolloutServer(env_id, num_envs, bind, env_kwargs=kw).start()
        return servers[key].endpoint

    yield start
    for server in servers.values():
        server.stop()


def _assert_step_equal(a: MultiAgentBatchStep, b: MultiAgentBatchStep) -> None:
    for name in STEP_FIELDS:
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        np.testing.assert_array_equal(x, y, err_msg=name)
        assert x.dtype == y.dtype, name
    np.testing.assert_array_equal(a.env_reset, b.env_reset)
    assert a.infos == b.infos


@given(
    seed=st.integers(0, 2**63 - 1),
    actions=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 14), st.just(6), st.just(2)),
        elements=st.floats(-2.0, 2.0, width=32),
    ),
    reseed=st.one_of(st.none(), st.integers(0, 2**32)),
)
def test_remote_vector_equals_local_bit_for_bit(
    serve: Any, seed: int, actions: np.ndarray, reseed: int | None
) -> None:
    """Same seeds and actions (out-of-bounds ones too): identical rows, masks and infos,
    across autoresets and a later reset (root seed, per-env seeds, or none)."""
    endpoint = serve(GOALNAV, 2, **GOALNAV_KW)
    local = MultiAgentVectorEnv(GOALNAV, 2, env_kwargs=GOALNAV_KW)
    with RemoteMultiAgentVectorEnv(endpoint, timeout=10) as remote:
        assert remote.possible_agents == local.possible_agents
        assert remote.single_observation_space == local.single_observation_space
        assert remote.action_space == local.action_space
        lo, lm, li = local.reset(seed=seed)
        ro, rm, ri = remote.reset(seed=seed)
        np.testing.assert_array_equal(lo, ro)
        np.testing.assert_array_equal(lm, rm)
        assert li == ri
        for act in actions:
            _assert_step_equal(local.step(act), remote.step(act))
        again = [reseed, None] if reseed is not None else None
        for a, b in zip(local.reset(seed=again), remote.reset(seed=again), strict=True):
            np.testing.assert_array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
        np.testing.assert_array_equal(local.agent_mask, remote.agent_mask)
        for act in actions[:4]:
            _assert_step_equal(local.step(act), remote.step(act))
    local.close()


def test_episodes_end_and_agents_leave(serve: Any) -> None:
    """Plain PettingZoo env: agent b leaves after step 1 (its row masked, final obs
    sent), the env resets with a's truncation at step 3, rows of b are ignored."""
    with RemoteMultiAgentVectorEnv(serve(TINY, 2), timeout=10) as remote:
        assert remote.capabilities == frozenset()
        assert remote.possible_agents == ["a", "b"]
        _obs, mask, _ = remote.reset(seed=[5, 6])
        assert mask.tolist() == [True] * 4
        first = remote.step(np.array([1, 2, 0, 1]))
        assert first.agent_mask.tolist() == [True, False, True, False]
        assert first.terminated.tolist() == [False, True, False, True]
        assert first.reward.tolist() == [1.0, 2.0, 0.0, 1.0]
        np.testing.assert_array_equal(first.obs[[1, 3]], np.zeros((2, 2), np.float32))
        assert not np.array_equal(first.final_obs[1], first.obs[1])
        second = remote.step(np.array([2, 7, 1, -4]))  # b's rows are not live: ignored
        assert second.acted.tolist() == [True, False, True, False]
        assert second.reward.tolist() == [2.0, 0.0, 1.0, 0.0]
        third = remote.step(np.array([0, 0, 0, 0]))
        assert third.env_reset.tolist() == [True, True]
        assert third.truncated.tolist() == [True, False, True, False]
        assert third.agent_mask.tolist() == [True] * 4
        assert third.infos[1]["reset_info"] == {"t": 0}
        with pytest.raises(RemoteError, match=r"\[unsupported\].*'state'"):
            remote.get_state()


def test_get_state_set_state_continues_bit_identically(serve: Any) -> None:
    with RemoteMultiAgentVectorEnv(serve(GOALNAV, 2, **GOALNAV_KW), timeout=10) as remote:
        assert {"state", "params", "randomization"} <= remote.capabilities
        remote.reset(seed=9)
        rng = np.random.default_rng(0)
        acts = rng.uniform(-1, 1, (8, remote.num_rows, 2)).astype(np.float32)
        for act in acts[:3]:
            remote.step(act)
        snap = remote.get_state()
        first = [remote.step(act) for act in acts[3:]]
        remote.set_state(snap)
        for step, act in zip(first, acts[3:], strict=True):
            _assert_step_equal(step, remote.step(act))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda s: s["agent_mask"].__setitem__(0, False),
            r"\[invalid_state\] InvalidState: state\['agent_mask'\] must mark the live agents",
        ),
        (
            lambda s: s["env"].update(agents=["agent_1"]),
            r"\[invalid_state\] InvalidState: state\['agent_mask'\] must mark the live agents",
        ),
        (
            lambda s: s["env"].update(agents=["nobody"]),
            r"\[invalid_state\] InvalidState: state\['env'\]\['agents'\] names \['nobody'\]",
        ),
        (
            lambda s: s["env"].update(agents=None),
            r"\[invalid_state\] InvalidState: state\['env'\]\['agents'\] must be a list",
        ),
    ],
)
def test_a_snapshot_whose_mask_is_not_the_envs_agents_is_invalid_state(
    serve: Any, change: Any, match: str
) -> None:
    """The server refuses a snapshot whose ``agent_mask`` disagrees with the env's own
    ``agents`` (or whose ``agents`` are not the env's agents) and changes nothing, in
    any env of the request. Before, it was taken: a row the mask called dead still
    acted, and ``agents=["nobody"]`` broke every later step with ``env_error``."""
    with RemoteMultiAgentVectorEnv(serve(GOALNAV, 2, **GOALNAV_KW), timeout=10) as remote:
        remote.reset(seed=5)
        old = remote.get_state()
        act = np.full((remote.num_rows, 2), 0.5, np.float32)
        remote.step(act)
        now = snapshot.dumps(remote.get_state())
        bad = snapshot.loads(snapshot.dumps(old))
        change(bad[0])
        with pytest.raises(RemoteError, match=match):
            remote.set_state(bad)
        assert snapshot.dumps(remote.get_state()) == now
        step = remote.step(act)
        remote.set_state(snapshot.loads(now))
        _assert_step_equal(step, remote.step(act))


def test_parallel_api_test_passes_remotely(serve: Any) -> None:
    for endpoint in (serve(GOALNAV, 1, **GOALNAV_KW), serve(TINY, 1)):
        env = RemoteParallelEnv(endpoint, timeout=10)
        try:
            parallel_api_test(env, num_cycles=50)
        finally:
            env.close()


def test_remote_parallel_env_equals_local_env(serve: Any) -> None:
    """Dicts equal a local GoalNav over seeded and unseeded resets (server autoresets)."""
    env = RemoteParallelEnv(serve(GOALNAV, 2, **GOALNAV_KW), env_index=1, timeout=10)
    local = simkit.make(GOALNAV, **GOALNAV_KW)
    rng = np.random.default_rng(1)
    try:
        for seed in (4, None, None, 7):
            lo, li = local.reset(seed=seed)
            ro, ri = env.reset(seed=seed)
            assert all(o.flags.writeable for o in ro.values())
            assert env.agents == local.agents
            np.testing.assert_equal(ro, lo)
            assert ri == li
            while local.agents:
                acts = {a: rng.uniform(-1, 1, 2).astype(np.float32) for a in local.agents}
                lres, rres = local.step(acts), env.step(acts)
                for x, y in zip(lres, rres, strict=True):
                    np.testing.assert_equal(y, x)
                assert env.agents == local.agents
        with pytest.raises(simkit.errors.ResetNeeded, match="no live agents"):
            env.step({})
        env.reset()
        with pytest.raises(simkit.errors.InvalidAction, match=r"missing \['agent_2'\]"):
            env.step({"agent_0": np.zeros(2, np.float32), "agent_1": np.zeros(2, np.float32)})
    finally:
        env.close()


def test_an_options_reset_after_an_episode_end_equals_a_local_env(serve: Any) -> None:
    """``reset(options=...)`` without a seed after an episode ended used to discard the
    server's autoreset episode and draw another, leaving the remote generator ahead of a
    local env's for good. The reset now replaces the autoreset (its draws undone on the
    server): every episode equals a local env's, before and after."""
    env = RemoteParallelEnv(serve(GOALNAV, 2, **GOALNAV_KW), env_index=1, timeout=10)
    local = simkit.make(GOALNAV, **GOALNAV_KW)
    rng = np.random.default_rng(2)
    heavy = {"params": {"mass": 1.5}}
    try:
        for seed, options in ((4, None), (None, heavy), (None, None), (None, {}), (None, heavy)):
            lo, li = local.reset(seed=seed, options=options)
            ro, ri = env.reset(seed=seed, options=options)
            np.testing.assert_equal(ro, lo)
            assert ri == li
            while local.agents:
                acts = {a: rng.uniform(-1, 1, 2).astype(np.float32) for a in local.agents}
                for x, y in zip(local.step(acts), env.step(acts), strict=True):
                    np.testing.assert_equal(y, x)
    finally:
        env.close()


def test_reset_envs_replace_autoreset_undoes_the_autoresets_draws() -> None:
    """The vector's part of it: ``reset_envs(..., replace_autoreset=True)`` of an env its
    last step autoreset draws what the env reset after its episode's end draws; refused
    (a bad override), it changes nothing; after a step there is nothing to replace."""
    local = simkit.make(GOALNAV, **GOALNAV_KW)
    vector = MultiAgentVectorEnv(GOALNAV, 1, env_kwargs=GOALNAV_KW)
    local.reset(seed=3)
    vector.reset_envs([0], seeds=[3])
    rng = np.random.default_rng(0)
    while local.agents:
        acts = {a: rng.uniform(-1, 1, 2).astype(np.float32) for a in local.agents}
        local.step(acts)
        step = vector.step(np.stack([acts[a] for a in vector.possible_agents]))
    assert step.env_reset[0]
    counters, drawn = vector.episode_index, vector.envs[0].np_random.bit_generator.state
    with pytest.raises(simkit.errors.InvalidParameter):
        vector.reset_envs([0], options={"params": {"mass": 99.0}}, replace_autoreset=True)
    assert (vector.episode_index == counters).all()
    assert vector.envs[0].np_random.bit_generator.state == drawn
    heavy = {"params": {"mass": 1.5}}
    obs, _ = vector.reset_envs([0], options=heavy, replace_autoreset=True)
    lo, _ = local.reset(options=heavy)
    np.testing.assert_equal(obs, np.stack([lo[a] for a in vector.possible_agents]))
    assert vector.envs[0].params == local.params
    vector.step(np.zeros((3, 2), np.float32))
    again, _ = vector.reset_envs([0], replace_autoreset=True)  # a plain reset now
    lo, _ = local.reset()
    np.testing.assert_equal(again, np.stack([lo[a] for a in vector.possible_agents]))
    vector.close()


def test_replace_autoreset_must_be_a_bool(serve: Any) -> None:
    raw = _Raw(serve(GOALNAV, 2, **GOALNAV_KW))
    try:
        frames = raw.cs.request_reset(seed=1)
        msg = decode(frames)
        msg.body["replace_autoreset"] = "yes"
        reply = decode(raw.call(encode(msg)))
        assert reply.kind == "error"
        assert reply.body["code"] == "invalid_field"
        assert "'replace_autoreset' must be a bool" in reply.body["message"]
    finally:
        raw.close()


class _Raw:
    """A DEALER socket with a ClientSession; every receive has a timeout."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 5000)
        self.sock.connect(endpoint)
        self.cs = ClientSession()
        self.cs.parse_hello(self.call(self.cs.request_hello()))

    def close(self) -> None:
        self.sock.close(linger=0)

    def call(self, frames: list[Any]) -> list[Any]:
        self.sock.send_multipart(frames)
        return self.sock.recv_multipart(copy=False)  # type: ignore[no-any-return]

    def step(self, actions: Any, env_ids: Any = None) -> Any:
        return parse_multi_agent_step(self.cs, self.call(self.cs.request_step(actions, env_ids)))

    def send_step_arrays(self, arrays: dict[str, np.ndarray]) -> Message:
        return decode(self.call(encode(Message(kind="step", id=99, arrays=arrays))))


@pytest.fixture
def raw() -> Iterator[Any]:
    """``raw(endpoint)``: a handshaken :class:`_Raw` client, closed after the test."""
    clients: list[_Raw] = []

    def connect(endpoint: str) -> _Raw:
        clients.append(_Raw(endpoint))
        return clients[-1]

    yield connect
    for client in clients:
        client.close()


@pytest.mark.parametrize(
    ("arrays", "code", "match"),
    [
        ({"actions": np.array([[0.0, np.nan]] * 6, np.float32)}, "not_finite", "finite"),
        ({"actions": np.zeros((5, 2), np.float32)}, "invalid_shape", r"\[6, 2\]"),
        ({"actions": np.zeros((6, 2), np.float64)}, "invalid_dtype", "float32"),
        ({"actions": np.zeros((6, 3), np.float32)}, "invalid_shape", "wrong shape"),
        ({}, "invalid_field", "actions"),
        (
            {"actions": np.zeros((3, 2), np.float32), "env_ids": np.array([4])},
            "invalid_env_ids",
            "out of range",
        ),
    ],
)
def test_bad_goalnav_steps_get_errors_and_change_nothing(
    serve: Any, raw: Any, arrays: dict[str, np.ndarray], code: str, match: str
) -> None:
    endpoint = serve(GOALNAV, 2, **GOALNAV_KW)
    bad, good = raw(endpoint), raw(endpoint)
    seed_frames = bad.cs.request_reset(seed=3)
    parse_multi_agent_reset(bad.cs, bad.call(seed_frames))
    parse_multi_agent_reset(good.cs, good.call(good.cs.request_reset(seed=3)))
    reply = bad.send_step_arrays(arrays)
    assert reply.kind == "error"
    assert reply.body["code"] == code
    assert reply.body["request_kind"] == "step"
    assert re.search(match, " ".join(str(reply.body[k]) for k in ("message", "expected", "got")))
    act = np.full((6, 2), 0.5, np.float32)
    a, b = bad.step(act), good.step(act)  # nothing moved: both sessions stay in lockstep
    _assert_step_equal(a.step, b.step)


def test_rows_of_dead_agents_are_ignored_but_live_rows_checked(serve: Any, raw: Any) -> None:
    """NaN or out-of-range values in rows of agents that left are ignored; the same
    values in a live row are refused with nothing changed."""
    client = raw(serve(TINY, 1))
    reset = parse_multi_agent_reset(client.cs, client.call(client.cs.request_reset(seeds=[1])))
    assert reset.agent_mask.tolist() == [True, True]
    with pytest.raises(RemoteError, match=r"\[invalid_action\] actions out of the Discrete"):
        client.step(np.array([0, 3]))
    first = client.step(np.array([1, 1]))
    assert first.step.agent_mask.tolist() == [True, False]
    with pytest.raises(RemoteError, match=r"\[invalid_action\]"):
        client.step(np.array([-1, 0]))
    second = client.step(np.array([2, 99]))  # b left: its value is ignored
    assert second.step.acted.tolist() == [True, False]
    assert second.step.reward.tolist() == [2.0, 0.0]
    with pytest.raises(RemoteError, match=r"\[reset_needed\]|\[invalid_env_ids\]"):
        client.step(np.array([0, 0]), env_ids=[1])


def test_step_before_reset_and_single_agent_mismatch(serve: Any, raw: Any) -> None:
    client = raw(serve(TINY, 1))
    with pytest.raises(
        RemoteError, match=r"\[reset_needed\] ResetNeeded: envs \[0\] were never reset"
    ):
        client.step(np.array([0, 0]))
    with pytest.raises(ValueError, match="multi-agent env needs env_kind 'multi_agent'"):
        RemoteParallelEnv(serve("simkit/CartPole-v0", 1), timeout=5)
    with pytest.raises(ValueError, match="RemoteVectorEnv serves single-agent envs"):
        RemoteVectorEnv(serve(TINY, 1), timeout=5)


def test_handshake_announces_agents_and_row_spaces(serve: Any, raw: Any) -> None:
    info = raw(serve(GOALNAV, 2, **GOALNAV_KW)).cs.info
    assert info is not None
    assert info.env_kind == "multi_agent"
    assert info.protocol >= (1, 1)  # multi-agent serving came in 1.1
    assert info.agents == ["agent_0", "agent_1", "agent_2"]
    env = simkit.make(GOALNAV, **GOALNAV_KW)
    assert info.observation_space == env.observation_space("agent_0")
    assert info.action_space == env.action_space("agent_0")


def test_server_refuses_unservable_multi_agent_envs(tmp_path: Any) -> None:
    assert is_multi_agent_id(GOALNAV)
    assert is_multi_agent_id(TINY)
    assert not is_multi_agent_id("simkit/CartPole-v0")
    assert not is_multi_agent_id("gym:X")
    with pytest.raises(ValueError, match="homogeneous agents"):
        RolloutServer(f"pz:{__name__}:make_mixed", 1, f"ipc://{tmp_path}/m.sock")
    with pytest.raises(ValueError, match="no callable 'nope'"):
        RolloutServer(f"pz:{__name__}:nope", 1, f"ipc://{tmp_path}/n.sock")
    with pytest.raises(ModuleNotFoundError):
        RolloutServer("pz:no_such_module_xyz", 1, f"ipc://{tmp_path}/x.sock")
    with pytest.raises(TypeError, match=r"must be a pettingzoo\.ParallelEnv"):
        ParallelEnvHost([object()])  # type: ignore[list-item]


def test_env_fault_ends_only_its_episode(serve: Any) -> None:
    """An env that raises: its acting rows truncated, listed in faults, reset; a failing
    reset leaves it reporting reset_needed until a reset request; other envs go on."""
    with RemoteMultiAgentVectorEnv(serve(FAULTY, 2), timeout=10) as remote:
        obs, _, _ = remote.reset(seed=[1, 2])
        step = remote.step(np.array([2, 0, 1, 1]))
        assert [(f.env_id, f.code, f.message) for f in remote.faults] == [
            (0, "env_error", "RuntimeError: boom")
        ]
        assert step.env_reset.tolist() == [True, False]
        assert step.truncated.tolist() == [True, True, False, False]
        assert step.terminated.tolist() == [False, False, False, True]
        assert step.reward.tolist() == [0.0, 0.0, 1.0, 1.0]
        np.testing.assert_array_equal(step.final_obs[:2], obs[:2])
        assert step.agent_mask.tolist() == [True, True, True, False]
        FAIL_RESET["on"] = True
        try:
            step = remote.step(np.array([2, 0, 1, 0]))
            assert [f.code for f in remote.faults] == ["env_error", "env_error"]
            assert remote.faults[1].message == "reset failed: OSError: reset broke"
            assert step.agent_mask.tolist() == [False, False, True, False]
            step = remote.step(np.array([0, 0, 1, 0]))
            # env 1's a is truncated at its third step; its autoreset fails too
            assert [(f.env_id, f.code) for f in remote.faults] == [
                (0, "reset_needed"),
                (1, "env_error"),
            ]
            assert step.acted.tolist() == [False, False, True, False]
            assert step.truncated.tolist() == [False, False, True, False]
        finally:
            FAIL_RESET["on"] = False
        _, mask, _ = remote.reset()
        assert mask.tolist() == [True] * 4
        remote.step(np.array([1, 1, 1, 1]))
        assert remote.faults == []


def test_env_id_subsets_step_in_the_order_given(serve: Any, raw: Any) -> None:
    """Stepping env 1 then env 0 (one request, rows in env_ids order) equals stepping all."""
    endpoint = serve(GOALNAV, 2, **GOALNAV_KW)
    part, whole = raw(endpoint), raw(endpoint)
    for client in (part, whole):
        parse_multi_agent_reset(client.cs, client.call(client.cs.request_reset(seed=8)))
    acts = np.random.default_rng(2).uniform(-1, 1, (5, 6, 2)).astype(np.float32)
    for act in acts:
        got = part.step(np.concatenate([act[3:], act[:3]]), env_ids=[1, 0])
        want = whole.step(act).step
        assert got.env_ids.tolist() == [1, 0]
        for name in STEP_FIELDS:
            w = np.asarray(getattr(want, name))
            np.testing.assert_array_equal(getattr(got.step, name), np.concatenate([w[3:], w[:3]]))


def test_parallel_seed_test_passes_remotely(serve: Any) -> None:
    endpoint = serve(GOALNAV, 1, **GOALNAV_KW)
    parallel_seed_test(lambda: RemoteParallelEnv(endpoint, timeout=10), num_cycles=20)


def test_multi_agent_clients_keep_idle_sessions_over_curve() -> None:
    """RemoteParallelEnv takes CURVE keys and keeps its session past the heartbeat."""
    from simkit.clients import CurveKeys

    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    with RolloutServer(
        GOALNAV,
        1,
        "tcp://127.0.0.1:0",
        env_kwargs=GOALNAV_KW,
        curve_secret_key=server_secret,
        curve_allowed_clients=[client_public],
        heartbeat_timeout=1.0,
    ) as server:
        keys = CurveKeys(server_public, client_public, client_secret)
        env = RemoteParallelEnv(server.endpoint, timeout=5, curve=keys)
        try:
            env.reset(seed=0)
            time.sleep(1.6)  # silent for more than the heartbeat timeout
            assert server.sessions == 1
            env.step({a: env.action_space(a).sample() for a in env.agents})
        finally:
            env.close()
        assert server.sessions == 0
