"""The spaces codec: every supported space round-trips exactly through msgpack."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st

from simkit.errors import SimkitError
from simkit.protocol import (
    InvalidField,
    InvalidShape,
    UnsupportedSpace,
    space_from_plain,
    space_to_plain,
)

shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


@st.composite
def boxes(draw: st.DrawFn) -> spaces.Box:
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32, np.uint8, np.int64]))
    shape = draw(shapes)
    if np.dtype(dtype).kind == "f":
        low = draw(st.sampled_from([-np.inf, -1.5, 0.0]))
        high = draw(st.sampled_from([np.inf, 2.25, 1e30]))
    else:
        info = np.iinfo(dtype)
        low = draw(st.integers(int(info.min), 0))
        high = draw(st.integers(1, min(int(info.max), 2**31)))
    return spaces.Box(low, high, shape=shape, dtype=dtype)


leaves = st.one_of(
    boxes(),
    st.builds(spaces.Discrete, st.integers(1, 100), start=st.integers(-5, 5)),
    st.builds(
        lambda nvec, start: spaces.MultiDiscrete(nvec, start=[start] * len(nvec)),
        st.lists(st.integers(1, 9), min_size=1, max_size=4),
        st.integers(-3, 3),
    ),
    st.builds(spaces.MultiBinary, st.integers(1, 8)),
    st.builds(
        lambda s: spaces.MultiBinary(list(s)), st.lists(st.integers(1, 3), min_size=2, max_size=3)
    ),
)
all_spaces = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(spaces.Tuple),
        st.dictionaries(
            st.text("abcxyz", min_size=1, max_size=4), children, min_size=1, max_size=3
        ).map(spaces.Dict),
    ),
    max_leaves=6,
)


def _wire(plain: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(plain, use_bin_type=True), raw=False)


def _same(a: spaces.Space[Any], b: spaces.Space[Any]) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, spaces.Box):
        assert isinstance(b, spaces.Box)
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.low.tobytes() == b.low.tobytes()
            and a.high.tobytes() == b.high.tobytes()
        )
    if isinstance(a, spaces.Dict):
        assert isinstance(b, spaces.Dict)
        return list(a.spaces) == list(b.spaces) and all(_same(a[k], b[k]) for k in a.spaces)
    if isinstance(a, spaces.Tuple):
        assert isinstance(b, spaces.Tuple)
        return len(a.spaces) == len(b.spaces) and all(
            _same(x, y) for x, y in zip(a.spaces, b.spaces, strict=True)
        )
    return a == b and a.dtype == b.dtype


@given(all_spaces)
def test_round_trip_is_exact(space: spaces.Space[Any]) -> None:
    back = space_from_plain(_wire(space_to_plain(space)))
    assert _same(space, back), (space, back)


def test_discrete_start_survives() -> None:
    back = space_from_plain(_wire(space_to_plain(spaces.Discrete(3, start=-1))))
    assert isinstance(back, spaces.Discrete)
    assert (back.n, back.start) == (3, -1)


@pytest.mark.parametrize(
    "space",
    [spaces.Text(5), spaces.Sequence(spaces.Discrete(2)), spaces.Graph(spaces.Discrete(2), None)],
)
def test_unsupported_space_names_the_type(space: spaces.Space[Any]) -> None:
    with pytest.raises(UnsupportedSpace, match=f"cannot serialize a {type(space).__name__}"):
        space_to_plain(space)
    assert issubclass(UnsupportedSpace, SimkitError)


def test_unknown_type_is_refused() -> None:
    with pytest.raises(UnsupportedSpace, match="unknown space type"):
        space_from_plain({"type": "Text", "max_length": 3})


def test_missing_field_is_named() -> None:
    with pytest.raises(InvalidField, match="needs field 'n'"):
        space_from_plain({"type": "Discrete", "start": 0})


def test_bool_is_not_an_int() -> None:
    with pytest.raises(InvalidField, match="wrong type"):
        space_from_plain({"type": "Discrete", "n": True, "start": 0})


def test_box_bounds_must_match_shape() -> None:
    plain = space_to_plain(spaces.Box(-1, 1, shape=(3,), dtype=np.float32))
    plain["low"] = plain["low"][:4]
    with pytest.raises(InvalidShape, match="Box low holds 4 bytes"):
        space_from_plain(plain)


def test_bad_dict_entries_are_refused() -> None:
    with pytest.raises(InvalidField, match=r"\[key, space\] pairs"):
        space_from_plain({"type": "Dict", "spaces": [["a"]]})
