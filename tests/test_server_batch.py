"""Hosting a simkit.BatchEnv on the rollout server, and the threaded EnvListHost."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import simkit
from simkit.clients import RemoteVectorEnv
from simkit.envs.batch_cartpole import BatchCartPole
from simkit.envs.batch_cheetah import BatchCheetah
from simkit.protocol import ClientSession, RemoteError, ResetRequest, ServerInfo, ServerSession
from simkit.servers import BatchEnvHost, EnvListHost, RolloutServer
from simkit.snapshot import dumps


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``serve(env_id, num_envs, **kw)``: the endpoint of a server living for the module."""
    root = tmp_path_factory.mktemp("batch")
    servers: dict[tuple[Any, ...], RolloutServer] = {}

    def start(env_id: str, num_envs: int, **kw: Any) -> str:
        key = (env_id, num_envs, *sorted(kw.items()))
        if key not in servers:
            bind = f"ipc://{root}/s{len(servers)}.sock"
            servers[key] = RolloutServer(env_id, num_envs, bind, **kw).start()
        return servers[key].endpoint

    yield start
    for server in servers.values():
        server.stop()


def _tree_equal(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _tree_equal(a[k], b[k])
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.asarray(a).dtype == np.asarray(b).dtype


def _actions(space: gym.Space[Any], steps: int) -> list[Any]:
    space.seed(1)
    return [space.sample() for _ in range(steps)]


@pytest.mark.parametrize(("env_id", "steps"), [("BatchCartPole-v0", 80), ("BatchCheetah-v0", 8)])
def test_remote_batch_env_equals_local_bit_for_bit(serve: Any, env_id: str, steps: int) -> None:
    """Same root seed and actions: identical rows, autoresets and infos."""
    env_id = f"simkit/{env_id}"
    local = simkit.make(env_id, num_envs=4)
    remote = RemoteVectorEnv(serve(env_id, 4), timeout=10)
    try:
        assert remote.server_infos[0].capabilities == {"state", "params", "randomization"}
        assert remote.single_action_space == local.single_action_space
        lo, li = local.reset(seed=11)
        ro, ri = remote.reset(seed=11)
        _tree_equal(lo, ro)
        _tree_equal(li, ri)
        ended = 0
        for act in _actions(local.action_space, steps):
            lb, rb = local.step_batch(act), remote.step_batch(act)
            for name in ("obs", "reward", "terminated", "truncated", "final_obs", "env_ids"):
                _tree_equal(getattr(lb, name), getattr(rb, name))
            for a, b in zip(lb.infos, rb.infos, strict=True):
                _tree_equal(a, b)
            ended += int(lb.done.sum())
        assert ended > 0 or "Cheetah" in env_id  # CartPole autoresets are covered
    finally:
        local.close()
        remote.close()


def test_batch_params_subset_reset_and_permuted_step(serve: Any) -> None:
    """Per-env params and a seedless subset reset match the local reset_mask/params."""
    env_id = "simkit/BatchCartPole-v0"
    local = simkit.make(env_id, num_envs=3)
    remote = RemoteVectorEnv(serve(env_id, 3), timeout=10)
    conn = remote._conns[0]
    try:
        params = [{"pole_length": 0.6}, {}, {"pole_length": 0.45, "gravity": 9.4}]
        lo, li = local.reset(seed=5, options={"params": params})
        ro, ri = remote.reset(seed=5, options={"params": params})
        _tree_equal(lo, ro)
        _tree_equal(li, ri)
        assert ri["params"]["pole_length"][0] == 0.6
        act = np.array([1, 0, 1])
        lb = local.step_batch(act)
        # The same step with the rows listed in another order.
        order = np.array([2, 0, 1])
        conn.send("step", conn.session.request_step(act[order], order))
        rb, faults = conn.session.parse_step(conn.recv())
        assert faults == []
        np.testing.assert_array_equal(rb.env_ids, order)
        np.testing.assert_array_equal(rb.obs, lb.obs[order])
        np.testing.assert_array_equal(rb.reward, lb.reward[order])
        # Seedless reset of env 1 only: its next episode, as local reset_mask does.
        mask = np.array([False, True, False])
        lo, _ = local.reset(options={"reset_mask": mask, "params": [{}, {"gravity": 9.9}, {}]})
        conn.send("reset", conn.session.request_reset(env_ids=[1], params=[{"gravity": 9.9}]))
        reply = conn.session.parse_reset(conn.recv())
        np.testing.assert_array_equal(reply.obs, lo[[1]])
        assert reply.infos[0]["params"]["gravity"] == 9.9
    finally:
        local.close()
        remote.close()


def test_remote_batch_env_takes_a_list_of_seeds_as_the_local_one(serve: Any) -> None:
    """``reset(seed=[...])`` (all envs, the wire's ``seeds``) and ``seeds`` for a subset
    equal the local BatchEnv's list of seeds (``None`` for an instance not reset)."""
    env_id = "simkit/BatchCartPole-v0"
    local = simkit.make(env_id, num_envs=3)
    remote = RemoteVectorEnv(serve(env_id, 3), timeout=10)
    conn = remote._conns[0]
    try:
        seeds = [7, 2**63 - 1, 0]
        lo, li = local.reset(seed=seeds)
        ro, ri = remote.reset(seed=seeds)
        _tree_equal(lo, ro)
        _tree_equal(li, ri)
        for act in _actions(local.action_space, 40):  # autoresets continue each stream
            lb, rb = local.step_batch(act), remote.step_batch(act)
            for name in ("obs", "reward", "terminated", "truncated", "final_obs"):
                _tree_equal(getattr(lb, name), getattr(rb, name))
        lo, _ = local.reset(seed=[None, None, 9], options={"reset_mask": [False, False, True]})
        conn.send("reset", conn.session.request_reset(env_ids=[2], seeds=[9]))
        np.testing.assert_array_equal(conn.session.parse_reset(conn.recv()).obs, lo[[2]])
        # a root seed for a subset re-roots those instances only, as on a vector server
        lo, _ = local.reset(seed=11, options={"reset_mask": np.array([True, False, True])})
        conn.send("reset", conn.session.request_reset(env_ids=[0, 2], seed=11))
        np.testing.assert_array_equal(conn.session.parse_reset(conn.recv()).obs, lo[[0, 2]])
        for act in _actions(local.action_space, 40):
            lb, rb = local.step_batch(act), remote.step_batch(act)
            for name in ("obs", "reward", "terminated", "truncated", "final_obs"):
                _tree_equal(getattr(lb, name), getattr(rb, name))
    finally:
        local.close()
        remote.close()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda s: s.request_reset(env_offset=3), "by their own index"),
        (lambda s: s.request_get_state([1]), "covers all its instances"),
        (lambda s: s.request_reset(params=[{"gravity": -1.0}] * 3), "invalid_parameter"),
    ],
)
def test_batch_refusals_name_what_was_expected(serve: Any, call: Any, match: str) -> None:
    remote = RemoteVectorEnv(serve("simkit/BatchCartPole-v0", 3), timeout=10)
    conn = remote._conns[0]
    try:
        remote.reset(seed=0)
        before = remote.step_batch(np.zeros(3, np.int64)).obs.copy()
        state = remote.get_state()
        conn.send("x", call(conn.session))
        with pytest.raises(RemoteError, match=match):
            conn.session.parse(conn.recv(), "x")
        remote.set_state(state)
        after = remote.get_state()
        _tree_equal(state[0]["batch"]["env"]["obs"], after[0]["batch"]["env"]["obs"])
        assert after[0]["batch"]["env"]["obs"].shape == before.shape
    finally:
        remote.close()


class _WholeBatchCartPole(BatchCartPole):
    """A BatchCartPole without ``step_subset``: it steps all its instances or none."""

    step_subset = simkit.BatchEnv.step_subset


def test_subset_step_of_a_batch_env_without_step_subset_is_refused(serve: Any) -> None:
    simkit.register(
        "test/WholeBatchCartPole-v0", _WholeBatchCartPole, kind=simkit.EnvKind.BATCH, override=True
    )
    remote = RemoteVectorEnv(serve("test/WholeBatchCartPole-v0", 3), timeout=10)
    try:
        remote.reset(seed=0)
        with pytest.raises(
            RemoteError,
            match=r"\[unsupported\] _WholeBatchCartPole steps all its instances at once",
        ):
            remote.step_batch(np.zeros(2, np.int64), env_ids=[0, 2])
        assert remote.step_batch(np.zeros(3, np.int64)).obs.shape == (3, 4)  # still serving
    finally:
        remote.close()


def test_batch_get_set_state_replays(serve: Any) -> None:
    remote = RemoteVectorEnv(serve("simkit/BatchCheetah-v0", 3), timeout=10)
    try:
        remote.reset(seed=2)
        acts = _actions(remote.action_space, 6)
        remote.step_batch(acts[0])
        states = remote.get_state()
        assert [s["instance"] for s in states] == [0, 1, 2]
        assert states[1]["batch"] is None
        assert states[0]["batch"] is not None
        first = [remote.step_batch(a).obs.copy() for a in acts[1:]]
        remote.set_state(states[::-1], env_ids=[2, 1, 0])
        again = [remote.step_batch(a).obs.copy() for a in acts[1:]]
        for a, b in zip(first, again, strict=True):
            np.testing.assert_array_equal(a, b)
        with pytest.raises(RemoteError, match="invalid_state"):
            remote.set_state([states[1], states[1], states[2]])
    finally:
        remote.close()


class _Exploding(BatchCartPole):
    """Raises in step_instances while ``boom``; its reset raises while ``reset_boom``."""

    boom = False
    reset_boom = False

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        if self.boom:
            raise RuntimeError("physics blew up")
        return super().step_instances(actions, rngs)

    def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
        if self.reset_boom:
            raise RuntimeError("cannot reset")
        return super().reset_instances(ids, rngs, params, options)


class _ExplodingCheetah(BatchCheetah):
    """Raises after the physics while ``boom`` (on whichever instances are stepped)."""

    boom = False

    def after_physics(self, ids: Any, actions: Any, before: Any, rngs: Any) -> Any:
        if self.boom:
            raise RuntimeError("physics blew up")
        return super().after_physics(ids, actions, before, rngs)


def test_subset_steps_of_a_batch_env_with_step_subset(serve: Any) -> None:
    """BatchCheetah steps any subset remotely as locally; a failing subset restarts alone."""
    remote = RemoteVectorEnv(serve("simkit/BatchCheetah-v0", 3), timeout=10)
    local = simkit.make("simkit/BatchCheetah-v0", num_envs=3)
    try:
        remote.reset(seed=4)
        local.reset(seed=4)
        acts = np.random.default_rng(1).uniform(-1, 1, size=(6, 3, 6)).astype(np.float32)
        for t, ids in enumerate(([2, 0], [1], [0, 1, 2], [1, 2])):
            rb = remote.step_batch(acts[t][ids], env_ids=ids)
            lb = local.step_batch(acts[t][ids], ids)
            np.testing.assert_array_equal(rb.env_ids, ids)
            for name in ("obs", "final_obs", "reward", "terminated", "truncated"):
                np.testing.assert_array_equal(getattr(rb, name), getattr(lb, name))
    finally:
        remote.close()
        local.close()
    env = _ExplodingCheetah(num_envs=3)
    server, client = _session(BatchEnvHost(env))
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    client.parse_step(server.handle(client.request_step(np.zeros((3, 6), np.float32))))
    env.boom = True
    step, faults = client.parse_step(
        server.handle(client.request_step(np.zeros((2, 6), np.float32), [2, 0]))
    )
    assert [(f.env_id, f.code) for f in faults] == [(2, "env_error"), (0, "env_error")]
    assert step.truncated.all()
    np.testing.assert_array_equal(env.episode_index, [1, 0, 1])  # instance 1 went on
    np.testing.assert_array_equal(env.elapsed_steps, [0, 1, 0])


def _session(host: Any) -> tuple[ServerSession, ClientSession]:
    info = ServerInfo("test", host.num_envs, host.observation_space, host.action_space)
    server, client = ServerSession(host, info), ClientSession()
    client.parse_hello(server.handle(client.request_hello()))
    return server, client


def test_batch_fails_as_a_whole_and_restarts() -> None:
    env = _Exploding(num_envs=3)
    server, client = _session(BatchEnvHost(env))
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    prev = client.parse_step(server.handle(client.request_step(np.ones(3, np.int64))))[0].obs
    env.boom = True
    step, faults = client.parse_step(server.handle(client.request_step(np.ones(3, np.int64))))
    assert [(f.env_id, f.code) for f in faults] == [
        (0, "env_error"),
        (1, "env_error"),
        (2, "env_error"),
    ]
    assert "physics blew up" in faults[0].message
    assert step.truncated.all()
    assert not step.terminated.any()
    assert not step.reward.any()
    np.testing.assert_array_equal(step.final_obs, prev)
    assert all("reset_info" in i for i in step.infos)
    np.testing.assert_array_equal(env.episode_index, [1, 1, 1])
    # The step and its reset both fail: reset_needed until a full reset.
    env.reset_boom = True
    _, faults = client.parse_step(server.handle(client.request_step(np.ones(3, np.int64))))
    assert [f.code for f in faults].count("env_error") == 6
    env.boom = env.reset_boom = False
    _, faults = client.parse_step(server.handle(client.request_step(np.ones(3, np.int64))))
    assert {f.code for f in faults} == {"reset_needed"}
    client.parse_reset(server.handle(client.request_reset()))
    _, faults = client.parse_step(server.handle(client.request_step(np.ones(3, np.int64))))
    assert faults == []


def test_batch_host_serves_a_torch_batch_as_host_arrays() -> None:
    """A torch batch (device-resident steps, autoresets) hosted gives the numpy batch's
    rows bit for bit, as numpy arrays, from actions as read-only wire buffers."""
    pytest.importorskip("torch")
    n = 4
    hosts = [BatchEnvHost(BatchCartPole(num_envs=n, device=d)) for d in (None, "cpu")]
    ids = np.arange(n, dtype=np.int64)
    first = [h.reset(ResetRequest(ids, seed=3)) for h in hosts]
    assert isinstance(first[1][0], np.ndarray)
    np.testing.assert_array_equal(first[0][0], first[1][0])
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(40):
        act = rng.integers(0, 2, n)
        act.flags.writeable = False
        (want, _), (got, faults) = (h.step(ids, act) for h in hosts)
        assert faults == []
        for name in ("obs", "reward", "terminated", "truncated", "final_obs"):
            x, y = getattr(got, name), getattr(want, name)
            assert isinstance(x, np.ndarray), name
            assert x.dtype == y.dtype, name
            np.testing.assert_array_equal(x, y)
        ended += int(want.done.sum())
    assert ended > 0
    for h in hosts:
        h.close()


def _flaky_cheetahs(n: int) -> list[Any]:
    envs = [simkit.make("simkit/Cheetah-v0") for _ in range(n)]
    original = envs[2].unwrapped.step_episode

    def step_episode(action: Any, rng: Any) -> Any:
        if action[0] > 0.9:
            raise RuntimeError("bad actuator")
        return original(action, rng)

    envs[2].unwrapped.step_episode = step_episode
    return envs


def test_threaded_host_equals_inline_host() -> None:
    """num_threads changes nothing: rows, faults (in env order) and autoresets agree."""
    results = []
    for threads in (1, 3):
        host = EnvListHost(_flaky_cheetahs(5), num_threads=threads)
        server, client = _session(host)
        client.parse_reset(server.handle(client.request_reset(seed=4)))
        out = []
        for k, act in enumerate(_actions(gym.vector.utils.batch_space(host.action_space, 5), 6)):
            ids = np.array([4, 2, 0]) if k == 3 else None
            rows = act if ids is None else act[:3]
            out.append(client.parse_step(server.handle(client.request_step(rows, ids))))
        host.close()
        results.append(out)
    faults = 0
    for (a, fa), (b, fb) in zip(*results, strict=True):
        for name in ("obs", "reward", "terminated", "truncated", "final_obs", "env_ids"):
            _tree_equal(getattr(a, name), getattr(b, name))
        assert fa == fb
        faults += len(fa)
    assert faults > 0


def test_num_threads_is_checked() -> None:
    with pytest.raises(ValueError, match="num_threads must be a positive int, got 0"):
        RolloutServer("simkit/CartPole-v0", 1, "inproc://x", num_threads=0)
    with pytest.raises(ValueError, match="num_threads must be a positive int, got 0"):
        EnvListHost([simkit.make("simkit/CartPole-v0")], num_threads=0)


def _stateful_session(host: Any) -> tuple[ServerSession, ClientSession]:
    """A session on ``host`` announcing its capabilities (``state`` among them)."""
    info = ServerInfo(
        "test", host.num_envs, host.observation_space, host.action_space, host.capabilities
    )
    server, client = ServerSession(host, info), ClientSession()
    client.parse_hello(server.handle(client.request_hello()))
    return server, client


def _refused(server: ServerSession, client: ClientSession, states: list[Any]) -> RemoteError:
    """The error reply to a ``set_state`` of ``states``."""
    with pytest.raises(RemoteError) as info:
        client.parse_set_state(server.handle(client.request_set_state(states)))
    return info.value


def test_a_refused_set_state_changes_no_env_of_an_env_list() -> None:
    server, client = _stateful_session(
        EnvListHost([simkit.make("simkit/CartPole-v0") for _ in range(2)])
    )
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    old = client.parse_get_state(server.handle(client.request_get_state()))
    for _ in range(3):
        client.parse_step(server.handle(client.request_step(np.ones(2, np.int64))))
    now = dumps(client.parse_get_state(server.handle(client.request_get_state())))
    old[1]["episode_index"] = 2**64 - 1  # env 1's seeding part is out of range
    error = _refused(server, client, old)
    assert error.remote_code == "invalid_state"
    assert "state['episode_index'] must be an int in [-1, 2**63 - 2]" in str(error)
    assert dumps(client.parse_get_state(server.handle(client.request_get_state()))) == now


@pytest.mark.parametrize("key", ["format", "instance", "num_envs"])
def test_an_array_in_a_batch_host_snapshot_is_invalid_state(key: str) -> None:
    """An array as the host entry's tag (a peer's snapshot) is ``invalid_state``, not
    ``env_error`` "The truth value of an array ... is ambiguous"."""
    server, client = _stateful_session(BatchEnvHost(BatchCartPole(num_envs=2)))
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    states = client.parse_get_state(server.handle(client.request_get_state()))
    states[0][key] = np.array([0, 1])
    error = _refused(server, client, states)
    assert error.remote_code == "invalid_state"
    assert "a BatchEnv host snapshot is" in str(error)


def test_an_array_as_an_env_snapshots_format_is_invalid_state_on_the_wire() -> None:
    server, client = _stateful_session(
        EnvListHost([simkit.make("simkit/CartPole-v0") for _ in range(2)])
    )
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    states = client.parse_get_state(server.handle(client.request_get_state()))
    states[1]["env"]["format"] = np.array([1, 1])
    error = _refused(server, client, states)
    assert error.remote_code == "invalid_state"
    assert "state format must be 1" in str(error)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda b: b.update(broken=np.array([True, False])),
            "the batch's state 'broken' must be a bool",
        ),
        (lambda b: b["env"].update(obs="x"), r"state\['obs'\] must be a float32 array"),
        (lambda b: b["env"].update(params=[{}, {}]), r"state\['params'\]\[0\] must hold a value"),
        (lambda b: b["env"].update(root_seed=2**64 - 1), r"state\['root_seeds'\]\[0\] must be"),
        (lambda b: b["env"].update(format=np.array([1, 1])), "state format must be 1"),
        (lambda b: b["env"].update(env=np.array([1, 2])), "state belongs to env"),
        (lambda b: b["env"].update(num_envs=np.array([2, 2])), "state holds array"),
    ],
)
def test_a_refused_batch_host_set_state_changes_nothing(change: Any, match: str) -> None:
    server, client = _stateful_session(BatchEnvHost(BatchCartPole(num_envs=2)))
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    client.parse_step(server.handle(client.request_step(np.ones(2, np.int64))))
    states = client.parse_get_state(server.handle(client.request_get_state()))
    before = dumps(states)
    change(states[0]["batch"])
    error = _refused(server, client, states)
    assert error.remote_code == "invalid_state"
    assert re.search(match, str(error))
    assert dumps(client.parse_get_state(server.handle(client.request_get_state()))) == before
    client.parse_step(server.handle(client.request_step(np.ones(2, np.int64))))
