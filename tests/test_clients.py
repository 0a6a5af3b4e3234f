"""RemoteVectorEnv against live servers: bit-exact vs local, multi-server, failures, learners."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from simkit.clients import RemoteVectorEnv, ServerUnavailable, remote_demo
from simkit.clients.remote._connection import Connection
from simkit.errors import ResetNeeded, SimkitError
from simkit.protocol import RemoteError
from simkit.servers import RolloutServer
from simkit.vector import VectorEnv

ENV_IDS = ["simkit/CartPole-v0", "simkit/Cheetah-v0"]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``serve(env_id, num_envs, k=0)``: the endpoint of server ``k`` of that kind.

    Servers live for the module; every client still gets its own session and envs.
    """
    root = tmp_path_factory.mktemp("servers")
    servers: dict[tuple[str, int, int], RolloutServer] = {}

    def start(env_id: str, num_envs: int, k: int = 0) -> str:
        key = (env_id, num_envs, k)
        if key not in servers:
            bind = f"ipc://{root}/s{len(servers)}.sock"
            servers[key] = RolloutServer(env_id, num_envs, bind).start()
        return servers[key].endpoint

    yield start
    for server in servers.values():
        server.stop()


def _assert_tree_equal(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _assert_tree_equal(a[k], b[k])
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.asarray(a).dtype == np.asarray(b).dtype


def _actions(space: gym.Space[Any], seed: int, steps: int) -> list[Any]:
    space.seed(seed)
    return [space.sample() for _ in range(steps)]


@pytest.mark.parametrize("env_id", ENV_IDS)
@given(seed=st.integers(0, 2**63 - 1), split=st.sampled_from([(3,), (1, 2), (2, 1)]))
def test_remote_equals_local_bit_for_bit(
    serve: Any, env_id: str, seed: int, split: tuple[int, ...]
) -> None:
    """Same seed and actions: identical obs, rewards, flags, final obs and infos,
    also when the envs are split over several servers."""
    endpoints = [serve(env_id, n, k) for k, n in enumerate(split)]
    n = sum(split)
    local = VectorEnv(env_id, n)
    remote = RemoteVectorEnv(endpoints, timeout=10)
    try:
        assert remote.num_envs == n
        assert remote.single_observation_space == local.single_observation_space
        assert remote.action_space == local.action_space
        assert remote.metadata["autoreset_mode"] == local.metadata["autoreset_mode"]
        steps = 60 if env_id.endswith("CartPole-v0") else 15
        lo, li = local.reset(seed=seed)
        ro, ri = remote.reset(seed=seed)
        _assert_tree_equal(lo, ro)
        _assert_tree_equal(li, ri)
        for k, act in enumerate(_actions(local.action_space, seed % 2**32, steps)):
            if k % 2:
                lb, rb = local.step_batch(act), remote.step_batch(act)
                for field in ("obs", "reward", "terminated", "truncated", "final_obs", "env_ids"):
                    _assert_tree_equal(getattr(lb, field), getattr(rb, field))
                continue
            lres, rres = local.step(act), remote.step(act)
            for a, b in zip(lres[:4], rres[:4], strict=True):
                _assert_tree_equal(a, b)
            linfo, rinfo = lres[4], rres[4]
            assert set(linfo) == set(rinfo)
            if "final_obs" in linfo:
                _assert_tree_equal(linfo["_final_obs"], rinfo["_final_obs"])
                for i in np.flatnonzero(linfo["_final_obs"]):
                    _assert_tree_equal(linfo["final_obs"][i], rinfo["final_obs"][i])
    finally:
        local.close()
        remote.close()


def test_next_step_mode_equals_local(serve: Any) -> None:
    endpoints = [serve("simkit/CartPole-v0", 2, 0), serve("simkit/CartPole-v0", 1, 0)]
    remote = RemoteVectorEnv(endpoints, timeout=10, autoreset_mode="NextStep")
    local = VectorEnv("simkit/CartPole-v0", 3, autoreset_mode="NextStep")
    try:
        assert remote.metadata["autoreset_mode"] is gym.vector.AutoresetMode.NEXT_STEP
        _assert_tree_equal(local.reset(seed=11)[0], remote.reset(seed=11)[0])
        ended = 0
        for act in _actions(local.action_space, 5, 80):
            lres, rres = local.step(act), remote.step(act)
            for a, b in zip(lres[:4], rres[:4], strict=True):
                _assert_tree_equal(a, b)
            assert set(lres[4]) == set(rres[4])
            ended += int(np.sum(lres[2] | lres[3]))
        assert ended > 0
        seeds = [5, 2**40, 9]
        _assert_tree_equal(local.reset(seed=seeds)[0], remote.reset(seed=seeds)[0])
        for act in _actions(local.action_space, 6, 30):
            _assert_tree_equal(local.step(act)[0], remote.step(act)[0])
        with pytest.raises(ValueError, match="a list of 3 ints, got a list of 2"):
            remote.reset(seed=[1, 2])
        with pytest.raises(ValueError, match="got DISABLED"):
            RemoteVectorEnv(endpoints, autoreset_mode="Disabled")
    finally:
        remote.close()
        local.close()


def test_a_reply_for_other_envs_than_sent_is_refused(serve: Any) -> None:
    remote = RemoteVectorEnv(serve("simkit/CartPole-v0", 2, 0), timeout=10)
    try:
        remote.reset(seed=0)
        remote.send(np.zeros(1, dtype=np.int64), env_ids=[0])
        remote._inflight[0][0] = np.array([1], dtype=np.int64)  # as if env 1 had been sent
        with pytest.raises(RuntimeError, match=r"answered for envs \[0\], expected \[1\]"):
            remote.recv()
    finally:
        remote.close()


def test_send_recv_overlap_and_env_ids(serve: Any) -> None:
    """EnvPool-style halves in flight at once equal one full step of a local vector."""
    endpoints = [serve("simkit/CartPole-v0", 3, 0), serve("simkit/CartPole-v0", 3, 1)]
    remote = RemoteVectorEnv(endpoints, timeout=10)
    local = VectorEnv("simkit/CartPole-v0", 6)
    try:
        remote.reset(seed=7)
        local.reset(seed=7)
        for act in _actions(local.action_space, 3, 40):
            remote.send(act[:3], [0, 1, 2])
            remote.send(act[3:], np.array([3, 4, 5]))
            got = {}
            for _ in range(2):
                part = remote.recv()
                for k, g in enumerate(part.env_ids.tolist()):
                    got[g] = (part.obs[k], part.reward[k], part.final_obs[k])
            want = local.step_batch(act)
            assert sorted(got) == list(range(6))
            for g in range(6):
                np.testing.assert_array_equal(got[g][0], want.obs[g])
                np.testing.assert_array_equal(got[g][2], want.final_obs[g])
                assert got[g][1] == want.reward[g]
        with pytest.raises(RuntimeError, match="without a pending send"):
            remote.recv()
        with pytest.raises(ValueError, match=r"env_ids must not repeat"):
            remote.send(np.zeros(2, dtype=np.int64), [0, 0])
        sub = remote.step_batch(np.array([1, 0]), env_ids=[4, 1])
        assert sub.env_ids.tolist() == [4, 1]
    finally:
        remote.close()
        local.close()


@pytest.mark.parametrize("layout", [(4,), (2, 2)])
def test_permuted_env_ids_step_the_named_envs(serve: Any, layout: tuple[int, ...]) -> None:
    """Every env id, out of order: each row's action moves the env that row names."""
    endpoints = [serve("simkit/CartPole-v0", n, 10 + k) for k, n in enumerate(layout)]
    remote = RemoteVectorEnv(endpoints, timeout=10)
    local = VectorEnv("simkit/CartPole-v0", 4)
    try:
        remote.reset(seed=11)
        local.reset(seed=11)
        order = np.array([2, 0, 3, 1])
        for act in _actions(local.action_space, 5, 30):
            got = remote.step_batch(act, env_ids=order)
            in_env_order = np.empty_like(act)
            in_env_order[order] = act
            want = local.step_batch(in_env_order)
            assert got.env_ids.tolist() == order.tolist()
            for field in ("obs", "reward", "terminated", "truncated", "final_obs"):
                np.testing.assert_array_equal(getattr(got, field), getattr(want, field)[order])
    finally:
        remote.close()
        local.close()


class _ClockSpy:
    """Stands in for the ``time`` module of simkit.clients.remote._connection: records every
    ``perf_counter`` reading (the busy-poll loop's clock) and passes the rest through."""

    def __init__(self) -> None:
        self.readings: list[float] = []

    def perf_counter(self) -> float:
        now = time.perf_counter()
        self.readings.append(now)
        return now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.mark.parametrize("busy_poll_us", [0, 30_000])
def test_busy_polling_client_spins_then_sleeps(
    tmp_path: Path, busy_poll_us: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With busy_poll_us the waiting thread polls for that long, then blocks in recv for
    a late reply; without it, it never polls. Asserted on the poll loop's own clock
    readings, not on CPU time (which a loaded machine distorts)."""
    import simkit.clients.remote._connection as connection

    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc://{tmp_path}/late.sock")
    conn = Connection(f"ipc://{tmp_path}/late.sock", 5.0, ctx, busy_poll_us=busy_poll_us)
    spy = _ClockSpy()
    try:
        conn.send("ping", conn.session.request_ping())
        request = router.recv_multipart()
        reply = threading.Timer(0.15, router.send_multipart, args=([request[0], b"late"],))
        monkeypatch.setattr(connection, "time", spy)
        reply.start()
        sent_at = time.perf_counter() + 0.15
        assert [bytes(f) for f in conn.recv()] == [b"late"]
        reply.join()
        monkeypatch.undo()
        if busy_poll_us:
            first, last = spy.readings[0], spy.readings[-1]
            assert len(spy.readings) > 2  # it polled
            assert last - first >= busy_poll_us * 1e-6  # until its window was spent
            assert last < sent_at  # and then blocked: no polling while the reply was late
        else:
            assert spy.readings == []
    finally:
        conn.close(polite=False)
        router.close(linger=0)
    with pytest.raises(ValueError, match="busy_poll_us must be an int >= 0, got -5"):
        RemoteVectorEnv("ipc:///nowhere", busy_poll_us=-5)


def test_busy_polling_remote_equals_local(serve: Any) -> None:
    remote = RemoteVectorEnv(serve("simkit/CartPole-v0", 3), timeout=10, busy_poll_us=200)
    local = VectorEnv("simkit/CartPole-v0", 3)
    try:
        remote.reset(seed=5)
        local.reset(seed=5)
        for act in _actions(local.action_space, 1, 25):
            got, want = remote.step_batch(act), local.step_batch(act)
            for field in ("obs", "reward", "terminated", "truncated", "final_obs"):
                np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
    finally:
        remote.close()
        local.close()


def test_get_set_state_replays(serve: Any) -> None:
    remote = RemoteVectorEnv(serve("simkit/CartPole-v0", 2), timeout=10)
    try:
        with pytest.raises(ResetNeeded, match="reset"):
            remote.step(np.zeros(2, dtype=np.int64))
        remote.reset(seed=3)
        acts = _actions(remote.action_space, 0, 30)
        states = remote.get_state()
        first = [remote.step_batch(a) for a in acts]
        remote.set_state(states)
        again = [remote.step_batch(a) for a in acts]
        for a, b in zip(first, again, strict=True):
            np.testing.assert_array_equal(a.obs, b.obs)
            np.testing.assert_array_equal(a.reward, b.reward)
        with pytest.raises(ValueError, match="one snapshot per env"):
            remote.set_state(states[:1])
    finally:
        remote.close()


def test_bad_input_and_server_errors(serve: Any) -> None:
    endpoint = serve("simkit/CartPole-v0", 2)
    with pytest.raises(ValueError, match="endpoint must be a ZeroMQ address"):
        RemoteVectorEnv("localhost:5555")
    with pytest.raises(ValueError, match="at least one endpoint"):
        RemoteVectorEnv([])
    with pytest.raises(ValueError, match="servers must serve the same env"):
        RemoteVectorEnv([endpoint, serve("simkit/Cheetah-v0", 1)], timeout=10)
    remote = RemoteVectorEnv(endpoint, timeout=10)
    try:
        with pytest.raises(ValueError, match="without 'reset_mask'"):
            remote.reset(options={"reset_mask": np.array([True, False])})
        remote.reset(seed=0)
        with pytest.raises(RemoteError, match=r"out_of_space|invalid"):
            remote.step(np.array([5, 0]))
        obs, *_ = remote.step(np.array([1, 0]))  # the server keeps serving this client
        assert obs.shape == (2, 4)
    finally:
        remote.close()


# -- failures across processes -----------------------------------------------------------


def _spawn(endpoint: str, num_envs: int = 2) -> subprocess.Popen[bytes]:
    """``simkit serve`` in a subprocess (clients connect once it has bound)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simkit.servers",
            "simkit/CartPole-v0",
            "--num-envs",
            str(num_envs),
            "--bind",
            endpoint,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_killed_server_gives_clear_error_then_reconnect(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/kill.sock"
    proc = _spawn(endpoint)
    remote = RemoteVectorEnv(endpoint, timeout=20)  # the first connect waits for the bind
    try:
        remote.reset(seed=1)
        remote.timeout = 0.5
        remote.step(np.zeros(2, dtype=np.int64))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        start = time.monotonic()
        with pytest.raises(
            ServerUnavailable, match=rf"{endpoint} did not answer 'step' within 0.5 s"
        ):
            remote.step(np.zeros(2, dtype=np.int64))
        assert time.monotonic() - start < 2.0
        with pytest.raises(ResetNeeded, match="connection was lost"):
            remote.step(np.zeros(2, dtype=np.int64))
        assert issubclass(ServerUnavailable, SimkitError)
        with pytest.raises(ServerUnavailable, match="did not answer 'hello'"):
            remote.reset(seed=1)  # still down: reset tries to reconnect
        proc = _spawn(endpoint)
        remote.timeout = 20
        obs, _ = remote.reset(seed=1)  # reconnects with a fresh session
        assert obs.shape == (2, 4)
        remote.step(np.zeros(2, dtype=np.int64))
        fresh = RemoteVectorEnv(endpoint, timeout=5)
        np.testing.assert_array_equal(fresh.reset(seed=1)[0], obs)
        fresh.close()
    finally:
        remote.close()
        proc.kill()
        proc.wait()


_CLIENT = """
import sys, time
from simkit.clients import RemoteVectorEnv
env = RemoteVectorEnv(sys.argv[1], timeout=10)
env.reset(seed=0)
print("ready", flush=True)
time.sleep(60)
"""


def test_killed_client_frees_its_slots(tmp_path: Path) -> None:
    server = RolloutServer(
        "simkit/CartPole-v0", 2, f"ipc://{tmp_path}/c.sock", heartbeat_timeout=0.5
    ).start()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, server.endpoint], stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        with proc.stdout:
            assert proc.stdout.readline().strip() == b"ready"
        assert server.sessions == 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while server.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.sessions == 0
    finally:
        server.stop()


# -- unchanged learners --------------------------------------------------------------------


def test_cleanrl_style_ppo_runs_on_remote(serve: Any) -> None:
    """A CleanRL-style PPO loop written for gymnasium.vector.VectorEnv, with wrappers."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    envs: gym.vector.VectorEnv[Any, Any, Any] = RemoteVectorEnv(
        serve("simkit/CartPole-v0", 4), timeout=10, autoreset_mode="NextStep"
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs = gym.wrappers.vector.NormalizeObservation(envs)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    n_act = int(envs.single_action_space.n)  # type: ignore[attr-defined]
    actor = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, n_act))
    critic = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=2.5e-3)
    num_steps, n = 32, envs.num_envs
    obs_buf = torch.zeros((num_steps, n, obs_dim))
    act_buf = torch.zeros((num_steps, n), dtype=torch.long)
    logp_buf, rew_buf, done_buf, val_buf = (torch.zeros((num_steps, n)) for _ in range(4))
    next_obs = torch.as_tensor(envs.reset(seed=0)[0], dtype=torch.float32)
    next_done = torch.zeros(n)
    episodes = 0
    for _update in range(4):
        for t in range(num_steps):
            obs_buf[t], done_buf[t] = next_obs, next_done
            with torch.no_grad():
                dist = torch.distributions.Categorical(logits=actor(next_obs))
                action = dist.sample()
                logp_buf[t], val_buf[t] = dist.log_prob(action), critic(next_obs).squeeze(-1)
            act_buf[t] = action
            o, r, term, trunc, info = envs.step(action.numpy())
            rew_buf[t] = torch.as_tensor(r, dtype=torch.float32)
            next_obs = torch.as_tensor(o, dtype=torch.float32)
            next_done = torch.as_tensor(np.logical_or(term, trunc), dtype=torch.float32)
            if "episode" in info:
                episodes += int(info["_episode"].sum())
                assert np.all(info["episode"]["l"][info["_episode"]] > 0)
        with torch.no_grad():
            adv = torch.zeros_like(rew_buf)
            last = torch.zeros(n)
            next_v = critic(next_obs).squeeze(-1)
            for t in reversed(range(num_steps)):
                nonterm = 1.0 - (next_done if t == num_steps - 1 else done_buf[t + 1])
                nv = next_v if t == num_steps - 1 else val_buf[t + 1]
                delta = rew_buf[t] + 0.99 * nv * nonterm - val_buf[t]
                last = delta + 0.99 * 0.95 * nonterm * last
                adv[t] = last
            ret = adv + val_buf
        b_obs, b_act = obs_buf.reshape(-1, obs_dim), act_buf.reshape(-1)
        b_logp, b_adv, b_ret = logp_buf.reshape(-1), adv.reshape(-1), ret.reshape(-1)
        for _epoch in range(2):
            dist = torch.distributions.Categorical(logits=actor(b_obs))
            ratio = (dist.log_prob(b_act) - b_logp).exp()
            norm_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)
            pg = torch.max(-norm_adv * ratio, -norm_adv * ratio.clamp(0.8, 1.2)).mean()
            v_loss = 0.5 * ((critic(b_obs).squeeze(-1) - b_ret) ** 2).mean()
            loss = pg + 0.5 * v_loss - 0.01 * dist.entropy().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert torch.isfinite(loss)
    assert episodes > 0
    envs.close()


def test_dropped_session_reconnects_on_reset(tmp_path: Path) -> None:
    """A client idle past the server's heartbeat gets a clear error; reset() recovers."""
    with RolloutServer(
        "simkit/CartPole-v0", 1, f"ipc://{tmp_path}/hb.sock", heartbeat_timeout=0.2
    ) as server:
        remote = RemoteVectorEnv(server.endpoint, timeout=5, keepalive=False)
        try:
            remote.reset(seed=0)
            deadline = time.monotonic() + 5
            while server.sessions and time.monotonic() < deadline:
                time.sleep(0.05)
            with pytest.raises(RemoteError, match="session_state"):
                remote.step(np.zeros(1, dtype=np.int64))
            obs, _ = remote.reset(seed=0)
            assert obs.shape == (1, 4)
            remote.step(np.zeros(1, dtype=np.int64))
        finally:
            remote.close()


def test_keepalive_holds_an_idle_session_past_the_heartbeat(tmp_path: Path) -> None:
    """A learner silent for several heartbeat timeouts (a long update) keeps its envs."""
    with RolloutServer(
        "simkit/CartPole-v0", 1, f"ipc://{tmp_path}/ka.sock", heartbeat_timeout=1.0
    ) as server:
        kept = RemoteVectorEnv(server.endpoint, timeout=5)
        dropped = RemoteVectorEnv(server.endpoint, timeout=5, keepalive=False)
        try:
            assert kept.server_infos[0].heartbeat_timeout == pytest.approx(1.0)
            kept.reset(seed=0)
            dropped.reset(seed=0)
            deadline = time.monotonic() + 10
            while server.sessions > 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)  # more silence than a whole timeout
            assert server.sessions == 1
            kept.step(np.zeros(1, dtype=np.int64))
            with pytest.raises(RemoteError, match="session_state"):
                dropped.step(np.zeros(1, dtype=np.int64))
        finally:
            kept.close()
            dropped.close()
        assert server.sessions == 0


def test_a_near_zero_heartbeat_timeout_does_not_make_the_keepalive_spin() -> None:
    """A server may announce ``heartbeat_timeout=1e-9``: the keepalive thread pinged
    every quarter of it, in a tight loop. Its interval has a floor of 10 ms now."""
    from simkit.clients.remote._connection import KEEPALIVE_FLOOR_S, _Keepalive

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    class Silent:  # the Connection surface the thread reads: a learner that sent nothing
        endpoint = f"tcp://127.0.0.1:{port}"
        last_activity = 0.0
        timeout = 5.0

        def new_socket(self) -> zmq.Socket[Any]:
            sock = ctx.socket(zmq.DEALER)
            sock.connect(self.endpoint)
            return sock

    conn = Silent()
    keepalive = _Keepalive(conn, "token", 1e-9 / 4)  # type: ignore[arg-type]  # a fake
    pings, seconds = 0, 0.5
    try:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if router.poll(10):
                router.recv_multipart()
                pings += 1
    finally:
        keepalive.stop()
        router.close(0)
        ctx.term()
    assert 0 < pings <= 2 * seconds / KEEPALIVE_FLOOR_S, pings


def test_curve_keys_connect_remote_clients(tmp_path: Path) -> None:
    """RemoteVectorEnv reaches a CURVE server with keys from zmq.auth certificate files."""
    import zmq.auth

    from simkit.clients import CurveKeys

    server_public_file, server_secret_file = zmq.auth.create_certificates(tmp_path, "server")
    client_public_file, client_secret_file = zmq.auth.create_certificates(tmp_path, "client")
    server_public, server_secret = zmq.auth.load_certificate(server_secret_file)
    client_public, _ = zmq.auth.load_certificate(client_public_file)
    assert server_secret is not None
    keys = CurveKeys.from_files(server_public_file, client_secret_file)
    with RolloutServer(
        "simkit/CartPole-v0",
        2,
        "tcp://127.0.0.1:0",
        curve_secret_key=server_secret,
        curve_allowed_clients=[client_public],
        heartbeat_timeout=0.4,
    ) as server:
        remote = RemoteVectorEnv(server.endpoint, timeout=5, curve=keys)
        try:
            remote.reset(seed=3)
            time.sleep(1.0)  # the keepalive socket authenticates too
            assert server.sessions == 1
            step = remote.step_batch(np.zeros(2, dtype=np.int64))
            assert step.obs.shape == (2, 4)
        finally:
            remote.close()
        stranger = CurveKeys(server_public, *zmq.curve_keypair())
        with pytest.raises(ServerUnavailable, match="did not answer 'hello'"):
            RemoteVectorEnv(server.endpoint, timeout=0.5, curve=stranger)
    with pytest.raises(
        ValueError, match=r"secret must be a 40-character z85 key .*, got 3 characters"
    ):
        CurveKeys(server_public, client_public, b"abc")
    with pytest.raises(ValueError, match="holds no secret key"):
        CurveKeys.from_files(server_public_file, client_public_file)
    with pytest.raises(TypeError, match="curve must be CurveKeys or None, got dict"):
        RemoteVectorEnv("ipc:///nowhere", curve={"key": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "which"), [("fifo", 0), ("zero", 1), ("folder", 0), ("large", 1)])
def test_curve_key_files_that_are_no_regular_files_are_refused_naming_them(
    tmp_path: Path, kind: str, which: int
) -> None:
    """``CurveKeys.from_files`` read with ``zmq.auth.load_certificate``: a FIFO named as
    a key file hung the learner forever and a link to ``/dev/zero`` (one endless line)
    read until memory ran out. It checks them as the server does (a regular file of at
    most 64 KiB) and names the file."""
    import zmq.auth

    files = [zmq.auth.create_certificates(tmp_path, "server")[0]]
    files.append(zmq.auth.create_certificates(tmp_path, "client")[1])
    evil = tmp_path / "evil.key"
    if kind == "fifo":
        os.mkfifo(evil)
    elif kind == "zero":
        evil.symlink_to("/dev/zero")
    elif kind == "folder":
        evil.mkdir()
    else:
        with open(evil, "wb") as f:
            f.truncate(1 << 20)
    files[which] = str(evil)
    code = "import sys; from simkit.clients import CurveKeys; CurveKeys.from_files(*sys.argv[1:])"

    def cap_memory() -> None:  # before, /dev/zero grew until this cap (a MemoryError)
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    run = [sys.executable, "-c", code, *files]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60, preexec_fn=cap_memory)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ValueError: key file {evil}: "), done.stderr[-2000:]
    assert ("not a regular file" in last) is (kind != "large"), last
    assert ("more than a key file's 65,536" in last) is (kind == "large"), last


def test_remote_demo_reports_figures() -> None:
    """The remote part of ``simkit demo``: a served env, measured next to local."""
    figures = remote_demo("simkit/CartPole-v0", num_envs=4, steps=40)
    assert figures.identical
    assert figures.remote_steps_per_s > 0
    assert figures.local_steps_per_s > 0
    assert 0 < figures.remote_p50_ms <= figures.remote_p99_ms
    table = figures.table()
    assert "| remote (simkit serve, ipc) |" in table
    assert "bit for bit: yes" in table


def test_the_lost_server_errors_are_public_and_server_unavailable() -> None:
    """A learner catches a lost or refused server by name (docs/training.md names them),
    and as a ServerUnavailable; they were reachable only from private modules."""
    import simkit.clients as clients

    assert issubclass(clients.ServerRefused, clients.ServerLost)
    assert issubclass(clients.ServerLost, clients.ServerUnavailable)
    assert {"ServerLost", "ServerRefused"} <= set(clients.__all__)
