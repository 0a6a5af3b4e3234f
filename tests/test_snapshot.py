"""Snapshots are plain msgpack data: exact round trips, no ext types, clear errors."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from simkit import snapshot
from simkit.errors import InvalidState

DTYPES = ["bool", "int8", "uint8", "int16", "int32", "uint32", "int64", "uint64"]
DTYPES += ["float16", "float32", "float64", "complex64", "complex128", ">f8", "<i4"]

arrays = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0))
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | arrays
)
trees = st.recursive(
    leaves,
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3)
    ),
    max_leaves=12,
)


def _no_ext(code: int, data: bytes) -> Any:
    raise AssertionError(f"ext type {code} in snapshot bytes")


@given(tree=trees)
def test_round_trip_is_exact_and_uses_no_ext_types(tree: Any) -> None:
    data = snapshot.dumps(tree)
    msgpack.unpackb(data, raw=False, ext_hook=_no_ext, timestamp=0)
    back = snapshot.loads(data)
    assert snapshot.states_equal(back, tree)
    assert snapshot.states_equal(snapshot.loads(snapshot.dumps(back)), back)


def test_arrays_keep_dtype_shape_and_order() -> None:
    tree = {"a": np.arange(6, dtype=">i2").reshape(2, 3).T, "b": np.zeros((0, 4), np.float32)}
    back = snapshot.loads(snapshot.dumps(tree))
    assert back["a"].dtype == np.dtype(">i2")
    assert back["a"].shape == (3, 2)
    np.testing.assert_array_equal(back["a"], tree["a"])
    assert back["b"].shape == (0, 4)
    assert back["a"].flags.writeable


def test_numpy_scalars_become_python_numbers() -> None:
    back = snapshot.loads(
        snapshot.dumps({"x": np.float32(0.5), "n": np.int64(-3), "b": np.bool_(True)})
    )
    assert back == {"x": 0.5, "n": -3, "b": True}
    assert type(back["n"]) is int


def test_states_equal_is_bitwise() -> None:
    assert snapshot.states_equal(float("nan"), float("nan"))
    assert not snapshot.states_equal(0.0, -0.0)
    assert not snapshot.states_equal(np.zeros(2, np.float32), np.zeros(2, np.float64))
    assert not snapshot.states_equal(np.zeros(2), [0.0, 0.0])
    assert not snapshot.states_equal({"a": 1}, {"a": 1, "b": 2})
    assert not snapshot.states_equal(1, True)
    assert snapshot.states_equal((1, 2), [1, 2])


def test_first_difference_names_the_path_both_values_and_how() -> None:
    state = {"rng": {"s": 1}, "data": {"x": np.zeros((2, 3)), "n": np.int64(7), "l": [1.0, 2]}}
    assert snapshot.first_difference(state, snapshot.loads(snapshot.dumps(state))) == (
        snapshot.StateDifference("['data']['n']", np.int64(7), 7, "numpy int64 7 vs int 7")
    )
    other = {"rng": {"s": 1}, "data": {"x": np.eye(2, 3), "n": np.int64(7), "l": [1.0, 2]}}
    found = snapshot.first_difference(state, other)
    assert found is not None
    assert (found.path, found.reason) == (
        "['data']['x']",
        "values differ first at [0, 0]: 0.0 vs 1.0",
    )
    cases = [
        ([0.0], [-0.0], "[0]", "0.0 vs -0.0 (their bits differ)"),
        ({"a": 1}, {"b": 1}, "", "keys: only in the first ['a'], only in the second ['b']"),
        (np.zeros(2, np.float32), np.zeros(2), "", "dtype float32 vs float64"),
        (np.zeros(2), [0.0, 0.0], "", "float64 array of shape (2,) vs list"),
        ((1, [2]), [1, [2, 3]], "[1]", "length 1 vs 2"),
        ({"s": "a"}, {"s": "b"}, "['s']", "'a' vs 'b'"),
    ]
    for a, b, path, reason in cases:
        found = snapshot.first_difference(a, b)
        assert found is not None
        assert (found.path, found.reason) == (path, reason)
    assert snapshot.first_difference((1, [np.ones(2)]), [1, (np.ones(2),)]) is None


def _equal_before(a: Any, b: Any) -> bool:
    """states_equal as it was before it became ``first_difference(a, b) is None``."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal_before(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_equal_before(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return type(a) is type(b) and a == b


@given(trees, trees)
def test_states_equal_keeps_its_rule(a: Any, b: Any) -> None:
    for x, y in [(a, b), (a, a), (a, snapshot.loads(snapshot.dumps(a)))]:
        assert snapshot.states_equal(x, y) == _equal_before(x, y)
        assert (snapshot.first_difference(x, y) is None) == _equal_before(x, y)


@pytest.mark.parametrize("bit_generator", ["PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"])
def test_rng_round_trip_continues_identically(bit_generator: str) -> None:
    rng = np.random.Generator(getattr(np.random, bit_generator)(42))
    rng.normal(size=3)
    plain = snapshot.rng_to_plain(rng)
    copy = snapshot.rng_from_plain(snapshot.loads(snapshot.dumps(plain)))
    np.testing.assert_array_equal(rng.random(16), copy.random(16))
    assert rng.integers(0, 2**62) == copy.integers(0, 2**62)


def test_rng_plain_state_carries_128_bit_ints_as_hex() -> None:
    rng = np.random.default_rng(2**127 + 5)
    plain = snapshot.rng_to_plain(rng)
    assert isinstance(plain["state"]["state"], dict)
    assert set(plain["state"]["state"]) == {"__int__"}
    assert int(plain["state"]["state"]["__int__"], 16) == rng.bit_generator.state["state"]["state"]
    assert (
        int(plain["state"]["state"]["__int__"], 16) >= 2**64
        or rng.bit_generator.state["state"]["inc"] >= 2**64
    )
    snapshot.dumps(plain)


def test_ints_beyond_64_bits_are_rejected() -> None:
    with pytest.raises(
        InvalidState,
        match=r"state.big: integer 340282366920938463463374607431768211455 does not fit 64 bits",
    ):
        snapshot.dumps({"big": 2**128 - 1})
    with pytest.raises(InvalidState, match=r"does not fit 64 bits"):
        snapshot.dumps([-(2**63) - 1])
    assert snapshot.loads(snapshot.dumps(2**64 - 1)) == 2**64 - 1


@pytest.mark.parametrize(
    ("tree", "match"),
    [
        ({1: 2}, r"state: snapshot keys must be str, got int"),
        (
            {"a": {1.5}},
            r"state.a: snapshots hold dicts, lists, numbers, str, bytes and arrays, got set",
        ),
        ({"a": [object()]}, r"state.a\[0\]: .* got object"),
        ({"a": np.array(["x"])}, r"state.a: only numeric/bool arrays can be snapshotted, got <U1"),
        ({"a": np.array([None], dtype=object)}, r"got object"),
        ({"t": np.datetime64("2020-01-01")}, r"state.t: only numeric/bool scalars"),
    ],
)
def test_unsupported_values_rejected(tree: Any, match: str) -> None:
    with pytest.raises(InvalidState, match=match):
        snapshot.dumps(tree)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\xc1", r"snapshot bytes are not valid msgpack"),
        (msgpack.packb({"a": 1}) + b"\x00", r"not valid msgpack"),
        (msgpack.packb(msgpack.ExtType(5, b"x")), r"never hold msgpack ext types, got ext type 5"),
        (
            msgpack.packb({"t": msgpack.Timestamp(1)}),
            r"state.t: snapshots hold only plain msgpack types, got Timestamp",
        ),
        (msgpack.packb({1: 2}, use_bin_type=True), r"not valid msgpack"),
        (
            msgpack.packb({"__ndarray__": True, "dtype": "<f8", "shape": [3], "data": b"\x00" * 8}),
            r"malformed array in snapshot",
        ),
        (
            msgpack.packb({"__ndarray__": True, "dtype": "|O", "shape": [1], "data": b"\x00" * 8}),
            r"malformed array in snapshot: dtype object is not numeric",
        ),
        (msgpack.packb({"__ndarray__": True, "dtype": "<f8"}), r"malformed array in snapshot"),
        ("not bytes", r"snapshot data must be bytes from dumps\(\), got str"),
    ],
)
def test_malformed_bytes_raise_invalid_state(data: Any, match: str) -> None:
    with pytest.raises(InvalidState, match=match):
        snapshot.loads(data)


@pytest.mark.parametrize(
    ("plain", "match"),
    [
        (
            {"bit_generator": "seed", "state": {}},
            r"bit_generator must name a numpy BitGenerator, got 'seed'",
        ),
        ({"bit_generator": "NoSuch"}, r"got 'NoSuch'"),
        ({"state": {}}, r"malformed rng state in snapshot: KeyError"),
        ({"bit_generator": "PCG64", "state": "x"}, r"malformed rng state"),
        (5, r"malformed rng state"),
    ],
)
def test_malformed_rng_state(plain: Any, match: str) -> None:
    with pytest.raises(InvalidState, match=match):
        snapshot.rng_from_plain(plain)


def _nested(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for k in range(depth):
        value = [value] if k % 2 else {"k": value}
    return value


def test_nesting_beyond_max_depth_is_invalid_state_not_recursion_error() -> None:
    """msgpack decodes lists and maps nested up to 1024 deep; ``loads`` then recursed past
    Python's limit (a RecursionError out of a recording's reader or a server's
    ``set_state``). Both walks now stop at ``MAX_DEPTH`` with ``InvalidState``."""
    deep = msgpack.packb(_nested(900), use_bin_type=True)
    with pytest.raises(InvalidState, match=r"nest dicts and lists at most 100 deep, got deeper"):
        snapshot.loads(deep)
    with pytest.raises(InvalidState, match="at most 100 deep"):
        snapshot.dumps(_nested(900))
    ok = _nested(snapshot.MAX_DEPTH - 1, np.arange(3))
    assert snapshot.states_equal(snapshot.loads(snapshot.dumps(ok)), ok)


@pytest.mark.parametrize(
    ("shape", "data"),
    [
        ([float("-inf")], b""),
        ([float("nan")], b""),
        ([2.0], b"\0" * 16),
        ([-1], b"\0" * 8),
        (["2"], b"\0" * 16),
        ([True], b"\0" * 8),
        ([[2]], b"\0" * 16),
        ("ab", b"\0" * 16),
    ],
)
def test_an_array_shape_must_be_a_list_of_ints_at_least_zero(shape: Any, data: bytes) -> None:
    """An array's shape is what ``to_plain`` writes: ints >= 0. ``int()`` of each entry
    took floats (an infinite one escaped as OverflowError, a server's ``env_error``),
    str and bool, and -1 let numpy infer a dimension the snapshot never had."""
    plain = {"__ndarray__": True, "dtype": "<f8", "shape": shape, "data": data}
    with pytest.raises(InvalidState, match="malformed array in snapshot: shape must be"):
        snapshot.from_plain({"x": plain})


@pytest.mark.parametrize("dtype", [["<f8"], {"names": ["a"], "formats": ["<f8"]}, 5, None])
def test_an_array_dtype_must_be_a_str(dtype: Any) -> None:
    """``np.dtype`` builds structured dtypes from lists and maps; a snapshot names its
    dtype by ``dtype.str``."""
    plain = {"__ndarray__": True, "dtype": dtype, "shape": [1], "data": b"\0" * 8}
    with pytest.raises(InvalidState, match="malformed array in snapshot: dtype must be"):
        snapshot.from_plain(plain)


def test_an_rng_state_holding_an_array_where_a_map_goes_is_invalid_state() -> None:
    """numpy indexes the inner ``state`` with str keys: an array there raised IndexError,
    which a server answered ``env_error`` rather than ``invalid_state``."""
    plain = snapshot.rng_to_plain(np.random.default_rng(0))
    plain["state"] = np.zeros(1)
    with pytest.raises(InvalidState, match="malformed rng state in snapshot: IndexError"):
        snapshot.rng_from_plain(plain)


def test_bytes_of_tiny_containers_are_refused_before_they_outgrow_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """4 MiB of one-byte empty maps (a checkpoint's ``state.msgpack`` edited by hand)
    unpacked to ~300 MB of dicts, more than this machine (made to have 256 MiB free)
    holds; ``loads`` counts them as msgpack builds them and stops in time."""
    import tracemalloc

    import simkit._limits

    n = 4 * 2**20
    data = b"\x81" + msgpack.packb("pad") + b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n
    monkeypatch.setattr(simkit._limits, "available_memory", lambda: 256 * 2**20)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidState, match="too many msgpack objects"):
            snapshot.loads(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, f"loads allocated {peak / 2**20:.0f} MiB"
