"""The wire protocol without sockets: codec, validation, sessions, bit-exact results."""

from __future__ import annotations

import re
from typing import Any

import msgpack
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import simkit
from simkit._seeding import episode_seed
from simkit.protocol import (
    DTYPES,
    PROTOCOL_VERSION,
    ClientSession,
    InvalidDtype,
    InvalidField,
    InvalidShape,
    Limits,
    MalformedMessage,
    Message,
    MessageTooLarge,
    RemoteError,
    ServerInfo,
    ServerSession,
    SessionState,
    VersionMismatch,
    decode,
    encode,
    info_columns,
    infos_from_wire,
    infos_to_wire,
    keepalive_target,
    plain_safe,
    step_infos_to_wire,
)
from simkit.servers._host import EnvListHost, make_env_factory


class Flaky(simkit.Env[np.ndarray, np.ndarray]):
    """A 1-D env with Box actions that raises when the action exceeds 0.9."""

    max_episode_steps = 4
    state_attributes = ("x",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Box(-10, 10, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Box(-1, 1, shape=(1,), dtype=np.float32)
        self.x = 0.0

    def reset_episode(
        self, rng: np.random.Generator, params: Any, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.x = float(rng.uniform(-1, 1))
        return np.array([self.x, 0.0], dtype=np.float32), {"note": object()}

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        if action[0] > 0.9:
            raise RuntimeError("boom")
        self.x += float(action[0])
        return np.array([self.x, 1.0], dtype=np.float32), self.x, False, {"x": np.float64(self.x)}


def _session(envs: list[Any]) -> tuple[ServerSession, ClientSession]:
    host = EnvListHost(envs)
    info = ServerInfo(
        "test", host.num_envs, host.observation_space, host.action_space, host.capabilities
    )
    return ServerSession(host, info), ClientSession()


def _ready(envs: list[Any]) -> tuple[ServerSession, ClientSession]:
    server, client = _session(envs)
    client.parse_hello(server.handle(client.request_hello()))
    return server, client


def _raw(header: Any, *extra: bytes) -> list[Any]:
    return [msgpack.packb(header, use_bin_type=True), *extra]


def _header(kind: str = "ping", **kw: Any) -> dict[str, Any]:
    return {"v": list(PROTOCOL_VERSION), "id": 5, "kind": kind, "body": {}, "arrays": [], **kw}


# ----------------------------------------------------------------------------- codec


@given(
    hnp.arrays(
        st.sampled_from([np.dtype(d) for d in DTYPES]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    ),
    st.sampled_from([0, 64, 10**6]),
)
def test_arrays_round_trip_bit_exact(arr: np.ndarray, threshold: int) -> None:
    frames = encode(Message("step", 3, {"k": [1, "a"]}, {"a": arr}), inline_threshold=threshold)
    assert len(frames) == (1 if arr.nbytes <= threshold else 2)
    msg = decode([bytes(f) for f in frames])
    out = msg.arrays["a"]
    assert (msg.kind, msg.id, msg.body) == ("step", 3, {"k": [1, "a"]})
    assert out.dtype == arr.dtype
    assert out.shape == arr.shape
    assert out.tobytes() == arr.tobytes()


def test_big_arrays_travel_as_zero_copy_frames() -> None:
    arr = np.arange(10_000, dtype=np.float64)
    frames = encode(Message("x", arrays={"a": arr}))
    assert isinstance(frames[1], memoryview)
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.float64), arr)
    out = decode(frames).arrays["a"]
    assert np.shares_memory(out, arr)  # decoded as a view of the frame


def test_big_endian_input_goes_out_little_endian() -> None:
    arr = np.arange(4, dtype=">i4")
    out = decode(encode(Message("x", arrays={"a": arr}))).arrays["a"]
    assert out.dtype == np.dtype("int32")
    assert out.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("name", DTYPES)
def test_decoded_arrays_have_the_native_dtype_so_asarray_keeps_them(name: str) -> None:
    # Every step reply's env_ids go through np.asarray(..., dtype=np.int64) on the
    # client: a decoded array must come back as itself, not as a fresh view.
    out = decode(encode(Message("x", arrays={"a": np.zeros(3, dtype=name)}))).arrays["a"]
    assert out.dtype == np.dtype(name)
    assert np.asarray(out, dtype=np.dtype(name)) is out


def test_object_arrays_cannot_be_sent() -> None:
    with pytest.raises(InvalidDtype, match="off the whitelist"):
        encode(Message("x", arrays={"a": np.array([object()])}))


@pytest.mark.parametrize(
    ("frames", "error", "match"),
    [
        ([], MalformedMessage, "empty message"),
        ([b"\xc1garbage"], MalformedMessage, "not valid msgpack"),
        ([msgpack.packb([1, 2])], MalformedMessage, "must be a msgpack map"),
        ([msgpack.packb(msgpack.ExtType(1, b"x"))], MalformedMessage, "ext types"),
        (_raw(_header(v=[PROTOCOL_VERSION[0] + 1, 0])), VersionMismatch, "major version"),
        (_raw(_header(v="1.0")), MalformedMessage, r"\[major, minor\]"),
        (_raw(_header(id=-1)), MalformedMessage, "'id'"),
        (_raw(_header(kind=3)), MalformedMessage, "'kind'"),
        (_raw(_header(body=[])), MalformedMessage, "'body' must be a map"),
        (
            _raw(_header(arrays=[{"name": "a", "dtype": "object", "shape": [1], "data": b"x"}])),
            InvalidDtype,
            "not allowed",
        ),
        (
            _raw(_header(arrays=[{"name": "a", "dtype": "int8", "shape": [3], "data": b"xx"}])),
            InvalidShape,
            "does not match",
        ),
        (
            _raw(_header(arrays=[{"name": "a", "dtype": "int8", "shape": [-1], "data": b""}])),
            InvalidShape,
            "non-negative",
        ),
        (
            _raw(_header(arrays=[{"name": "a", "dtype": "int8", "shape": [1], "frame": 1}])),
            MalformedMessage,
            "missing frame",
        ),
        (_raw(_header(), b"stray"), MalformedMessage, "exactly one array"),
        (
            _raw(_header(arrays=[{"name": "a", "dtype": "int8", "shape": [1], "data": b"x"}] * 2)),
            MalformedMessage,
            "unique",
        ),
    ],
)
def test_decode_refuses_bad_frames(frames: list[Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        decode(frames)


def test_limits_are_enforced_before_unpacking() -> None:
    frames = encode(Message("x", arrays={"a": np.zeros(1000)}), inline_threshold=0)
    with pytest.raises(MessageTooLarge, match="message too large"):
        decode(frames, limits=Limits(max_message_bytes=1000))
    with pytest.raises(MessageTooLarge, match="too many frames"):
        decode([frames[0]] * 3, limits=Limits(max_frames=2))
    with pytest.raises(MalformedMessage, match="not valid msgpack"):
        decode([msgpack.packb(_header(body={"s": "x" * 100}))], limits=Limits(max_str_len=50))


def test_plain_safe_keeps_data_and_stringifies_the_rest() -> None:
    out = plain_safe(
        {"a": np.float32(1.5), 2: (1, None), "o": object(), "big": 2**70, "arr": np.ones(2)}
    )
    assert out["a"] == 1.5
    assert out["2"] == [1, None]
    assert out["big"] == str(2**70)
    assert out["o"].startswith("<object object")
    assert out["arr"]["__ndarray__"] is True
    msgpack.packb(out)


# --------------------------------------------------------------------------- session


def test_handshake_round_trips_the_heartbeat_and_keepalives_are_recognised() -> None:
    server, client = _session([simkit.make("simkit/CartPole-v0")])
    info = ServerInfo(**{**server.info.__dict__, "heartbeat_timeout": 2.5, "session": "ab"})
    assert ServerInfo.from_plain(info.to_plain()) == info
    assert ServerInfo.from_plain(server.info.to_plain()).heartbeat_timeout is None
    plain = {k: v for k, v in info.to_plain().items() if k != "heartbeat_timeout"}
    assert ServerInfo.from_plain(plain).heartbeat_timeout is None  # a 1.1 server
    with pytest.raises(InvalidField, match="'heartbeat_timeout' must be > 0"):
        ServerInfo.from_plain({**info.to_plain(), "heartbeat_timeout": 0})
    keepalive = keepalive_target(client.request_keepalive("ab"))
    assert keepalive is not None
    assert keepalive.body == {"session": "ab"}
    assert keepalive_target(client.request_ping()) is None
    assert keepalive_target(client.request_hello()) is None
    assert keepalive_target([b"\xc1garbage"]) is None
    # A session answers a keepalive like a ping (servers intercept them before sessions).
    client.parse_ping(server.handle(client.request_keepalive("ab")))


def test_all_empty_infos_travel_as_an_empty_list() -> None:
    assert infos_to_wire([{}, {}, {}]) == []
    assert infos_to_wire([{}, {"x": np.float64(1.5)}]) == [{}, {"x": 1.5}]
    assert infos_from_wire({"infos": []}, 3) == [{}, {}, {}]
    assert infos_from_wire({"infos": [{}, {"x": 1.5}]}, 2) == [{}, {"x": 1.5}]
    with pytest.raises(InvalidField, match="'infos' needs one map per row, or none"):
        infos_from_wire({"infos": [{}]}, 2)
    with pytest.raises(InvalidField, match="one map per row"):
        infos_from_wire({"infos": [{}, 3]}, 2)
    server, client = _ready([simkit.make("simkit/CartPole-v0") for _ in range(2)])
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    reply = server.handle(client.request_step(np.array([0, 1])))
    assert decode(reply).body["infos"] == []  # CartPole steps have empty infos
    step, _ = client.parse_step(reply)
    assert step.infos == [{}, {}]


def test_uniform_scalar_infos_travel_as_columns_and_come_back_as_rows() -> None:
    infos = [
        {"x": np.float32(0.5), "n": 3, "ok": True, "r": -0.0},
        {"x": np.float32(1.25), "n": -(2**62), "ok": False, "r": float("nan")},
    ]
    body, arrays = step_infos_to_wire(infos, (1, 3))
    assert body == {"infos": [], "info_keys": ["x", "n", "ok", "r"]}
    assert {k: a.dtype.name for k, a in arrays.items()} == {
        "info/x": "float64",
        "info/n": "int64",
        "info/ok": "bool",
        "info/r": "float64",
    }
    back = infos_from_wire(body, 2, arrays)
    assert [list(map(type, row.values())) for row in back] == [[float, int, bool, float]] * 2
    assert back[0] == {"x": 0.5, "n": 3, "ok": True, "r": 0.0}
    assert back[1]["n"] == -(2**62)
    assert np.isnan(back[1]["r"])
    # A 1.2 client reads only maps; so does anything that is not one scalar type per key.
    assert step_infos_to_wire(infos, (1, 2))[1] == {}
    assert info_columns([{"a": 1}, {"b": 1}]) is None  # different keys
    assert info_columns([{"a": 1}, {"a": 1.0}]) is None  # int and float in one column
    assert info_columns([{"a": {"b": 1}}]) is None  # nested
    assert info_columns([{"a": 2**64}]) is None  # beyond int64
    assert info_columns([{"a": np.uint64(1)}]) is None  # may not fit int64
    assert info_columns([{}, {}]) is None


@pytest.mark.parametrize(
    ("body", "arrays", "match"),
    [
        ({"infos": [], "info_keys": "x"}, {}, "'info_keys' must be a non-empty list of str"),
        ({"infos": [{}, {}], "info_keys": ["x"]}, {}, "with 'infos' empty"),
        ({"infos": [], "info_keys": ["x"]}, {}, "info column 'x' needs one"),
        ({"infos": [], "info_keys": ["x"]}, {"info/x": np.zeros(3)}, "row per env id"),
        ({"infos": [], "info_keys": ["x"]}, {"info/x": np.zeros(2, np.complex64)}, "float64 row"),
    ],
)
def test_malformed_info_columns_are_refused(
    body: dict[str, Any], arrays: dict[str, np.ndarray], match: str
) -> None:
    with pytest.raises(InvalidField, match=match):
        infos_from_wire(body, 2, arrays)


def test_step_infos_are_columns_for_13_clients_and_maps_for_12_clients() -> None:
    for version, columns in (((1, 3), True), ((1, 2), False)):
        server, client = _session([Flaky(), Flaky()])
        hello = decode(client.request_hello())
        hello.v = version
        client.parse_hello(server.handle(encode(hello)))
        client.parse_reset(server.handle(client.request_reset(seed=0)))
        reply = server.handle(client.request_step(np.full((2, 1), 0.25, np.float32)))
        wire = decode(reply)
        assert ("info_keys" in wire.body) is columns
        assert ("info/x" in wire.arrays) is columns
        step, _ = client.parse_step(reply)
        assert [set(i) for i in step.infos] == [{"x"}, {"x"}]
        assert all(type(i["x"]) is float for i in step.infos)


def test_hello_is_required_then_close_ends_the_session() -> None:
    server, client = _session([Flaky()])
    with pytest.raises(RemoteError, match=r"\[session_state\] send hello first"):
        client.parse_reset(server.handle(client.request_reset(seed=0)))
    client.parse_ping(server.handle(client.request_ping()))
    info = client.parse_hello(server.handle(client.request_hello()))
    assert server.state is SessionState.READY
    assert info.num_envs == 1
    assert info.capabilities == {"state", "params"}
    assert info.observation_space == Flaky().observation_space
    client.parse_close(server.handle(client.request_close()))
    assert server.state is SessionState.CLOSED
    with pytest.raises(RemoteError, match="session is closed"):
        client.parse_ping(server.handle(client.request_ping()))


def test_every_bad_request_gets_an_error_reply() -> None:
    server, _ = _ready([Flaky(), Flaky()])
    cases = [
        (_raw(_header("fly")), "unknown_kind"),
        ([b"\x00\x01"], "malformed"),
        (_raw(_header(v=[9, 0])), "version_mismatch"),
        (_raw(_header("step")), "invalid_field"),
        (_raw(_header("reset", body={"seed": -1})), "invalid_field"),
        (_raw(_header("reset", body={"seed": 1, "seeds": [1, 2]})), "invalid_field"),
        (_raw(_header("reset", body={"seeds": [1]})), "invalid_field"),
        (_raw(_header("reset", body={"options": 3})), "invalid_field"),
    ]
    for frames, code in cases:
        reply = decode(server.handle(frames))
        assert reply.kind == "error", frames
        assert reply.body["code"] == code, (frames, reply.body)
        assert reply.body["message"]


def test_error_reply_echoes_the_request_id_and_names_expected_and_got() -> None:
    server, _ = _ready([Flaky(), Flaky()])
    ids = {"name": "env_ids", "dtype": "int64", "shape": [2], "data": np.array([0, 7]).tobytes()}
    reply = decode(server.handle(_raw(_header("reset", id=42, arrays=[ids]))))
    assert reply.id == 42
    assert reply.body["code"] == "invalid_env_ids"
    assert reply.body["expected"] == "ids in [0, 2)"
    assert reply.body["got"] == "[0, 7]"
    assert reply.body["request_kind"] == "reset"


@pytest.mark.parametrize(
    ("actions", "env_ids", "code", "match"),
    [
        (np.array([[np.nan], [0.0]], dtype=np.float32), None, "not_finite", "must be finite"),
        (np.array([[0.0], [0.0]], dtype=np.int32), None, "invalid_dtype", "wrong dtype"),
        (np.zeros((3, 1), dtype=np.float32), None, "invalid_shape", "wrong shape"),
        (np.zeros((2, 1), dtype=np.float32), [1, 1], "invalid_env_ids", "unique"),
        (np.zeros((1, 1), dtype=np.float32), [-1], "invalid_env_ids", "out of range"),
    ],
)
def test_bad_actions_are_refused_before_any_env_moves(
    actions: np.ndarray, env_ids: Any, code: str, match: str
) -> None:
    server, client = _ready([Flaky(), Flaky()])
    client.parse_reset(server.handle(client.request_reset(seed=1)))
    before = client.parse_get_state(server.handle(client.request_get_state()))
    arrays: dict[str, np.ndarray] = {"actions": actions}
    if env_ids is not None:
        arrays["env_ids"] = np.asarray(env_ids, dtype=np.int64)
    reply = decode(server.handle(encode(Message("step", 9, {}, arrays))))
    assert reply.kind == "error"
    assert reply.body["code"] == code
    assert match in reply.body["message"]
    after = client.parse_get_state(server.handle(client.request_get_state()))
    assert simkit.snapshot.states_equal(before, after)


def test_discrete_actions_out_of_range_are_invalid_actions() -> None:
    server, client = _ready([simkit.make("simkit/CartPole-v0")])
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    with pytest.raises(RemoteError, match=r"\[invalid_action\]") as info:
        client.parse_step(server.handle(client.request_step(np.array([2]))))
    assert info.value.expected == "[0, 2)"


def test_remote_equals_local_bit_for_bit_with_same_step_autoreset() -> None:
    n, root = 3, 11
    server, client = _ready([simkit.make("simkit/CartPole-v0") for _ in range(n)])
    reset = client.parse_reset(server.handle(client.request_reset(seed=root)))
    local = [simkit.make("simkit/CartPole-v0") for _ in range(n)]
    episode = [0] * n
    obs = np.stack([e.reset(seed=episode_seed(root, i, 0))[0] for i, e in enumerate(local)])
    assert reset.obs.tobytes() == obs.tobytes()
    assert reset.infos[0]["params"] == local[0].params
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(60):
        actions = rng.integers(0, 2, size=n)
        step, faults = client.parse_step(server.handle(client.request_step(actions)))
        assert faults == []
        for i, env in enumerate(local):
            o, r, term, trunc, _ = env.step(int(actions[i]))
            assert step.final_obs[i].tobytes() == o.tobytes()
            assert (step.reward[i], step.terminated[i], step.truncated[i]) == (r, term, trunc)
            if term or trunc:
                ends += 1
                episode[i] += 1
                o, info = env.reset(seed=episode_seed(root, i, episode[i]))
                assert step.infos[i]["reset_info"]["params"] == info["params"]
            assert step.obs[i].tobytes() == o.tobytes()
    assert ends > 0


def test_subset_steps_and_state_round_trip() -> None:
    server, client = _ready([simkit.make("simkit/CartPole-v0") for _ in range(3)])
    client.parse_reset(server.handle(client.request_reset(seed=3)))
    step, _ = client.parse_step(
        server.handle(client.request_step(np.array([1, 0]), env_ids=[2, 0]))
    )
    assert step.env_ids.tolist() == [2, 0]
    assert step.obs.shape == (2, 4)
    saved = client.parse_get_state(server.handle(client.request_get_state([1])))
    first, _ = client.parse_step(server.handle(client.request_step(np.array([1]), env_ids=[1])))
    client.parse_set_state(server.handle(client.request_set_state(saved, [1])))
    again, _ = client.parse_step(server.handle(client.request_step(np.array([1]), env_ids=[1])))
    assert first.obs.tobytes() == again.obs.tobytes()
    with pytest.raises(RemoteError, match=r"\[invalid_state\]"):
        client.parse_set_state(server.handle(client.request_set_state([{"x": 1}], [1])))


def test_per_env_seeds_and_params() -> None:
    server, client = _ready([simkit.make("simkit/CartPole-v0") for _ in range(2)])
    reset = client.parse_reset(
        server.handle(client.request_reset(seeds=[5, 6], params=[{"gravity": 9.5}, {}]))
    )
    local = simkit.make("simkit/CartPole-v0")
    obs, _info = local.reset(seed=6)
    assert reset.obs[1].tobytes() == obs.tobytes()
    step, _ = client.parse_step(server.handle(client.request_step(np.array([1, 1]))))
    assert step.obs[1].tobytes() == local.step(1)[0].tobytes()
    assert reset.infos[0]["params"]["gravity"] == 9.5
    with pytest.raises(RemoteError, match=r"\[invalid_parameter\].*unknown randomization"):
        client.parse_reset(server.handle(client.request_reset(params=[{"wind": 1.0}, {}])))


def _seeding_and_envs(server: ServerSession) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What a reset may change: the host's seeding bookkeeping and every env's snapshot."""
    host = server.host
    return host.vector.seeds.get_state(), host.get_state(np.arange(host.num_envs))


@pytest.mark.parametrize(
    ("body", "code", "match"),
    [
        ({"seed": 9, "params": [{}, {"bogus": 1.0}]}, "invalid_parameter", "unknown .*'bogus'"),
        ({"params": [{}, {"gravity": -1.0}]}, "invalid_parameter", "declared domain"),
        ({"options": {"params": [{"gravity": 9.8}]}}, "invalid_parameter", "got list"),
        ({"options": {"params": "gravity"}}, "invalid_parameter", "got str"),
        ({"seed": 9, "env_offset": 2**63 - 1}, "invalid_field", r"\[0, 9223372036854775806\]"),
        ({"env_offset": 2**64 - 1}, "invalid_field", "must fit int64"),
    ],
)
def test_a_refused_reset_changes_no_env_and_no_seeding(
    body: dict[str, Any], code: str, match: str
) -> None:
    server, client = _ready([simkit.make("simkit/CartPole-v0") for _ in range(2)])
    client.parse_reset(server.handle(client.request_reset(seed=0, env_offset=3)))
    client.parse_step(server.handle(client.request_step(np.array([0, 1]))))
    seeding, envs = _seeding_and_envs(server)
    reply = server.handle_message(encode(Message(kind="reset", id=7, body=body)))
    assert reply.kind == "error"
    assert reply.body["code"] == code
    assert re.search(match, reply.body["message"]), reply.body["message"]
    seeding_after, envs_after = _seeding_and_envs(server)
    assert simkit.snapshot.states_equal(seeding, seeding_after)
    assert all(simkit.snapshot.states_equal(a, b) for a, b in zip(envs, envs_after, strict=True))


def test_the_largest_env_offset_is_served() -> None:
    server, client = _ready([simkit.make("simkit/CartPole-v0") for _ in range(2)])
    top = 2**63 - 2
    reset = client.parse_reset(server.handle(client.request_reset(seed=4, env_offset=top)))
    local = simkit.make("simkit/CartPole-v0")
    assert reset.obs[1].tobytes() == local.reset(seed=episode_seed(4, top + 1, 0))[0].tobytes()


class FailingReset(Flaky):
    """:class:`Flaky` whose reset raises while ``fail`` is set."""

    fail = False

    def reset_episode(
        self, rng: np.random.Generator, params: Any, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if self.fail:
            raise RuntimeError("reset failed")
        return super().reset_episode(rng, params, options)


def test_an_env_raising_in_reset_leaves_the_seeding_so_a_retry_gets_the_same_seeds() -> None:
    def run(fail_once: bool) -> np.ndarray:
        envs = [FailingReset(), FailingReset()]
        server, client = _ready(envs)
        client.parse_reset(server.handle(client.request_reset(seed=1)))
        if fail_once:
            envs[1].fail = True
            seeding, _ = _seeding_and_envs(server)
            with pytest.raises(RemoteError, match=r"\[env_error\].*reset failed"):
                client.parse_reset(server.handle(client.request_reset(env_offset=6)))
            assert simkit.snapshot.states_equal(seeding, _seeding_and_envs(server)[0])
            envs[1].fail = False
        return client.parse_reset(server.handle(client.request_reset(env_offset=6))).obs

    assert run(fail_once=True).tobytes() == run(fail_once=False).tobytes()


def test_an_env_that_raises_ends_only_its_own_episode() -> None:
    server, client = _ready([Flaky(), Flaky()])
    client.parse_reset(server.handle(client.request_reset(seed=2)))
    step, faults = client.parse_step(
        server.handle(client.request_step(np.array([[1.0], [0.1]], dtype=np.float32)))
    )
    assert [(f.env_id, f.code) for f in faults] == [(0, "env_error")]
    assert "RuntimeError: boom" in faults[0].message
    assert step.truncated.tolist() == [True, False]
    assert step.infos[1] == {"x": pytest.approx(float(step.obs[1][0]))}
    assert "reset_info" in step.infos[0]
    assert step.infos[0]["reset_info"]["note"].startswith("<object")  # stringified
    step, faults = client.parse_step(
        server.handle(client.request_step(np.array([[0.1], [0.1]], dtype=np.float32)))
    )
    assert faults == []
    assert step.obs[:, 1].tolist() == [1.0, 1.0]


def test_plain_gymnasium_env_lacks_state_and_params() -> None:
    factory = make_env_factory("gym:Pendulum-v1")
    server, client = _ready([factory(), factory()])
    assert client.info is not None
    assert client.info.capabilities == frozenset()
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    step, _ = client.parse_step(server.handle(client.request_step(np.zeros((2, 1)))))
    assert step.obs.shape == (2, 3)
    with pytest.raises(RemoteError, match=r"\[unsupported\] this env lacks the 'state'"):
        client.parse_get_state(server.handle(client.request_get_state()))
    with pytest.raises(RemoteError, match=r"\[unsupported\]"):
        client.parse_reset(server.handle(client.request_reset(params=[{"g": 1.0}, {}])))


def test_dict_observations_travel_as_named_arrays() -> None:
    space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "mode": spaces.Discrete(3)})
    info = ServerInfo("t", 2, space, spaces.Discrete(2))
    client = ClientSession()
    client.info = info
    obs = {"pos": np.ones((2, 2), dtype=np.float32), "mode": np.array([0, 2])}
    reply = Message(
        "reset",
        1,
        {"infos": [{}, {}]},
        {"obs/pos": obs["pos"], "obs/mode": obs["mode"], "env_ids": np.arange(2)},
    )
    client._pending[1] = "reset"
    out = client.parse_reset(encode(reply))
    assert out.obs["mode"].tolist() == [0, 2]
    assert out.obs["pos"].shape == (2, 2)


def test_client_refuses_mismatched_replies() -> None:
    client = ClientSession()
    client.request_ping()
    with pytest.raises(MalformedMessage, match="reply to no pending request"):
        client.parse_ping(encode(Message("ping", 99)))
    with pytest.raises(MalformedMessage, match="reply of another kind"):
        client.parse_ping(encode(Message("close", 1)))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("env_ids", np.zeros((1, 2), np.int64), "lacks 1-D integer 'env_ids'"),
        ("env_ids", np.zeros(2, np.float64), "lacks 1-D integer 'env_ids'"),
        ("reward", np.zeros(3), "lacks 'reward' with one row per env id"),
        ("terminated", np.zeros(2, np.float32), "lacks 'terminated' with one row per env id"),
        ("truncated", None, "lacks 'truncated' with one row per env id"),
    ],
)
def test_client_refuses_step_replies_whose_rows_disagree(
    field: str, value: np.ndarray | None, match: str
) -> None:
    server, client = _ready([simkit.make("simkit/CartPole-v0") for _ in range(2)])
    client.parse_reset(server.handle(client.request_reset(seed=0)))
    reply = decode(server.handle(client.request_step(np.array([0, 1]))))
    if value is None:
        del reply.arrays[field]
    else:
        reply.arrays[field] = value
    with pytest.raises(InvalidField, match=match):
        client.parse_step(encode(reply))


@pytest.mark.parametrize("seeding", ["root", "per_env"])
def test_remote_equals_simkit_vector_bit_for_bit(seeding: str) -> None:
    from simkit.vector import VectorEnv

    n = 3
    server, client = _ready([simkit.make("simkit/CartPole-v0") for _ in range(n)])
    vec = VectorEnv("simkit/CartPole-v0", n)
    if seeding == "root":
        remote = client.parse_reset(server.handle(client.request_reset(seed=9)))
        local_obs, _ = vec.reset(seed=9)
    else:
        remote = client.parse_reset(server.handle(client.request_reset(seeds=[4, 5, 6])))
        local_obs, _ = vec.reset(seed=[4, 5, 6])
    assert remote.obs.tobytes() == local_obs.tobytes()
    rng = np.random.default_rng(1)
    for _ in range(40):
        actions = rng.integers(0, 2, size=n)
        got, _ = client.parse_step(server.handle(client.request_step(actions)))
        want = vec.step_batch(actions)
        for field in ("obs", "final_obs", "reward", "terminated", "truncated", "env_ids"):
            assert getattr(got, field).tobytes() == getattr(want, field).tobytes(), field
    vec.close()
