"""Placement-independent sampling: keyed noise and a row-independent forward pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from simkit._noise import NOISE_BLOCK, SlotNoise
from simkit.models import ModelSpec, build_model
from simkit.models._lean import LeanMLP
from simkit.servers._stream_policy import RowPolicy


def _noise(seed: int, first: int, n: int, kind: str = "normal", rows: int = 1, width: int = 2):
    return SlotNoise(
        seed,
        first_slot=first,
        num_slots=n,
        rows_per_slot=rows,
        width=width,
        kind=kind,  # type: ignore[arg-type]
    )


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    total=st.integers(1, 2 * NOISE_BLOCK + 40),
    cut=st.floats(0.0, 1.0),
    step=st.integers(0, 2**40),
    kind=st.sampled_from(["normal", "uniform"]),
    rows=st.integers(1, 3),
)
def test_any_split_of_the_slots_draws_the_same_noise(
    seed: int, total: int, cut: float, step: int, kind: str, rows: int
) -> None:
    whole = _noise(seed, 0, total, kind, rows).draw(step)
    a = int(cut * (total - 1))
    if a == 0:
        parts = [whole]
    else:
        parts = [
            _noise(seed, 0, a, kind, rows).draw(step),
            _noise(seed, a, total - a, kind, rows).draw(step),
        ]
    assert whole.shape == (total * rows, 2)
    assert whole.dtype == np.float32
    assert np.array_equal(np.concatenate(parts), whole)


def test_noise_depends_on_seed_slot_and_step() -> None:
    base = _noise(1, 0, 4).draw(0)
    assert not np.array_equal(_noise(2, 0, 4).draw(0), base)
    assert not np.array_equal(_noise(1, 0, 4).draw(1), base)
    assert not np.array_equal(base[0], base[1])
    # A slot's noise does not depend on which slots share the session.
    assert np.array_equal(_noise(1, 3, 1).draw(0), base[3:4])
    uniform = _noise(1, 0, 64, "uniform").draw(5)
    assert uniform.min() >= 0.0
    assert uniform.max() < 1.0


def test_noise_refuses_bad_layouts() -> None:
    with pytest.raises(ValueError, match=r"num_slots, rows_per_slot, width >= 1, got 0, 0, 1, 2"):
        _noise(0, 0, 0)
    with pytest.raises(ValueError, match="kind must be 'normal' or 'uniform', got 'gumbel'"):
        _noise(0, 0, 1, "gumbel")
    with pytest.raises(ValueError, match="exceeds"):
        _noise(0, 0, 1, rows=2**16, width=2**16)


@pytest.mark.parametrize(
    ("name", "action_space", "explore"),
    [
        ("mlp", spaces.Discrete(3), False),
        ("mlp", spaces.Box(-1.0, 1.0, (3,), np.float32), False),
        ("sac_mlp", spaces.Box(-2.0, 3.0, (3,), np.float32), False),
        ("sac_mlp", spaces.Box(-2.0, 3.0, (3,), np.float32), True),
    ],
    ids=["categorical", "gaussian", "sac-squashed", "sac-exploring"],
)
def test_lean_rows_are_computed_alone(
    name: str,
    action_space: spaces.Space,  # type: ignore[type-arg]
    explore: bool,
) -> None:
    """A row's action, log-prob and value have the same bits in any batch: any slice
    of the rows, at any offset, beside any neighbours."""
    obs_space = spaces.Box(-5.0, 5.0, (7,), np.float32)
    torch.manual_seed(0)
    model = build_model(ModelSpec(name, {"hidden_sizes": [64, 64]}), obs_space, action_space)
    if name == "sac_mlp":
        model.head.explore.fill_(float(explore))
    lean = LeanMLP.of(model)
    assert lean is not None
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((70, 7)).astype(np.float32)
    noise = _noise(3, 0, 70, model.head.noise_kind, width=model.head.noise_width).draw(0)
    full = lean.act(obs, noise)
    for lo, hi in [(0, 1), (5, 6), (3, 20), (17, 37), (0, 36), (16, 48), (33, 70)]:
        part = lean.act(obs[lo:hi], noise[lo:hi], lo)
        for got, want in zip(part, full, strict=True):
            assert np.array_equal(got, want[lo:hi])
        assert np.array_equal(lean.value(obs[lo:hi], lo), full[2][lo:hi])
        # A subset of rows (final values of truncated episodes) keeps their bits too.
        picked = np.arange(lo, hi, 3) - lo
        assert np.array_equal(lean.value(obs[lo:hi], lo, picked), full[2][lo:hi][picked])
    # Rows at the same global index have the same bits whatever their neighbours.
    other = obs.copy()
    other[::2] = rng.standard_normal(other[::2].shape).astype(np.float32)
    assert np.array_equal(lean.act(other, noise)[2][1::2], full[2][1::2])


def test_row_policy_acts_alike_in_one_part_or_two() -> None:
    obs_space = spaces.Box(-5.0, 5.0, (4,), np.float32)
    act_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    model = build_model(ModelSpec("mlp", {"hidden_sizes": [16]}), obs_space, act_space)

    def policy(first: int, n: int) -> RowPolicy:
        return RowPolicy(
            model,
            torch.device("cpu"),
            seed=9,
            first_slot=first,
            num_slots=n,
            rows_per_slot=1,
            action_space=act_space,
        )

    obs = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    whole = policy(0, 6).act(obs, 4)
    halves = policy(0, 3).act(obs[:3], 4), policy(3, 3).act(obs[3:], 4)
    assert np.array_equal(np.concatenate([h.actions for h in halves]), whole.actions)
    assert np.array_equal(np.concatenate([h.log_probs for h in halves]), whole.log_probs)
    parted = policy(0, 6)
    assert np.array_equal(parted.act(obs[3:], 4, slice(3, 6)).actions, whole.actions[3:])
