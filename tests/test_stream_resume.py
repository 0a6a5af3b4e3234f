"""Stream session snapshots: ``stream_state`` at a fragment boundary, ``stream_restore``
into a fresh session on another server, and the continuation is bit-identical."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import zmq
from stream_helpers import assert_same_fragment, weights_version

from simkit._types import Fragment
from simkit.clients import PolicyStream
from simkit.models import ModelSpec, build_model, get_weights
from simkit.protocol import (
    SESSION_STATE_FORMAT,
    InvalidDtype,
    InvalidField,
    InvalidShape,
    Message,
    RemoteError,
    SessionSnapshot,
    SessionStateError,
    StreamClientSession,
    StreamConfig,
    StreamServerSession,
    decode,
    encode,
)
from simkit.protocol._stream_messages import parse_session_state, session_state_message
from simkit.rollout._rows import make_env_rows
from simkit.servers import RolloutServer

SPEC = ModelSpec("mlp", {"hidden_sizes": [16, 16]})


def _model(env_id: str) -> torch.nn.Module:
    rows = make_env_rows(env_id, 2)
    try:
        return build_model(SPEC, rows.observation_space, rows.action_space)
    finally:
        rows.close()


def _same(a: Fragment, b: Fragment) -> None:
    assert_same_fragment(a, b)
    assert a.sequence == b.sequence


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, list[str]]]:
    """Per env: two independent servers (snapshot on one, restore on the other) and two
    halves for a split layout."""
    made: list[RolloutServer] = []

    def start(env_id: str, n: int, **kw: Any) -> str:
        srv = RolloutServer(
            env_id, n, "tcp://127.0.0.1:0", policy=True, device="cpu", fragment_length=8, **kw
        ).start()
        made.append(srv)
        return srv.endpoint

    out = {
        "simkit/CartPole-v0": [start("simkit/CartPole-v0", 4) for _ in range(4)],
        "simkit/BatchCartPole-v0": [start("simkit/BatchCartPole-v0", 4) for _ in range(2)],
        "simkit/GoalNav-v0": [start("simkit/GoalNav-v0", 2) for _ in range(2)],
        "simkit/BatchCheetah-v0": [
            start("simkit/BatchCheetah-v0", 4, double_buffer=True) for _ in range(2)
        ],
    }
    yield out
    for srv in made:
        srv.stop()


def _stream(endpoints: list[str], env_id: str, num_envs: int) -> PolicyStream:
    return PolicyStream(
        endpoints,
        SPEC,
        num_envs=num_envs,
        seed=11,
        timeout=20,
        env_id=env_id,
    )


@pytest.mark.parametrize(
    "env_id",
    [
        "simkit/CartPole-v0",
        "simkit/BatchCartPole-v0",
        "simkit/GoalNav-v0",
        "simkit/BatchCheetah-v0",
    ],
)
def test_restored_session_continues_bit_identically(
    servers: dict[str, list[str]], env_id: str
) -> None:
    eps = servers[env_id]
    num_envs = 2 if env_id == "simkit/GoalNav-v0" else 4
    model = _model(env_id)
    with _stream([eps[0]], env_id, num_envs) as stream:
        reference = []
        for v in range(4):
            stream.push_weights(weights_version(model, v))
            reference.append(stream.next_batch())
    with _stream([eps[0]], env_id, num_envs) as stream:
        for v in range(2):
            stream.push_weights(weights_version(model, v))
            _same(stream.next_batch(), reference[v])
        [(config, snap)] = stream.session_states()
    assert config.env_offset == 0
    assert snap.sequence == 2
    assert (snap.episode_lengths > 0).any()  # envs mid-episode
    with _stream([eps[1]], env_id, num_envs) as stream:
        stream.restore_sessions([snap])
        for v in range(2, 4):
            stream.push_weights(weights_version(model, v))
            _same(stream.next_batch(), reference[v])


def test_two_servers_restore_their_own_slots(servers: dict[str, list[str]]) -> None:
    eps = servers["simkit/CartPole-v0"]
    model = _model("simkit/CartPole-v0")
    with _stream(eps[:2], "simkit/CartPole-v0", 4) as stream:
        reference = []
        for v in range(3):
            stream.push_weights(weights_version(model, v))
            reference.append(stream.next_batch())
    with _stream(eps[:2], "simkit/CartPole-v0", 4) as stream:
        stream.push_weights(weights_version(model, 0))
        stream.next_batch()
        states = stream.session_states()
    assert [c.env_offset for c, _ in states] == [0, 2]
    snaps = [s for _, s in states]
    with _stream(eps[2:], "simkit/CartPole-v0", 4) as stream:
        with pytest.raises(
            ValueError, match=r"runs env slots \[0, 2\), the snapshot holds \[2, 4\)"
        ):
            stream.restore_sessions(snaps[::-1])
        stream.restore_sessions(snaps)
        for v in (1, 2):
            stream.push_weights(weights_version(model, v))
            _same(stream.next_batch(), reference[v])


def test_bad_snapshots_are_refused_and_the_session_is_unchanged(
    servers: dict[str, list[str]],
) -> None:
    eps = servers["simkit/CartPole-v0"]
    model = _model("simkit/CartPole-v0")
    with _stream([eps[0]], "simkit/CartPole-v0", 4) as stream:
        stream.push_weights(weights_version(model, 0))
        reference = [stream.next_batch()]
        stream.push_weights(weights_version(model, 1))
        reference.append(stream.next_batch())
    with _stream([eps[0]], "simkit/CartPole-v0", 4) as stream:
        stream.push_weights(weights_version(model, 0))
        stream.next_batch()
        [(_, snap)] = stream.session_states()
    fields = snap.to_plain()
    bad_cases = [
        ({"obs": snap.obs[:, :3].copy()}, "invalid_state", r"obs must be float32 \(4, 4\)"),
        ({"fragment_length": 7}, "invalid_state", r"differs in \['fragment_length'\]"),
        ({"env_offset": 2}, "invalid_state", r"differs in \['env_offset'\]"),
        ({"envs": {**snap.envs, "num_envs": 3}}, "invalid_state", "snapshot rejected"),
    ]
    envs = snap.envs
    plain_rng = envs["envs"][0]["rng"]
    wide_rng = {
        **plain_rng,
        "state": {**plain_rng["state"], "state": {"__int__": "0x" + "f" * 200}},
    }
    refused_envs = [
        ({"root_seeds": [2**64 - 1, 1, 1, 1]}, r"root_seeds'\]\[0\] must be None or an int"),
        ({"episode_index": np.array([-7, 0, 0, 0])}, r"episode_index'\]\[0\] must be an int"),
        ({"pending_reset": np.array([True])}, r"pending_reset'\] must be a bool array of shape"),
        (
            {"envs": [{**envs["envs"][0], "params": {}}, *envs["envs"][1:]]},
            r"params'\] must hold a value for each declared parameter",
        ),
        (
            {"envs": [{**envs["envs"][0], "rng": wide_rng}, *envs["envs"][1:]]},
            "malformed rng state in snapshot: OverflowError",
        ),
    ]
    bad_cases += [
        ({"envs": {**envs, **change}}, "invalid_state", match) for change, match in refused_envs
    ]
    with _stream([eps[1]], "simkit/CartPole-v0", 4) as stream:
        for change, code, match in bad_cases:
            bad = SessionSnapshot.from_plain({**fields, **change})
            srv = stream._servers[0]
            stream._send(srv, srv.session.request_restore(bad))
            with pytest.raises(RemoteError, match=match) as info:
                stream._await(srv, lambda s: False, "an error")
            assert info.value.remote_code == code
        # Nothing of those changed the fresh session: it produces the fresh run's data.
        stream.push_weights(weights_version(model, 0))
        _same(stream.next_batch(), reference[0])


def test_state_is_refused_in_async_mode_and_mid_fragment() -> None:
    session = StreamServerSession()
    client = StreamClientSession()
    config = StreamConfig(model={"name": "mlp", "kwargs": {}}, mode="async")
    session.receive(client.request_open(config))
    with pytest.raises(SessionStateError, match="needs a sync-mode session") as info:
        session.receive(client.request_state())
    assert getattr(info.value, "code", None) == "session_state"


def test_mid_fragment_state_request_is_refused(servers: dict[str, list[str]]) -> None:
    eps = servers["simkit/CartPole-v0"]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(eps[3])
    client = StreamClientSession()
    try:
        config = StreamConfig(
            model=SPEC.to_plain(), num_envs=4, fragment_length=100_000, env_id="simkit/CartPole-v0"
        )
        sock.send_multipart(client.request_open(config))
        assert sock.poll(20_000)
        client.parse(sock.recv_multipart())
        weights = get_weights(_model("simkit/CartPole-v0"), 0)
        sock.send_multipart(client.request_weights(0, weights.tensors))
        sock.send_multipart(client.request_credit(1))
        assert sock.poll(20_000)
        assert client.parse(sock.recv_multipart()).kind == "weights"  # type: ignore[union-attr]
        for _ in range(200):
            # Until the worker takes its first step the session is still at the
            # boundary before sequence 0, where a state is the right answer.
            sock.send_multipart(client.request_state())
            assert sock.poll(20_000)
            try:
                snap = client.parse(sock.recv_multipart())
            except RemoteError as exc:
                refused = exc
                break
            assert isinstance(snap, SessionSnapshot)
            assert snap.sequence == 0
            time.sleep(0.01)
        else:
            pytest.fail("the server answered stream_state throughout a 100000-step fragment")
        assert "only allowed between two fragments" in str(refused)
        assert refused.remote_code == "session_state"
        sock.send_multipart(client.request_close())
    finally:
        sock.close()
        ctx.term()


def _snapshot(**change: Any) -> SessionSnapshot:
    fields: dict[str, Any] = {
        "format": SESSION_STATE_FORMAT,
        "env_id": "simkit/CartPole-v0",
        "num_envs": 2,
        "num_rows": 2,
        "env_offset": 0,
        "fragment_length": 16,
        "sequence": 3,
        "envs": {"format": "x", "nested": np.arange(3)},
        "obs": np.zeros((2, 4), np.float32),
        "agent_mask": np.ones(2, np.bool_),
        "episode_returns": np.array([1.5, 2.0]),
        "episode_lengths": np.array([3, 4], np.int64),
    }
    fields.update(change)
    return SessionSnapshot.from_plain(fields)


def test_session_snapshot_round_trips_through_the_codec() -> None:
    snap = _snapshot()
    for kind in ("stream_state", "stream_restore"):
        msg = decode(encode(session_state_message(snap, kind=kind, request_id=5)))
        assert msg.kind == kind
        back = parse_session_state(msg)
        assert back.header() == snap.header()
        np.testing.assert_array_equal(back.envs["nested"], snap.envs["nested"])
        for name in ("obs", "agent_mask", "episode_returns", "episode_lengths"):
            got, want = getattr(back, name), getattr(snap, name)
            assert got.dtype == want.dtype, name
            assert got.tobytes() == want.tobytes(), name


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"format": "other/1"}, InvalidField, "unknown session state format"),
        ({"episode_lengths": np.zeros(2, np.int32)}, InvalidDtype, "episode_lengths"),
        ({"obs": np.float32(0.0)}, InvalidField, "'obs' is missing"),
        ({"episode_returns": np.zeros(3)}, InvalidShape, "one entry per row"),
        ({"agent_mask": None}, InvalidField, "'agent_mask' is missing"),
        ({"sequence": -1}, InvalidField, "'sequence' is out of range"),
        ({"envs": [1]}, InvalidField, "'envs' has the wrong type"),
    ],
)
def test_malformed_snapshots_name_expected_and_got(
    change: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _snapshot(**change)


def test_state_and_restore_are_stream_request_kinds() -> None:
    session = StreamServerSession()
    client = StreamClientSession()
    with pytest.raises(SessionStateError, match="open the stream first"):
        session.receive(client.request_state())
    session = StreamServerSession()
    session.receive(client.request_open(StreamConfig(model={"name": "mlp", "kwargs": {}})))
    cmd = session.receive(client.request_restore(_snapshot()))
    assert type(cmd).__name__ == "RestoreCommand"
    session.restored(3)
    assert session.sequence == 3
    reply = client.parse(session.state_frames(9, _snapshot()))
    assert isinstance(reply, SessionSnapshot)
    assert reply.sequence == 3
    restore_reply = client.parse(session.reply("stream_restore", 4, {"sequence": 3}))
    assert isinstance(restore_reply, Message)
    assert restore_reply.kind == "stream_restore"


@pytest.mark.parametrize("env_id", ["simkit/CartPole-v0", "simkit/GoalNav-v0", "simkit/Cheetah-v0"])
def test_server_policy_lean_path_acts_as_torch(env_id: str) -> None:
    """The CPU sessions' numpy act path samples from the same keyed noise as
    ``model.act`` and agrees with it up to float32 rounding."""
    from simkit.rollout._policy import RowPolicy

    rows = make_env_rows(env_id, 4)
    try:
        model = build_model(SPEC, rows.observation_space, rows.action_space)
        model.update_obs_stats(np.random.default_rng(0).normal(1.0, 3.0, (64, *model.obs_shape)))
        weights = weights_version(model, 0)
        policies = [
            RowPolicy(
                build_model(SPEC, rows.observation_space, rows.action_space),
                torch.device("cpu"),
                seed=3,
                first_slot=0,
                num_slots=4,
                rows_per_slot=rows.agents_per_env,
                action_space=rows.action_space,
                lean=lean,
            )
            for lean in (True, False)
        ]
        assert policies[0].lean is not None
        assert policies[1].lean is None
        for p in policies:
            p.set_weights(weights)
        obs = np.random.default_rng(1).normal(size=(rows.num_rows, *model.obs_shape))
        obs = obs.astype(rows.observation_space.dtype)
        for step in range(3):
            fast, slow = (p.act(obs, step) for p in policies)
            assert fast.actions.dtype == slow.actions.dtype
            np.testing.assert_allclose(fast.actions, slow.actions, atol=1e-5)
            np.testing.assert_allclose(fast.log_probs, slow.log_probs, atol=1e-4)
            np.testing.assert_allclose(fast.values, slow.values, atol=1e-5)
        np.testing.assert_allclose(policies[0].value(obs), policies[1].value(obs), atol=1e-5)
        # New weights reach the lean path.
        policies[0].set_weights(weights_version(model, 1))
        policies[1].set_weights(weights_version(model, 1))
        np.testing.assert_allclose(policies[0].value(obs), policies[1].value(obs), atol=1e-5)
    finally:
        rows.close()
