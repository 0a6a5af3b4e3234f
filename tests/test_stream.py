"""Policy serving end to end: rollout servers run the policy and stream fragments."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zmq
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from stream_helpers import assert_same_fragment, weights_version

import simkit
from simkit._types import Fragment
from simkit.clients import PolicyStream, RemoteVectorEnv, ServerUnavailable
from simkit.envs.batch_cartpole import BatchCartPole
from simkit.models import ModelSpec, PolicyWeights, build_model
from simkit.protocol import RemoteError, StreamClientSession, StreamConfig
from simkit.rollout._policy import RowPolicy
from simkit.servers import RolloutServer
from simkit.vector import VectorEnv

SPEC = ModelSpec("mlp", {"hidden_sizes": [16, 16]})
CARTPOLE = "simkit/CartPole-v0"


def row_policy(model: Any, space: Any, seed: int, num_slots: int, first_slot: int = 0) -> RowPolicy:
    """A CPU ``RowPolicy`` of ``model`` for ``num_slots`` one-row slots from ``first_slot``."""
    return RowPolicy(
        model,
        torch.device("cpu"),
        seed=seed,
        first_slot=first_slot,
        num_slots=num_slots,
        rows_per_slot=1,
        action_space=space,
    )


Servers = Callable[..., RolloutServer]


@pytest.fixture
def serve() -> Iterator[Servers]:
    """Starts policy-serving servers on free loopback ports; stops them at teardown."""
    made: list[RolloutServer] = []

    def start(env_id: str = CARTPOLE, num_envs: int = 4, **kw: Any) -> RolloutServer:
        kw.setdefault("device", "cpu")
        kw.setdefault("fragment_length", 8)
        srv = RolloutServer(env_id, num_envs, "tcp://127.0.0.1:0", policy=True, **kw).start()
        made.append(srv)
        return srv

    yield start
    for srv in made:
        srv.stop()


def _model(env_id: str = CARTPOLE) -> torch.nn.Module:
    envs = VectorEnv(env_id, 1)
    try:
        return build_model(SPEC, envs.single_observation_space, envs.single_action_space)
    finally:
        envs.close()


def _run(
    endpoints: list[str], model: torch.nn.Module, *, seed: int, updates: int, **kw: Any
) -> list[Fragment]:
    with PolicyStream(endpoints, SPEC, num_envs=4, seed=seed, timeout=20, **kw) as stream:
        out = []
        for version in range(updates):
            stream.push_weights(weights_version(model, version))
            out.append(stream.next_batch())
        return out


@pytest.fixture(scope="module")
def layouts() -> Iterator[dict[str, list[str]]]:
    """Servers of the same env: one, one with 2 threads, two splitting the slots."""
    kwargs: dict[str, Any] = {
        "env_kwargs": {"max_episode_steps": 5},  # truncations: final_values matter
        "device": "cpu",
        "fragment_length": 8,
        "policy": True,
    }
    one = RolloutServer(CARTPOLE, 4, "tcp://127.0.0.1:0", **kwargs).start()
    threads = RolloutServer(CARTPOLE, 4, "tcp://127.0.0.1:0", num_threads=2, **kwargs).start()
    half_a = RolloutServer(CARTPOLE, 2, "tcp://127.0.0.1:0", **kwargs).start()
    half_b = RolloutServer(CARTPOLE, 2, "tcp://127.0.0.1:0", **kwargs).start()
    yield {
        "one": [one.endpoint],
        "threads": [threads.endpoint],
        "two": [half_a.endpoint, half_b.endpoint],
    }
    for srv in (one, threads, half_a, half_b):
        srv.stop()


@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**63 - 1))
def test_sync_fragments_are_bit_identical_across_runs_threads_and_server_splits(
    layouts: dict[str, list[str]], seed: int
) -> None:
    model = _model()
    one = layouts["one"]
    reference = _run(one, model, seed=seed, updates=3)
    assert reference[0].final_values.any()
    assert [f.policy_version.tolist() for f in reference] == [[v] * 8 for v in range(3)]
    for other in (
        _run(one, model, seed=seed, updates=3),
        _run(layouts["threads"], model, seed=seed, updates=3),
        _run(layouts["two"], model, seed=seed, updates=3),
    ):
        for a, b in zip(reference, other, strict=True):
            assert_same_fragment(a, b)


def test_a_fragment_replays_through_a_local_vector_bit_for_bit(serve: Servers) -> None:
    model = _model()
    srv = serve(num_envs=3, env_kwargs={"max_episode_steps": 6})
    with PolicyStream(
        srv.endpoint, SPEC, num_envs=3, seed=11, with_states=True, fragment_length=10, timeout=20
    ) as stream:
        weights = weights_version(model, 0)
        stream.push_weights(weights)
        fragment = stream.next_fragment()
    assert fragment.start_state is not None
    assert fragment.truncated.any()
    local = VectorEnv(CARTPOLE, 3, env_kwargs={"max_episode_steps": 6})
    local.reset(seed=0)
    local.set_state(fragment.start_state)
    # The actions: the same weights and the noise keyed by (seed, slot, step).
    replica = build_model(SPEC, local.single_observation_space, local.single_action_space)
    policy = row_policy(replica, local.single_action_space, 11, 3)
    policy.set_weights(weights)
    for t in range(fragment.num_steps):
        out = policy.act(np.asarray(fragment.obs[t]), t)
        assert out.actions.tobytes() == fragment.actions[t].tobytes()
        assert out.log_probs.tobytes() == fragment.log_probs[t].tobytes()
        step = local.step_batch(np.asarray(fragment.actions[t]))
        following = fragment.obs[t + 1] if t + 1 < fragment.num_steps else fragment.last_obs
        assert step.obs.tobytes() == np.asarray(following).tobytes()
        assert step.reward.tobytes() == fragment.rewards[t].tobytes()
        assert np.array_equal(step.terminated, fragment.terminated[t])
        assert np.array_equal(step.truncated, fragment.truncated[t])
    local.close()


def _sample(srv: RolloutServer, name: str, **labels: str) -> float:
    value = srv.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def test_without_credit_the_server_stalls_within_one_fragment(serve: Servers) -> None:
    model = _model()
    srv = serve(num_envs=4, fragment_length=8, metrics_port=0)
    with PolicyStream(srv.endpoint, SPEC, num_envs=4, mode="async", credit=2, timeout=20) as stream:
        stream.push_weights(model)
        deadline = time.monotonic() + 10
        while _sample(srv, "simkit_stream_fragments_total") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # a server ignoring credit would go on stepping here
        steps = _sample(srv, "simkit_stream_env_steps_total")
        assert steps == 2 * 8 * 4
        assert _sample(srv, "simkit_stream_stalled_seconds_total") > 0.1
        time.sleep(0.2)
        assert _sample(srv, "simkit_stream_env_steps_total") == steps  # flat: nothing buffered
        stream.next_fragment()  # the learner takes one: one more credit, one more fragment
        deadline = time.monotonic() + 10
        while _sample(srv, "simkit_stream_fragments_total") < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        assert _sample(srv, "simkit_stream_env_steps_total") == 3 * 8 * 4
    url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    for name in (
        "simkit_stream_stalled_seconds_total",
        "simkit_stream_inference_latency_seconds_bucket",
        "simkit_stream_inference_batch_size_count",
        "simkit_stream_env_step_latency_seconds_count",
        "simkit_stream_fragments_per_second",
        'simkit_stream_policy_lag{stat="min"}',
        'simkit_stream_policy_lag{stat="avg"}',
        'simkit_stream_policy_lag{stat="max"}',
        "simkit_stream_env_steps_total",
        "simkit_stream_credit",
        "simkit_stream_queue_depth",
        "simkit_stream_policy_version",
        "simkit_env_steps_total",  # the step path's metrics share the registry
    ):
        assert name in text


def _wait_for(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_close_frees_the_session_and_its_envs(serve: Servers) -> None:
    srv = serve()
    stream = PolicyStream(srv.endpoint, SPEC, num_envs=4, timeout=20)
    assert srv.stream_sessions == 1
    worker = next(iter(srv._streams.workers.values()))
    stream.close()
    assert _wait_for(lambda: srv.stream_sessions == 0, 5)
    assert worker.envs_closed.wait(5)


def test_credit_beyond_the_servers_cap_is_refused_at_open_naming_credit(serve: Servers) -> None:
    """The server announces its credit cap; asking for more fails at once, in the
    learner's terms, and frees the session (it failed at the first fragment)."""
    srv = serve()
    with pytest.raises(ValueError, match=r"credit must be <= 64 .*got 65"):
        PolicyStream(srv.endpoint, SPEC, num_envs=4, timeout=20, credit=65)
    assert _wait_for(lambda: srv.stream_sessions == 0, 5)


def test_a_learner_that_vanishes_is_freed_by_heartbeat(serve: Servers) -> None:
    srv = serve(heartbeat_timeout=0.5)
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(srv.endpoint)
    session = StreamClientSession()
    sock.send_multipart(session.request_open(StreamConfig(model=SPEC.to_plain(), num_envs=2)))
    assert sock.poll(20000)
    session.parse(sock.recv_multipart())
    assert srv.stream_sessions == 1
    worker = next(iter(srv._streams.workers.values()))
    sock.close(linger=0)  # no goodbye
    ctx.term()
    assert _wait_for(lambda: srv.stream_sessions == 0, 5)
    assert worker.envs_closed.wait(5)
    assert _sample(srv, "simkit_stream_sessions_expired_total") == 1


_LEARNER = """
import sys, time
from simkit.clients import PolicyStream
from simkit.models import ModelSpec, build_model
from simkit.vector import VectorEnv
envs = VectorEnv("simkit/CartPole-v0", 1)
spec = ModelSpec("mlp", {"hidden_sizes": [16, 16]})
model = build_model(spec, envs.single_observation_space, envs.single_action_space)
stream = PolicyStream(sys.argv[1], spec, num_envs=2, mode="async", credit=2, timeout=20)
stream.push_weights(model)
stream.next_fragment()
print("streaming", flush=True)
time.sleep(60)
"""


def test_a_killed_learner_process_frees_its_stream_session_and_envs(serve: Servers) -> None:
    """SIGKILL of a real learner process (no goodbye, its socket gone with it): the
    server frees the session and closes its envs after the heartbeat timeout."""
    srv = serve(heartbeat_timeout=0.5, metrics_port=0)
    proc = subprocess.Popen(
        [sys.executable, "-c", _LEARNER, srv.endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "streaming"
        assert srv.stream_sessions == 1
        worker = next(iter(srv._streams.workers.values()))
        proc.kill()
        proc.wait(10)
        assert _wait_for(lambda: srv.stream_sessions == 0, 10)
        assert worker.envs_closed.wait(5)
        assert _sample(srv, "simkit_stream_sessions_expired_total") == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_dead_server_is_named_within_the_timeout_and_nothing_received_is_lost(
    serve: Servers,
) -> None:
    model = _model()
    a, b = serve(num_envs=2), serve(num_envs=2)
    stream = PolicyStream(
        [a.endpoint, b.endpoint], SPEC, num_envs=4, mode="async", credit=3, timeout=1.0
    )
    try:
        stream.push_weights(model)
        first = stream.next_batch()
        assert _wait_for(lambda: _sample(b, "simkit_stream_fragments_total") >= 4, 10)
        b.stop()
        start = time.monotonic()

        def take_ten() -> None:
            for _ in range(10):
                stream.next_batch()

        with pytest.raises(ServerUnavailable, match=b.endpoint.replace(".", r"\.")) as info:
            take_ten()
        assert time.monotonic() - start < 1.0 + 3.0
        assert info.value.endpoint == b.endpoint
        stats = {s.endpoint: s for s in stream.stats()}
        assert not stats[b.endpoint].alive
        kept = stream.remove_server(b.endpoint)
        # Every fragment b sent arrived: taken before the failure, or kept.
        taken_from_b = stats[b.endpoint].fragments - len(kept)
        assert taken_from_b >= 1
        assert all(f.source == b.endpoint for f in kept)
        assert first.num_rows == 4
        assert stream.next_fragment().source == a.endpoint  # the stream goes on with a
    finally:
        stream.close()


def test_in_sync_mode_the_timeout_names_the_server_that_owes_a_fragment(
    serve: Servers,
) -> None:
    """Sync mode: ``a`` delivered its fragment of the version and waits, silent, for the
    next weights; ``b`` acked the weights after that and then died. The timeout named
    the server heard from least recently (``a``, alive) instead of the one still owing a
    fragment (``b``)."""
    model = _model()
    a, b = serve(num_envs=2), serve(num_envs=2)
    stream = PolicyStream([a.endpoint, b.endpoint], SPEC, num_envs=4, timeout=5.0)
    try:
        stream.push_weights(model)
        stream.next_batch()
        b.stop()
        stream.push_weights(model, wait=False)
        assert stream.next_fragment().source == a.endpoint
        owing = next(s for s in stream._servers if s.conn.endpoint == b.endpoint)
        owing.last_heard = time.monotonic()  # its weights ack came after a's fragment
        with pytest.raises(ServerUnavailable) as info:
            stream.next_fragment()
        assert info.value.endpoint == b.endpoint
        stats = {s.endpoint: s.alive for s in stream.stats()}
        assert stats == {a.endpoint: True, b.endpoint: False}
    finally:
        stream.close(polite=False)


@pytest.mark.parametrize(
    ("second", "field"),
    [
        ({"env_id": "simkit/Pendulum-v0"}, "env_id"),
        ({"fragment_length": 16}, "fragment_length"),
    ],
)
def test_servers_of_one_stream_must_serve_the_same_env_and_fragments(
    serve: Servers, second: dict[str, Any], field: str
) -> None:
    """Servers of different envs, or different default fragment lengths, opened as one
    stream: their rows could not be stacked (or were stacked as one env's), and the
    stream took the first server's spaces for all. The open is refused, naming both."""
    a, b = serve(num_envs=2), serve(num_envs=2, **second)
    with pytest.raises(
        ValueError, match=rf"^the servers of one stream must agree: .*{field}"
    ) as info:
        PolicyStream([a.endpoint, b.endpoint], SPEC, num_envs=4, timeout=10)
    assert a.endpoint in str(info.value)
    assert b.endpoint in str(info.value)
    assert _wait_for(lambda: a.stream_sessions == b.stream_sessions == 0, 10)


def test_a_server_shutting_down_is_a_lost_server_not_a_refusal(serve: Servers) -> None:
    """A server stopping (SIGTERM) answers what it still reads with ``shutting_down``;
    the stream raised that as a plain RemoteError, which ended a learner's run instead
    of dropping (or, with --wait-for-servers, waiting for) the server."""
    from simkit.protocol import ProtocolError, encode, error_reply

    class Stopping(ProtocolError):
        code = "shutting_down"

    srv = serve(num_envs=2)
    stream = PolicyStream(srv.endpoint, SPEC, num_envs=2, timeout=5.0)
    try:
        stream.push_weights(_model())
        stream.next_batch()
        [inner] = stream._servers
        reply = error_reply(Stopping("the server is stopping"), request_id=7, request_kind="credit")
        with pytest.raises(ServerUnavailable, match="is shutting down") as info:
            stream._dispatch(inner, encode(reply))
        assert info.value.endpoint == srv.endpoint
        assert not stream.stats()[0].alive
    finally:
        stream.close(polite=False)


def test_a_killed_server_process_is_named_and_every_fragment_it_sent_is_delivered(
    tmp_path: Path,
) -> None:
    """SIGKILL, not a clean stop: the server says nothing; the learner's timeout names it."""
    endpoint = f"ipc://{tmp_path}/policy.sock"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "simkit.servers", "simkit/BatchCartPole-v0"),
            *("--num-envs", "4", "--policy", "--device", "cpu", "--fragment-length", "8"),
            *("--double-buffer", "--bind", endpoint),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "policy serving on cpu" in proc.stdout.readline()
        stream = PolicyStream(endpoint, SPEC, num_envs=4, mode="async", credit=3, timeout=2.0)
        assert stream.infos[0].double_buffered  # the command-line flag reached the sessions
        stream.push_weights(_model())
        taken = [stream.next_fragment()]
        time.sleep(1.0)  # the server fills its credit; the fragments reach this socket
        proc.kill()
        proc.wait(10)
        start = time.monotonic()

        def take_all() -> None:
            while True:
                taken.append(stream.next_fragment())

        with pytest.raises(ServerUnavailable, match=endpoint.replace(".", r"\.")) as info:
            take_all()
        assert time.monotonic() - start < 2.0 + 3.0
        assert info.value.endpoint == endpoint
        (stats,) = stream.stats()
        assert not stats.alive
        assert len(taken) == stats.fragments >= 2  # every fragment received was handed out
        assert [f.sequence for f in taken] == list(range(len(taken)))
        stream.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_bad_spec_and_bad_weights_are_named_and_the_last_good_policy_stays(
    serve: Servers,
) -> None:
    srv = serve()
    with pytest.raises(RemoteError, match="no-such-net") as unknown:
        PolicyStream(srv.endpoint, ModelSpec("no-such-net"), num_envs=4, timeout=20)
    assert unknown.value.remote_code == "unknown_model"
    assert "simkit.models" in str(unknown.value.expected)
    assert srv.stream_sessions == 0 or _wait_for(lambda: srv.stream_sessions == 0, 5)
    with pytest.raises(RemoteError, match=r"model 'mlp' rejected its spec: .*sigmoid") as spec:
        PolicyStream(srv.endpoint, ModelSpec("mlp", {"activation": "sigmoid"}), num_envs=4)
    assert spec.value.remote_code == "invalid_field"
    assert "activation" in str(spec.value.got)

    model = _model()
    with PolicyStream(srv.endpoint, SPEC, num_envs=4, timeout=20) as stream:
        good = weights_version(model, 3)
        stream.push_weights(good)
        wrong = dict(good.tensors)
        name = next(n for n in wrong if n.endswith("weight"))
        wrong[name] = np.zeros((7, 7), np.float32)
        with pytest.raises(RemoteError, match=f"tensor '{name}' has the wrong shape") as bad:
            stream.push_weights(PolicyWeights(4, wrong))
        assert bad.value.remote_code == "invalid_weights"
        assert f"expected {good.tensors[name].shape}, got (7, 7)" in str(bad.value)
        nan = {k: v.copy() for k, v in good.tensors.items()}
        nan[name][0, 0] = np.nan
        with pytest.raises(RemoteError, match="non-finite"):
            stream.push_weights(PolicyWeights(4, nan))
        renamed = dict(good.tensors)
        renamed["extra.weight"] = renamed.pop(name)
        with pytest.raises(
            RemoteError, match=rf"missing \['{name}'\], unexpected \['extra.weight'\]"
        ):
            stream.push_weights(PolicyWeights(4, renamed))
        widened = {**good.tensors, name: good.tensors[name].astype(np.float64)}
        with pytest.raises(RemoteError, match="wrong dtype: expected float32, got float64"):
            stream.push_weights(PolicyWeights(4, widened))
        with pytest.raises(RemoteError, match="must increase") as stale:
            stream.push_weights(weights_version(model, 2))
        assert stale.value.remote_code == "stale_version"
        assert stale.value.expected == "version > 3"
        assert stale.value.got == "2"
        fragment = stream.next_fragment()  # produced by the last good policy
        assert fragment.policy_version.tolist() == [3] * 8


def test_step_sessions_keep_working_while_a_stream_runs(serve: Servers) -> None:
    model = _model()
    srv = serve(num_envs=2)
    with PolicyStream(srv.endpoint, SPEC, num_envs=2, mode="async", credit=4, timeout=20) as stream:
        stream.push_weights(model)
        remote = RemoteVectorEnv(srv.endpoint, timeout=20)
        local = VectorEnv(CARTPOLE, 2)
        try:
            obs, _ = remote.reset(seed=5)
            want, _ = local.reset(seed=5)
            assert np.array_equal(obs, want)
            for _ in range(20):
                actions = np.array([0, 1])
                got = remote.step(actions)
                ref = local.step(actions)
                assert np.array_equal(got[0], ref[0])
            for _ in range(3):
                assert stream.next_fragment().num_rows == 2
        finally:
            remote.close()
            local.close()


def test_multi_agent_rows_share_one_forward_and_carry_the_agent_mask(serve: Servers) -> None:
    srv = serve("simkit/GoalNav-v0", num_envs=2, fragment_length=20)
    with PolicyStream(srv.endpoint, SPEC, num_envs=2, timeout=20) as stream:
        agents = stream.agents
        assert agents is not None
        assert stream.num_rows == 2 * len(agents)
        model = build_model(SPEC, stream.observation_space, stream.action_space)
        stream.push_weights(model)
        fragment = stream.next_fragment()
    assert fragment.num_rows == 2 * len(agents)
    assert fragment.agent_mask[0].all()
    assert fragment.env_ids.tolist() == np.repeat([0, 1], len(agents)).tolist()
    # Rows that did not act carry no reward, log-prob or value.
    idle = ~fragment.agent_mask
    assert not fragment.rewards[idle].any()
    assert not fragment.values[idle].any()
    assert _sample(srv, "simkit_stream_inference_batch_size_sum") >= 20 * 2 * len(agents)


def test_a_server_without_policy_refuses_stream_sessions() -> None:
    srv = RolloutServer(CARTPOLE, 1, "tcp://127.0.0.1:0").start()
    try:
        with pytest.raises(RemoteError, match="--policy") as info:
            PolicyStream(srv.endpoint, SPEC, num_envs=1, timeout=20)
        assert info.value.remote_code == "unsupported"
    finally:
        srv.stop()
        gc.collect()


def test_async_mode_drops_fragments_older_than_max_lag(serve: Servers) -> None:
    model = _model()
    srv = serve(num_envs=2, fragment_length=4)
    with PolicyStream(
        srv.endpoint, SPEC, num_envs=2, mode="async", max_lag=0, credit=3, timeout=20
    ) as stream:
        stream.push_weights(weights_version(model, 0))
        assert _wait_for(lambda: _sample(srv, "simkit_stream_fragments_total") >= 3, 10)
        stream.push_weights(weights_version(model, 1))  # the three queued fragments are now stale
        fragment = stream.next_fragment()
        assert fragment.policy_version.tolist() == [1] * 4
        (stats,) = stream.stats()
        assert stats.dropped >= 3
        assert stats.lag_max == 0


def test_serve_command_line_takes_the_policy_options() -> None:
    import argparse

    from simkit.servers import add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(
        [CARTPOLE, "--policy", "--device", "cpu", "--fragment-length", "32", "--torch-threads", "2"]
    )
    assert (args.policy, args.device, args.fragment_length, args.torch_threads) == (
        True,
        "cpu",
        32,
        2,
    )
    assert not parser.parse_args([CARTPOLE]).policy


# ------------------------------------------------------------- double buffering


def _loop(env_id: str, num_envs: int, *, halves: bool, length: int) -> tuple[Any, Any]:
    """A RolloutLoop over ``num_envs`` envs of ``env_id`` (split in two when ``halves``)."""
    from simkit.rollout._loop import RolloutLoop
    from simkit.rollout._rows import make_env_rows

    envs = make_env_rows(env_id, num_envs, env_kwargs={"max_episode_steps": 7}, halves=halves)
    if halves:
        envs.split()
    model = build_model(SPEC, envs.observation_space, envs.action_space)
    policy = row_policy(model, envs.action_space, 3, num_envs)
    return RolloutLoop(envs, policy, fragment_length=length), model


def test_a_parts_final_values_are_computed_at_its_rows_place_in_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The double-buffered loop evaluates a half's final observations alone; they must
    sit at their global rows (as the half's actions do), or a row's value bits depend on
    the split wherever BLAS sums by a row's place in its block (AVX2 machines)."""
    envs = VectorEnv(CARTPOLE, 8)
    model = build_model(SPEC, envs.single_observation_space, envs.single_action_space)
    envs.close()
    policy = row_policy(model, envs.single_action_space, 3, 8, first_slot=16)
    lean = policy.lean
    assert lean is not None
    seen: list[int] = []
    value = lean.value

    def spy(obs: np.ndarray, first_row: int = 0, rows: np.ndarray | None = None) -> np.ndarray:
        seen.append(first_row)
        return value(obs, first_row, rows)

    monkeypatch.setattr(lean, "value", spy)
    obs = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    rows = np.array([True, False, True, True])
    half = policy.value(obs[4:], rows, slice(4, 8))
    whole = policy.value(obs, np.concatenate([np.zeros(4, bool), rows]))
    assert seen == [20, 16]
    assert half.tobytes() == whole[4:].tobytes()
    assert (half[~rows] == 0).all()


@settings(max_examples=4, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(
    env_id=st.sampled_from(["simkit/BatchCartPole-v0", "simkit/BatchCheetah-v0"]),
    seed=st.integers(0, 2**32 - 1),
    swaps=st.lists(st.integers(0, 29), max_size=3, unique=True),
)
# Cheetah never terminates: episodes are truncated at steps 7, 14, ... and swaps right
# after them find a truncation in flight, whose final value needs the old weights.
@example(env_id="simkit/BatchCheetah-v0", seed=1, swaps=[7, 14])
def test_double_buffered_loop_gives_the_plain_loops_fragments(
    env_id: str, seed: int, swaps: list[int]
) -> None:
    """Halves overlapping physics and policy give the same bits as one whole-batch step,
    also when weights change mid-fragment (async mode)."""
    n = 8
    loops = [_loop(env_id, n, halves=h, length=6) for h in (False, True)]
    model = loops[0][1]
    weights = [weights_version(model, v) for v in range(len(swaps) + 1)]  # before loading any
    got: list[list[Fragment]] = [[], []]
    for (loop, _), out in zip(loops, got, strict=True):
        assert loop.double_buffered == (out is got[1])
        loop.policy.set_weights(weights[0])
        loop.reset(seed, 0)
        version = 0
        for step in range(30):
            if step in swaps:  # as the worker applies async weights, mid-fragment
                version += 1
                loop.set_weights(weights[version])
            fragment = loop.step()
            if fragment is not None:
                out.append(fragment)
        loop.envs.close()
    assert len(got[0]) == len(got[1]) == 5
    assert any(f.truncated.any() for f in got[0])  # final values were computed
    for a, b in zip(*got, strict=True):
        assert_same_fragment(a, b)


class _FixedArgsCartPole(BatchCartPole):
    """A BatchEnv whose constructor takes no ``batch_size`` (nor ``**kwargs``)."""

    def __init__(self, num_envs: int = 4) -> None:
        super().__init__(num_envs)


def test_double_buffering_skips_a_batch_env_whose_constructor_takes_no_batch_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from simkit.rollout._rows import make_env_rows

    monkeypatch.setattr(simkit.registry, "_REGISTRY", dict(simkit.registry._REGISTRY))
    simkit.register(
        "simkit-test/FixedArgsCartPole-v0",
        _FixedArgsCartPole,
        kind=simkit.EnvKind.BATCH,
        override=True,
    )
    envs = make_env_rows("simkit-test/FixedArgsCartPole-v0", 4, halves=True)
    try:
        assert envs.kind == "batch"
        assert not envs.can_split  # built whole: the session runs the plain loop
        with pytest.raises(ValueError, match=r"batch_size = num_envs / 2 .* batch_size 4"):
            envs.split()
    finally:
        envs.close()


def test_a_double_buffered_server_streams_the_plain_servers_fragments(serve: Servers) -> None:
    model = _model()  # BatchCartPole has CartPole's spaces
    weights = [weights_version(model, v) for v in range(3)]
    kw: dict[str, Any] = {"env_kwargs": {"max_episode_steps": 5}}
    plain = serve("simkit/BatchCartPole-v0", 4, **kw)
    double = serve("simkit/BatchCartPole-v0", 4, double_buffer=True, **kw)
    runs = []
    for srv in (plain, double):
        with PolicyStream(srv.endpoint, SPEC, num_envs=4, seed=9, timeout=20) as stream:
            assert stream.infos[0].double_buffered == (srv is double)
            out = []
            for w in weights:
                stream.push_weights(w)
                out.append(stream.next_batch())
            runs.append(out)
    for a, b in zip(*runs, strict=True):
        assert_same_fragment(a, b)
    # An odd number of slots cannot be halved, nor can a list of single envs: plain loop.
    with PolicyStream(double.endpoint, SPEC, num_envs=3, timeout=20) as stream:
        assert not stream.infos[0].double_buffered
    single = serve(CARTPOLE, 4, double_buffer=True)
    with PolicyStream(single.endpoint, SPEC, num_envs=4, timeout=20) as stream:
        assert not stream.infos[0].double_buffered


def test_a_bug_in_a_stream_session_is_the_internal_code_and_the_server_goes_on(
    serve: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    from simkit.rollout._loop import RolloutLoop

    srv = serve()
    real_step = RolloutLoop.step
    calls: list[int] = []

    def broken(self: RolloutLoop) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return real_step(self)

    monkeypatch.setattr(RolloutLoop, "step", broken)

    def push_and_take(stream: PolicyStream) -> None:  # the error answers whichever waits
        stream.push_weights(_model())
        stream.next_fragment()

    with PolicyStream(srv.endpoint, SPEC, num_envs=2, timeout=20) as stream:
        with pytest.raises(RemoteError, match="internal error in the stream session") as info:
            push_and_take(stream)
        assert info.value.remote_code == "internal"
    with PolicyStream(srv.endpoint, SPEC, num_envs=2, timeout=20) as stream:  # still serving
        stream.push_weights(_model())
        assert stream.next_fragment().num_rows == 2


@pytest.mark.parametrize(
    ("kwargs", "model", "message"),
    [
        ({"num_envs": 4096, "fragment_length": 2**20}, SPEC.to_plain(), "would hold"),
        ({"num_envs": 2}, {"name": "mlp", "kwargs": {"hidden_sizes": [6000, 6000]}}, "parameters"),
        ({"num_envs": 2}, {"name": "mlp", "kwargs": {"hidden_sizes": [64] * 65536}}, "layers"),
    ],
)
def test_sessions_beyond_the_servers_limits_are_refused_at_open(
    serve: Servers, kwargs: dict[str, Any], model: dict[str, Any], message: str
) -> None:
    """Refused before anything large is allocated: the process grows by little, and the
    server goes on serving."""
    import resource

    srv = serve()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(RemoteError, match=message) as info:
        PolicyStream(srv.endpoint, model, timeout=20, **kwargs)
    assert info.value.remote_code == "invalid_field"
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, f"the refused open grew the process by {grown_mb:.0f} MB"
    with PolicyStream(srv.endpoint, SPEC, num_envs=2, timeout=20) as stream:
        stream.push_weights(_model())
        assert stream.next_fragment().num_rows == 2


def test_weights_piling_up_in_a_sync_fragment_are_refused_not_queued(serve: Servers) -> None:
    from simkit.models import get_weights

    srv = serve(fragment_length=65536)  # a long fragment: the pushes arrive inside it
    model = _model()
    with PolicyStream(srv.endpoint, SPEC, num_envs=2, timeout=20) as stream:
        stream.push_weights(model)  # version 0 starts the fragment
        time.sleep(0.2)  # well inside its 65536 steps
        server = stream._servers[0]
        tensors = get_weights(model, 0).tensors
        for version in range(1, 6):
            stream._send(server, server.session.request_weights(version, tensors))
        with pytest.raises(RemoteError, match="too many weights wait") as info:
            stream._await(server, lambda s: False, "an error")
        assert info.value.remote_code == "session_state"


def test_stream_requests_without_a_session_get_session_state(serve: Servers) -> None:
    import zmq

    from simkit.protocol._codec import decode

    srv = serve()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(srv.endpoint)
    client = StreamClientSession(srv.endpoint)
    try:
        for request in (client.request_state(), client.request_credit(1)):
            sock.send_multipart(request)
            assert sock.poll(5000)
            reply = decode(sock.recv_multipart())
            assert reply.kind == "error"
            assert reply.body["code"] == "session_state"
            assert "needs a stream session" in reply.body["message"]
    finally:
        sock.close(0)
        ctx.term()


def test_learner_and_server_of_other_normal_noise_refuse_a_gaussian_session(
    serve: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older learner (its stream_open has no normal_noise) or an older server (its
    reply has none) would sample a Gaussian policy from other noise: the session is
    refused in one line naming both versions. A categorical policy's noise never changed:
    its session opens."""
    import dataclasses

    from simkit.protocol import StreamInfo

    pendulum = serve("simkit/Pendulum-v0", num_envs=2)
    cartpole = serve(CARTPOLE, num_envs=2)

    def without(cls: Any) -> Callable[[Any], dict[str, Any]]:
        def plain(self: Any) -> dict[str, Any]:
            fields = dataclasses.asdict(self) if cls is StreamConfig else dict(self.__dict__)
            fields.pop("normal_noise")
            return fields

        return plain

    assert StreamConfig.from_plain({"model": SPEC.to_plain()}).normal_noise == 1
    with monkeypatch.context() as m:
        m.setattr(StreamConfig, "to_plain", without(StreamConfig))  # an older learner
        with pytest.raises(RemoteError, match=r"learner samples Gaussian actions from normal "
                           r"noise version 1 and this server .* draws version 2") as old:  # fmt: skip
            PolicyStream(pendulum.endpoint, SPEC, num_envs=2, timeout=20)
        assert old.value.remote_code == "invalid_field"
        with PolicyStream(cartpole.endpoint, SPEC, num_envs=2, timeout=20) as stream:
            stream.push_weights(_model())
            assert stream.next_fragment().num_rows == 2
    with monkeypatch.context() as m:
        m.setattr(StreamInfo, "to_plain", without(StreamInfo))  # an older server
        with pytest.raises(RemoteError, match=rf"server {pendulum.endpoint} .* samples "
                           r"Gaussian actions from normal noise version 1 and this learner "
                           r"expects version 2"):  # fmt: skip
            PolicyStream(pendulum.endpoint, SPEC, num_envs=2, timeout=20)
        with PolicyStream(cartpole.endpoint, SPEC, num_envs=2, timeout=20) as stream:
            stream.push_weights(_model())
            assert stream.next_fragment().num_rows == 2
    with PolicyStream(pendulum.endpoint, SPEC, num_envs=2, timeout=20) as stream:  # same
        assert stream.num_rows == 2


def test_impossible_observation_statistics_are_invalid_weights_and_the_last_good_policy_stays(
    serve: Servers,
) -> None:
    """Finite statistics with a variance < 0 or a count <= 0 would make every action NaN:
    refused by name like any other weights that do not fit, and the session goes on."""
    srv = serve("simkit/Pendulum-v0", num_envs=2)
    model = _model("simkit/Pendulum-v0")
    with PolicyStream(srv.endpoint, SPEC, num_envs=2, timeout=20) as stream:
        good = weights_version(model, 1)
        stream.push_weights(good)
        for name, value, match in (
            ("obs_rms.var", -1.0, r"'obs_rms.var' holds 3 variance\(s\) < 0"),
            ("obs_rms.count", 0.0, r"'obs_rms.count' must count observations: expected > 0"),
        ):
            bad = {**good.tensors, name: np.full_like(good.tensors[name], value)}
            with pytest.raises(RemoteError, match=match) as info:
                stream.push_weights(PolicyWeights(2, bad))
            assert info.value.remote_code == "invalid_weights"
            assert "the session keeps version 1" in str(info.value)
        fragment = stream.next_fragment()
        assert fragment.policy_version.tolist() == [1] * 8
        assert np.isfinite(fragment.actions).all()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("env_id", ["simkit/Pendulum-v0", CARTPOLE])
def test_a_policy_whose_outputs_overflow_ends_its_session_by_name_and_answers_every_request(
    serve: Servers, env_id: str
) -> None:
    """Weights that pass every check can still overflow float32 (NaN actions for a
    Gaussian policy, NaN log-probs for a categorical one): the session ends with
    ``invalid_weights`` naming the version, and the requests queued for it when it ended
    are each answered (here pings, sent while it dies)."""
    from simkit.models import get_weights
    from simkit.protocol import decode

    srv = serve(env_id, num_envs=2)
    tensors = get_weights(_model(env_id), 0).tensors
    huge = {k: np.full_like(v, 3e38) if v.dtype == np.float32 else v for k, v in tensors.items()}
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(srv.endpoint)
    client = StreamClientSession(srv.endpoint)
    try:
        sock.send_multipart(client.request_open(StreamConfig(model=SPEC.to_plain(), num_envs=2)))
        assert sock.poll(20000)
        client.parse(sock.recv_multipart())
        sock.send_multipart(client.request_weights(0, huge))
        sock.send_multipart(client.request_credit(1))
        pings: set[int] = set()
        answered: set[int] = set()
        ended: list[dict[str, Any]] = []

        def read(timeout_ms: int) -> bool:
            if not sock.poll(timeout_ms):
                return False
            reply = decode(sock.recv_multipart())
            if reply.kind == "ping" or reply.body.get("request_kind") == "ping":
                answered.add(reply.id)
            elif reply.kind == "error":
                ended.append(reply.body)
            return True

        for _ in range(40):
            # A client reads as it sends: the server queues at most SEND_HWM replies
            # for a connection, fewer when its IO thread lags (docs/server.md): at most 3
            # pings are ever unanswered.
            while len(pings - answered) >= 3 and read(10000):
                pass
            request = client.request_ping()
            pings.add(decode(request).id)
            sock.send_multipart(request)
            time.sleep(0.002)
            while read(0):
                pass
        while not (pings <= answered and ended) and read(10000):
            pass
        assert pings <= answered, f"unanswered pings {sorted(pings - answered)}"
        assert [e["code"] for e in ended] == ["invalid_weights"], ended
        assert re.search(r"policy version 0 produced .*session ended", ended[0]["message"])
    finally:
        sock.close(0)
        ctx.term()
    assert _wait_for(lambda: srv.stream_sessions == 0, 5)
