"""validate_action: canonical forms and clear errors for every Gymnasium space kind."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from simkit import ActionBounds, validate_action
from simkit.errors import InvalidAction

BOX = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)


def test_box_canonical_form_is_a_copy_of_space_dtype() -> None:
    action = np.array([0.5, -0.25])
    out = validate_action(BOX, action)
    assert out.dtype == np.float32
    assert out.shape == (2,)
    out[0] = 9.0
    assert action[0] == 0.5
    np.testing.assert_array_equal(validate_action(BOX, [1, 0]), np.array([1.0, 0.0], np.float32))


def test_box_clip_is_default_and_raise_is_opt_in() -> None:
    np.testing.assert_array_equal(validate_action(BOX, [2.0, -3.0]), [1.0, -1.0])
    with pytest.raises(
        InvalidAction,
        match=r"action must lie in \[\[-1.0, -1.0\], \[1.0, 1.0\]\], got \[2.0, 0.0\]",
    ):
        validate_action(BOX, [2.0, 0.0], bounds=ActionBounds.RAISE)
    assert validate_action(BOX, [1.0, -1.0], bounds=ActionBounds.RAISE).tolist() == [1.0, -1.0]


@pytest.mark.parametrize(
    ("action", "match"),
    [
        ([0.0, 0.0, 0.0], r"action must have shape \(2,\), got shape \(3,\)"),
        (0.0, r"must have shape \(2,\), got shape \(\)"),
        ([[0.0, 0.0]], r"got shape \(1, 2\)"),
        (
            ["a", "b"],
            r"action must be a numeric array of dtype float32 and shape \(2,\), got dtype <U1",
        ),
        ([True, False], r"got dtype bool"),
        (
            [0.0, np.nan],
            r"action must be finite \(no NaN or inf\) in dtype float32, got \[0.0, nan\]",
        ),
        ([np.inf, 0.0], r"must be finite"),
        ([1e300, 0.0], r"must be finite"),
        ([[0.0], [0.0, 1.0]], r"action must be array-like with shape \(2,\)"),
    ],
)
def test_box_rejects(action: Any, match: str) -> None:
    for bounds in ActionBounds:
        with pytest.raises(InvalidAction, match=match):
            validate_action(BOX, action, bounds=bounds)


def test_integer_box_takes_only_integers() -> None:
    space = spaces.Box(0, 10, shape=(2,), dtype=np.int64)
    assert validate_action(space, [3, 20]).tolist() == [3, 10]
    with pytest.raises(
        InvalidAction,
        match=r"action must be an integer array for a Box of dtype int64, got dtype float64",
    ):
        validate_action(space, [1.5, 2.0])


def test_discrete() -> None:
    space = spaces.Discrete(3, start=1)
    for ok in (1, np.int64(3), np.uint8(2), np.array(2)):
        out = validate_action(space, ok)
        assert type(out) is int
        assert out == int(ok)
    with pytest.raises(InvalidAction, match=r"action must be in \[1, 4\), got 4"):
        validate_action(space, 4)
    with pytest.raises(InvalidAction, match=r"action must be in \[1, 4\), got 0"):
        validate_action(space, 0)
    for bad in (1.0, True, "1", [1], np.array([1])):
        with pytest.raises(
            InvalidAction, match=r"action must be an integer scalar in \[1, 4\), got"
        ):
            validate_action(space, bad)


def test_multi_discrete() -> None:
    space = spaces.MultiDiscrete([3, 2])
    out = validate_action(space, [2, 1])
    assert out.dtype == np.int64
    assert out.tolist() == [2, 1]
    with pytest.raises(
        InvalidAction,
        match=r"must satisfy start <= a < start \+ nvec with nvec=\[3, 2\], got \[3, 0\]",
    ):
        validate_action(space, [3, 0])
    with pytest.raises(InvalidAction, match=r"nvec=\[3, 2\], got \[-1, 0\]"):
        validate_action(space, [-1, 0])
    with pytest.raises(
        InvalidAction, match=r"action must be an integer array of shape \(2,\), got dtype float64"
    ):
        validate_action(space, [1.0, 0.0])
    with pytest.raises(InvalidAction, match=r"action must have shape \(2,\), got shape \(3,\)"):
        validate_action(space, [1, 0, 0])


def test_multi_binary() -> None:
    space = spaces.MultiBinary(3)
    out = validate_action(space, [True, False, True])
    assert out.dtype == np.int8
    assert out.tolist() == [1, 0, 1]
    with pytest.raises(InvalidAction, match=r"action must contain only 0 and 1, got \[0, 2, 1\]"):
        validate_action(space, [0, 2, 1])
    with pytest.raises(InvalidAction, match=r"got dtype float64"):
        validate_action(space, [0.0, 1.0, 1.0])


def test_dict_and_tuple_recurse_with_named_paths() -> None:
    space = spaces.Dict(
        {"move": BOX, "grip": spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(1)))}
    )
    out = validate_action(space, {"move": [3.0, 0.0], "grip": [np.int32(1), [0]]})
    assert out["move"].tolist() == [1.0, 0.0]
    assert out["grip"][0] == 1
    assert isinstance(out["grip"], tuple)
    with pytest.raises(
        InvalidAction, match=r"action must be a dict with keys \['grip', 'move'\], got \['move'\]"
    ):
        validate_action(space, {"move": [0.0, 0.0]})
    with pytest.raises(InvalidAction, match=r"got list"):
        validate_action(space, [0, 1])
    with pytest.raises(InvalidAction, match=r"action\['grip'\]\[0\] must be in \[0, 2\), got 5"):
        validate_action(space, {"move": [0.0, 0.0], "grip": (5, [0])})
    with pytest.raises(
        InvalidAction, match=r"action\['grip'\] must be a tuple of 2 actions, got int"
    ):
        validate_action(space, {"move": [0.0, 0.0], "grip": 1})
    with pytest.raises(InvalidAction, match=r"action\['move'\] must be finite"):
        validate_action(space, {"move": [np.nan, 0.0], "grip": (0, [0])}, bounds=ActionBounds.RAISE)


def test_other_spaces_fall_back_to_contains() -> None:
    space = spaces.Text(4)
    assert validate_action(space, "abc") == "abc"
    with pytest.raises(InvalidAction, match=r"action 'abcdefg' is not in Text"):
        validate_action(space, "abcdefg")


def test_name_appears_in_messages() -> None:
    with pytest.raises(InvalidAction, match=r"action for 'agent_0' must be in \[0, 2\), got 7"):
        validate_action(spaces.Discrete(2), 7, name="action for 'agent_0'")


@pytest.mark.parametrize(
    ("space", "action", "clipped"),
    [
        (spaces.Box(0, 200, (1,), np.uint8), np.array([300]), [200]),
        (spaces.Box(0, 200, (1,), np.uint8), np.array([-1]), [0]),
        (spaces.Box(0, 10, (1,), np.int64), np.array([2**64 - 1], np.uint64), [10]),
        (spaces.Box(-1.5, 1.5, (1,), np.float32), np.array([-7]), [-1.5]),
    ],
)
def test_integer_actions_are_bounded_before_the_cast_that_would_wrap_them(
    space: spaces.Box, action: np.ndarray, clipped: list[Any]
) -> None:
    """300 for a uint8 Box became 44 (cast first, then clipped or checked), with CLIP
    and with RAISE alike; so did the batch path every vector and BatchEnv uses."""
    from simkit.vector._actions import check_batch_array

    out = validate_action(space, action, bounds=ActionBounds.CLIP)
    assert out.dtype == space.dtype
    assert out.tolist() == clipped
    with pytest.raises(InvalidAction, match="must lie in"):
        validate_action(space, action, bounds=ActionBounds.RAISE)
    ids = np.arange(2)
    rows = np.stack([action, action])
    batch = check_batch_array(space, rows, ids, ActionBounds.CLIP)
    assert batch is not None
    assert batch.dtype == space.dtype
    assert batch.tolist() == [clipped, clipped]
    assert batch is not rows
    with pytest.raises(InvalidAction, match=r"env \[0, 1\] do not"):
        check_batch_array(space, rows, ids, ActionBounds.RAISE)
