"""Stream protocol without sockets: messages, the server's state machine, fragments."""

from __future__ import annotations

import numpy as np
import pytest

from simkit._types import Fragment
from simkit.protocol import (
    FRAGMENT_ARRAYS,
    InvalidDtype,
    InvalidField,
    InvalidShape,
    Message,
    RemoteError,
    SessionStateError,
    StaleVersion,
    StreamClientSession,
    StreamConfig,
    StreamServerSession,
    StreamState,
    decode,
    encode,
)
from simkit.protocol._stream_messages import fragment_message, parse_fragment
from simkit.protocol._stream_session import (
    CloseCommand,
    CreditCommand,
    OpenCommand,
    PingCommand,
    WeightsCommand,
)

MODEL = {"name": "mlp", "kwargs": {"hidden_sizes": [8]}}


def _fragment(t: int = 3, r: int = 2, *, sequence: int = 0, state: bool = False) -> Fragment:
    rng = np.random.default_rng(0)
    return Fragment(
        obs=rng.standard_normal((t, r, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (t, r)),
        log_probs=rng.standard_normal((t, r)).astype(np.float32),
        values=rng.standard_normal((t, r)).astype(np.float32),
        rewards=rng.standard_normal((t, r)),
        terminated=rng.random((t, r)) < 0.2,
        truncated=rng.random((t, r)) < 0.2,
        final_values=rng.standard_normal((t, r)).astype(np.float32),
        agent_mask=np.ones((t, r), dtype=np.bool_),
        policy_version=np.full(t, 4, dtype=np.int64),
        last_obs=rng.standard_normal((r, 4)).astype(np.float32),
        last_values=rng.standard_normal(r).astype(np.float32),
        env_ids=np.arange(r, dtype=np.int64),
        episode_returns=np.array([1.5]),
        episode_lengths=np.array([7], dtype=np.int64),
        episode_rows=np.array([1], dtype=np.int64),
        source="srv",
        sequence=sequence,
        start_state={"envs": [np.arange(3.0)], "seed": 2**40} if state else None,
    )


def _open(session: StreamServerSession, **body: object) -> OpenCommand:
    client = StreamClientSession()
    cmd = session.receive(client.request_open(StreamConfig(model=MODEL, **body)))  # type: ignore[arg-type]
    assert isinstance(cmd, OpenCommand)
    return cmd


def test_config_round_trips_and_bad_fields_name_what_was_expected() -> None:
    config = StreamConfig(model=MODEL, num_envs=4, seed=7, env_offset=4, mode="async")
    assert StreamConfig.from_plain(config.to_plain()) == config
    with pytest.raises(InvalidField, match="unknown stream mode") as info:
        StreamConfig.from_plain({**config.to_plain(), "mode": "lockstep"})
    assert info.value.expected == "sync or async"
    assert info.value.got == "lockstep"
    with pytest.raises(InvalidField, match="needs a str 'name'"):
        StreamConfig.from_plain({**config.to_plain(), "model": {"kwargs": {}}})
    with pytest.raises(InvalidField, match="'env_kwargs' needs 'env_id'"):
        StreamConfig.from_plain({**config.to_plain(), "env_kwargs": {"x": 1}})
    with pytest.raises(InvalidField, match="out of range"):
        StreamConfig.from_plain({**config.to_plain(), "seed": -1})


def test_state_machine_gates_on_weights_credit_and_sync_versions() -> None:
    server = StreamServerSession()
    client = StreamClientSession()
    assert isinstance(server.receive(client.request_ping()), PingCommand)  # allowed before open
    with pytest.raises(SessionStateError, match="open the stream first"):
        server.receive(client.request_credit(1))
    cmd = _open(server, num_envs=2)
    assert cmd.config.num_envs == 2
    assert server.state is StreamState.OPEN
    assert server.waiting_for() == "weights"
    with pytest.raises(SessionStateError, match="already open"):
        _open(server)

    weights = server.receive(client.request_weights(3, {"w": np.ones(2, np.float32)}))
    assert isinstance(weights, WeightsCommand)
    assert weights.version == 3
    assert server.waiting_for() == "weights"  # received, not applied yet
    server.weights_applied(3)
    assert server.state is StreamState.RUNNING
    assert server.waiting_for() == "credit"
    grant = server.receive(client.request_credit(2))
    assert isinstance(grant, CreditCommand)
    assert server.credit == 2
    assert server.may_produce()

    server.fragment_frames(_fragment(sequence=0))
    assert server.credit == 1
    assert server.sequence == 1
    assert server.waiting_for() == "weights"  # sync: version 3 produced its fragment

    with pytest.raises(StaleVersion, match="must increase") as stale:
        server.receive(client.request_weights(3, {}))
    assert stale.value.expected == "version > 3"
    assert stale.value.got == "3"
    assert server.version == 3
    server.weights_applied(4)
    assert server.may_produce()
    with pytest.raises(ValueError, match="sequence 5, expected 1"):
        server.fragment_frames(_fragment(sequence=5))

    assert isinstance(server.receive(client.request_close()), CloseCommand)
    assert server.waiting_for() == "closed"
    with pytest.raises(SessionStateError, match="closed"):
        server.receive(client.request_credit(1))


def test_async_mode_needs_only_credit() -> None:
    server = StreamServerSession()
    client = StreamClientSession()
    _open(server, mode="async")
    server.weights_applied(0)
    server.receive(client.request_credit(3))
    for k in range(3):
        assert server.may_produce()
        server.fragment_frames(_fragment(sequence=k))
    assert server.waiting_for() == "credit"


def test_bad_credit_and_unknown_kinds_are_refused() -> None:
    server = StreamServerSession()
    _open(server)
    bad = encode(Message(kind="credit", id=9, body={"grant": 0}))
    with pytest.raises(InvalidField, match="out of range") as info:
        server.receive(bad)
    assert info.value.request_id == 9  # type: ignore[attr-defined]
    reply = StreamClientSession()
    with pytest.raises(RemoteError, match="out of range") as remote:
        reply.parse(server.error(info.value))
    assert remote.value.remote_code == "invalid_field"
    assert remote.value.expected == "[1, 1048576]"
    with pytest.raises(Exception, match="unknown stream request kind 'step'"):
        server.receive(encode(Message(kind="step", id=1)))


def test_fragment_round_trips_through_frames_zero_copy() -> None:
    server = StreamServerSession(inline_threshold=16)
    client = StreamClientSession("tcp://example:1")
    _open(server)
    server.weights_applied(4)
    server.receive(client.request_credit(1))
    sent = _fragment(state=True)
    frames = server.fragment_frames(sent)
    assert len(frames) > 1  # arrays above the threshold travel as their own frames
    got = client.parse(frames)
    assert isinstance(got, Fragment)
    assert got.source == "tcp://example:1"
    assert got.sequence == 0
    for name in ("obs", "actions", "rewards", "terminated", "final_values", "episode_rows"):
        want, have = getattr(sent, name), getattr(got, name)
        assert have.dtype == want.dtype
        assert have.tobytes() == want.tobytes()
    assert got.start_state is not None
    assert got.start_state["seed"] == 2**40
    assert np.array_equal(got.start_state["envs"][0], np.arange(3.0))


def test_parse_fragment_refuses_inconsistent_shapes() -> None:
    good = _fragment()
    arrays = {name: getattr(good, name) for name in ("obs", "actions", "log_probs", "values")}
    msg = Message(kind="fragment", id=0, body={"sequence": 0}, arrays=arrays)
    with pytest.raises(InvalidField, match="misses arrays"):
        parse_fragment(msg)
    full = {name: getattr(good, name) for name in FRAGMENT_ARRAYS}
    full["last_values"] = np.zeros(5, np.float32)
    with pytest.raises(InvalidShape, match="'last_values' has the wrong leading shape"):
        parse_fragment(Message(kind="fragment", id=0, body={"sequence": 0}, arrays=full))


def test_a_remote_error_names_what_was_expected_and_what_came() -> None:
    """A learner prints ``str`` of a refusal: it held only the server's sentence
    ("too many env slots for one session"), the limit and the value asked for were
    attributes nobody printed. They are in the message now, once."""
    err = RemoteError("invalid_field", "too many env slots", expected="<= 4096", got=5000)
    assert str(err) == "[invalid_field] too many env slots (expected <= 4096, got 5000)"
    named = RemoteError(
        err.remote_code, f"server x: {err.message.split('] ', 1)[-1]}", expected="<= 4096", got=5000
    )
    assert str(named) == "[invalid_field] server x: too many env slots (expected <= 4096, got 5000)"
    said = RemoteError("env_not_allowed", "builds only a or b, not c", expected="a or b", got="c")
    assert str(said) == "[env_not_allowed] builds only a or b, not c"
    assert str(RemoteError("busy", "server busy")) == "[busy] server busy"


def test_a_local_protocol_error_names_what_was_expected_and_what_came() -> None:
    """The same for an error raised on this side (an action the space's dtype cannot
    take said only "actions cannot be cast to the space dtype"); an error reply still
    carries the sentence alone, with ``expected`` and ``got`` in their own fields."""
    from simkit.protocol import InvalidDtype

    err = InvalidDtype("actions cannot be cast to the space dtype", expected="int64", got="<U3")
    assert str(err) == "actions cannot be cast to the space dtype (expected int64, got <U3)"
    assert err.message == "actions cannot be cast to the space dtype"


def _opened_client(env_offset: int, num_envs: int = 2, steps: int = 3) -> StreamClientSession:
    """A learner's session that asked for slots ``env_offset ..`` and was answered with
    a CartPole-like session of ``num_envs`` slots and ``steps``-step fragments."""
    from gymnasium import spaces

    from simkit.protocol import StreamInfo, space_to_plain

    client = StreamClientSession("tcp://example:1")
    client.request_open(StreamConfig(model=MODEL, num_envs=num_envs, env_offset=env_offset))
    info = StreamInfo(
        session="s",
        env_id="simkit/CartPole-v0",
        env_kind="single",
        agents=None,
        observation_space=space_to_plain(spaces.Box(-np.inf, np.inf, (4,), np.float32)),
        action_space=space_to_plain(spaces.Discrete(2)),
        num_envs=num_envs,
        num_rows=num_envs,
        fragment_length=steps,
        mode="sync",
        device="cpu",
        heartbeat_timeout=None,
        server="simkit",
    )
    assert client.parse(encode(Message(kind="stream_open", id=1, body=info.to_plain())))
    return client


def _sent(fragment: Fragment) -> list[object]:
    server = StreamServerSession()
    _open(server)
    server.weights_applied(4)
    server.receive(StreamClientSession().request_credit(1))
    return server.fragment_frames(fragment)


def test_a_fragment_that_does_not_fit_the_session_is_refused() -> None:
    """A learner took any fragment whose arrays agreed among themselves: env ids of
    2**40 (which size the learner's per-row statistics), other steps or rows than the
    session's, observations of another dtype or shape all reached it."""
    good = _fragment()
    good_here = Fragment(**{**good.__dict__, "env_ids": np.array([4, 5], np.int64)})
    assert isinstance(_opened_client(4).parse(_sent(good_here)), Fragment)
    cases: list[tuple[Fragment, type[Exception], str]] = [
        (
            Fragment(**{**good.__dict__, "env_ids": np.array([4, 2**40], np.int64)}),
            InvalidField,
            "env_ids are not the session's env slots",
        ),
        (good, InvalidField, "env_ids are not the session's env slots"),  # slots 0, 1
        (
            Fragment(**{**_fragment(t=5).__dict__, "env_ids": np.array([4, 5], np.int64)}),
            InvalidShape,
            "steps and rows differ",
        ),
        (
            Fragment(**{**good_here.__dict__, "obs": good.obs.astype(np.float64)}),
            InvalidDtype,
            "'obs'",
        ),
        (
            Fragment(**{**good_here.__dict__, "last_obs": np.zeros((2, 5), np.float32)}),
            InvalidShape,
            "'last_obs' per row",
        ),
        (
            Fragment(**{**good_here.__dict__, "actions": good.actions[..., None]}),
            InvalidShape,
            "'actions' per row",
        ),
    ]
    for fragment, error, match in cases:
        with pytest.raises(error, match=match):
            _opened_client(4).parse(_sent(fragment))


def test_a_fragment_whose_episode_returns_are_a_scalar_is_invalid_shape() -> None:
    """``episode_returns.shape[0]`` of a 0-d array raised IndexError out of the parser."""
    arrays = dict(fragment_message(_fragment()).arrays)
    arrays["episode_returns"] = np.array(1.5)
    msg = decode(encode(Message(kind="fragment", id=0, body={"sequence": 0}, arrays=arrays)))
    with pytest.raises(InvalidShape, match="episode_returns"):
        parse_fragment(msg)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"num_envs": 2**40, "num_rows": 2**40}, "another session than asked"),
        ({"fragment_length": 2**40}, "another session than asked"),
        ({"num_rows": 3}, "num_rows"),
        ({"max_credit": 0}, "max_credit"),
        ({"heartbeat_timeout": -1.0}, "heartbeat_timeout"),
        ({"heartbeat_timeout": float("inf")}, "heartbeat_timeout"),
    ],
)
def test_a_stream_open_reply_of_another_session_than_asked_is_refused(
    changes: dict[str, object], match: str
) -> None:
    """A server's reply sized the learner's run (its rows count the steps of an update)
    and its keepalive (a negative timeout pinged without pause): a reply of other slots
    or fragment length than asked, rows that are not slots times agents, no credit or a
    timeout that is not a positive finite number is refused."""
    client = _opened_client(4)
    assert client.info is not None
    client.request_open(StreamConfig(model=MODEL, num_envs=2, fragment_length=3, env_offset=4))
    body = {**client.info.to_plain(), **changes}
    with pytest.raises(InvalidField, match=match):
        client.parse(encode(Message(kind="stream_open", id=1, body=body)))


def test_a_handshake_timeout_that_is_not_finite_is_refused() -> None:
    """``threading.Event.wait`` of an infinite keepalive interval raised OverflowError in
    the client's keepalive thread."""
    from gymnasium import spaces

    from simkit.protocol import ServerInfo

    info = ServerInfo(
        env_id="e",
        num_envs=1,
        observation_space=spaces.Discrete(2),
        action_space=spaces.Discrete(2),
        capabilities=frozenset(),
        heartbeat_timeout=60.0,
    )
    assert ServerInfo.from_plain(info.to_plain()).heartbeat_timeout == 60.0
    with pytest.raises(InvalidField, match="heartbeat_timeout"):
        ServerInfo.from_plain({**info.to_plain(), "heartbeat_timeout": float("inf")})
