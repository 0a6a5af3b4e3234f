"""Distributions sample only from the rng they get, stay in domain, and check overrides."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simkit._batch_params import Sampler
from simkit.errors import InvalidParameter
from simkit.randomization import (
    Choice,
    Distribution,
    LogUniform,
    Normal,
    Uniform,
    params_equal,
    resolve_overrides,
    sample_params,
    uniform_rows,
)

DISTRIBUTIONS: list[Distribution] = [
    Uniform(-1.0, 2.0),
    LogUniform(0.1, 10.0),
    Normal(0.0, 1.0, -0.5, 0.5),
    Choice(("a", "b", "c")),
    Choice((1, 2, 3), weights=(0.0, 1.0, 3.0)),
    Uniform((0.0, 1.0, 2.0), (1.0, 2.0, 3.0)),
    LogUniform((0.5, 1.0), 4.0),
    Normal((0.0, 5.0), 2.0, (-1.0, 4.0), (1.0, 6.0)),
]


def _same(a: Any, b: Any) -> bool:
    return params_equal({"x": a}, {"x": b})


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=repr)
def test_same_rng_state_gives_same_value(
    dist: Distribution, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("global numpy RNG used")

    for name in ("uniform", "normal", "choice", "random", "random_sample", "randint"):
        monkeypatch.setattr(np.random, name, forbidden)
    rng = np.random.default_rng(123)
    state = rng.bit_generator.state
    first = [dist.sample(rng) for _ in range(5)]
    rng.bit_generator.state = state
    second = [dist.sample(rng) for _ in range(5)]
    assert all(_same(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=repr)
@given(seed=st.integers(0, 2**63 - 1))
def test_samples_stay_in_domain(dist: Distribution, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(20):
        value = dist.sample(rng)
        assert dist.contains(value)
        if dist.shape:
            assert isinstance(value, np.ndarray)
            assert value.shape == dist.shape
            assert value.dtype == np.float64


@given(
    low=st.floats(-1e6, 1e6),
    width=st.floats(0, 1e6),
    mean_frac=st.floats(0, 1),
    std=st.floats(0, 1e3),
    seed=st.integers(0, 2**32),
)
def test_hypothesis_intervals_stay_in_domain(
    low: float, width: float, mean_frac: float, std: float, seed: int
) -> None:
    high = low + width
    rng = np.random.default_rng(seed)
    mean = min(max(low + mean_frac * width, low), high)
    for dist in (Uniform(low, high), Normal(mean, std, low, high)):
        value = dist.sample(rng)
        assert low <= value <= high
    if low > 0:
        assert low <= LogUniform(low, high).sample(rng) <= high


@given(low=st.floats(1e-300, 1e6), width=st.floats(0, 1e6), seed=st.integers(0, 2**32))
def test_scalar_sampling_draws_what_the_array_path_draws(
    low: float, width: float, seed: int
) -> None:
    """Scalar Uniform/LogUniform take a float fast path; values must not change by a bit."""
    high = low + width
    lo, hi = np.full((), low), np.full((), high)
    for dist, reference in (
        (Uniform(low, high), lambda r: np.clip(r.uniform(lo, hi, size=()), lo, hi)),
        (
            LogUniform(low, high),
            lambda r: np.clip(np.exp(r.uniform(np.log(lo), np.log(hi), size=())), lo, hi),
        ),
    ):
        fast, slow = np.random.default_rng(seed), np.random.default_rng(seed)
        for _ in range(3):
            value = dist.sample(fast)
            assert type(value) is float
            assert value == float(reference(slow))


def test_value_objects_equal_and_hash() -> None:
    assert Uniform(0, 1) == Uniform(0.0, 1.0)
    assert hash(Uniform(0, 1)) == hash(Uniform(0.0, 1.0))
    assert Uniform([0, 1], [1, 2]) == Uniform(np.array([0.0, 1.0]), (1.0, 2.0))
    assert Uniform(1, 2) != LogUniform(1, 2)
    assert Normal(0, 1, -1, 1) == Normal(0.0, 1.0, -1.0, 1.0)
    assert Choice(["a", "b"]) == Choice(("a", "b"))
    assert Choice((1, 2)) != Choice((1, 2), weights=(1, 1))
    assert len({Uniform(0, 1), Uniform(0, 1), LogUniform(1, 2), Choice((True, False))}) == 3
    assert Uniform((0, 1), 2).shape == (2,)
    assert Uniform(0, 1).shape == ()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Uniform(2, 1), r"Uniform needs low <= high, got low=2.0, high=1.0"),
        (lambda: Uniform(0, float("inf")), r"Uniform bounds must be finite"),
        (lambda: Uniform((0, 0), (1, 1, 1)), r"per-element bounds must have one length"),
        (lambda: Uniform([[0]], 1), r"low must be a scalar or a 1-D sequence"),
        (lambda: LogUniform(0, 1), r"LogUniform needs low > 0, got low=0.0"),
        (lambda: LogUniform((1, -1), 2), r"LogUniform needs low > 0"),
        (lambda: Normal(2, 1, -1, 1), r"Normal mean 2.0 must lie in \[-1.0, 1.0\]"),
        (lambda: Normal(0, -1, -1, 1), r"Normal needs std >= 0"),
        (lambda: Normal(0, 1, 1, -1), r"Normal needs low <= high"),
        (lambda: Normal(float("nan"), 1, -1, 1), r"Normal mean and std must be finite"),
        (lambda: Choice(()), r"Choice needs at least one option"),
        (lambda: Choice((1, 2), weights=(1,)), r"Choice weights must be 2 finite non-negative"),
        (lambda: Choice((1, 2), weights=(0, 0)), r"positive sum"),
        (lambda: Choice((1, 2), weights=(float("nan"), 1)), r"finite non-negative numbers"),
        (lambda: Choice((1, 2), weights=(float("inf"), 1)), r"finite non-negative numbers"),
        (lambda: Choice((float("nan"), 1.0)), r"Choice options must not be NaN"),
        (lambda: Choice("abc"), r"Choice options must be a tuple or list of options, got str"),
        (lambda: Normal(0, 1, -np.inf, 1), r"Normal bounds must be finite, got -inf, 1.0"),
    ],
)
def test_constructor_validation(make: Any, match: str) -> None:
    """Among them, what was accepted and failed later: NaN or infinite weights (numpy's
    "Probabilities contain NaN" at the first reset), a NaN option (never equal to
    itself, so the env's own snapshot was refused), a str's characters as options, and
    a Normal's infinite bound named as "Uniform bounds"."""
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: Uniform("0", "1"),
        lambda: Uniform(False, True),
        lambda: Uniform((0, "1"), (1, 2)),
        lambda: LogUniform("1", 2),
        lambda: Normal(0, 1, "-1", 1),
    ],
)
def test_bounds_must_be_real_numbers(make: Any) -> None:
    """``Uniform("0", "1")`` and ``Uniform(False, True)`` were read as ``[0, 1]``."""
    with pytest.raises(TypeError, match=r"must be real numbers \(int or float\), got"):
        make()


def test_choice_keeps_numpy_scalar_options_as_python_values() -> None:
    """A numpy-float option passed every check but its own snapshot: after a msgpack
    round trip the sampled 1.5 came back a Python float, which ``contains`` refused
    (it compares types), so ``check_snapshot`` failed on a correct env."""
    dist = Choice((np.float64(0.5), np.int64(2), np.str_("a"), np.bool_(True)))
    assert dist.options == (0.5, 2, "a", True)
    assert [type(o) for o in dist.options] == [float, int, str, bool]
    assert dist.contains(0.5)
    assert dist.contains(2)
    assert dist == Choice((0.5, 2, "a", True))


def test_choice_rejects_non_plain_options() -> None:
    with pytest.raises(
        TypeError, match=r"Choice options must be int, float, str or bool, got list"
    ):
        Choice(([1], [2]))


def test_choice_weights_respected() -> None:
    rng = np.random.default_rng(0)
    dist = Choice(("never", "always"), weights=(0.0, 1.0))
    assert {dist.sample(rng) for _ in range(50)} == {"always"}


DECLARED: dict[str, Distribution] = {
    "gravity": Uniform(9.0, 10.0),
    "mass": LogUniform(0.5, 2.0),
    "noise": Normal(0.0, 0.1, -0.3, 0.3),
    "terrain": Choice(("flat", "rough")),
    "friction": Uniform((0.5, 0.5), (1.5, 1.5)),
}


def test_resolve_without_overrides_is_the_declaration() -> None:
    assert resolve_overrides(DECLARED, None) == DECLARED
    assert list(resolve_overrides(DECLARED, {})) == list(DECLARED)


def test_fixed_values_and_narrowed_ranges_accepted() -> None:
    resolved = resolve_overrides(
        DECLARED,
        {
            "gravity": 9.5,
            "mass": Uniform(1.0, 1.5),
            "noise": Normal(0.1, 0.05, 0.0, 0.2),
            "terrain": Choice(("rough",)),
            "friction": [1.0, 1.2],
        },
    )
    sampled = sample_params(resolved, np.random.default_rng(0))
    assert sampled["gravity"] == 9.5
    assert type(sampled["gravity"]) is float
    assert 1.0 <= sampled["mass"] <= 1.5
    assert 0.0 <= sampled["noise"] <= 0.2
    assert sampled["terrain"] == "rough"
    np.testing.assert_array_equal(sampled["friction"], [1.0, 1.2])
    assert list(sampled) == list(DECLARED)


def test_normal_override_of_uniform_inside_domain() -> None:
    resolved = resolve_overrides(DECLARED, {"gravity": Normal(9.5, 1.0, 9.2, 9.8)})
    assert resolved["gravity"] == Normal(9.5, 1.0, 9.2, 9.8)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            {"gravty": 9.5},
            r"unknown randomization parameter 'gravty'; this env declares: friction, gravity, mass, noise, terrain",
        ),
        (
            {"gravity": 11.0},
            r"value for 'gravity' must lie in its declared domain \[9.0, 10.0\] \(shape \(\)\), got 11.0",
        ),
        (
            {"gravity": Uniform(8.0, 9.5)},
            r"override for 'gravity' must stay inside its declared domain \[9.0, 10.0\]",
        ),
        ({"mass": Uniform(0.1, 1.0)}, r"override for 'mass' must stay inside"),
        ({"noise": Normal(0.0, 1.0, -1.0, 1.0)}, r"override for 'noise' must stay inside"),
        (
            {"terrain": "ice"},
            r"value for 'terrain' must lie in its declared domain one of \['flat', 'rough'\]",
        ),
        ({"terrain": Choice(("flat", "ice"))}, r"override for 'terrain'"),
        ({"terrain": Uniform(0, 1)}, r"override for 'terrain'"),
        ({"friction": 1.0}, r"value for 'friction' must lie .* \(shape \(2,\)\), got 1.0"),
        ({"friction": [1.0, 1.0, 1.0]}, r"value for 'friction' .*shape \(2,\)"),
        ({"friction": Uniform(0.6, 1.4)}, r"override for 'friction'"),
        ({"gravity": "9.5"}, r"value for 'gravity' must lie"),
        ({"gravity": True}, r"value for 'gravity' must lie"),
    ],
)
def test_bad_overrides_rejected(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidParameter, match=match):
        resolve_overrides(DECLARED, overrides)


def test_overrides_must_be_a_mapping() -> None:
    with pytest.raises(InvalidParameter, match=r"overrides must be a mapping .* got list"):
        resolve_overrides(DECLARED, [("gravity", 9.5)])  # type: ignore[arg-type]


def test_sample_params_copies_fixed_arrays() -> None:
    resolved = resolve_overrides(DECLARED, {"friction": [1.0, 1.0]})
    rng = np.random.default_rng(0)
    a, b = sample_params(resolved, rng), sample_params(resolved, rng)
    a["friction"][0] = 0.0
    assert b["friction"][0] == 1.0
    assert not params_equal(a, b)


@given(
    seeds=st.lists(st.integers(0, 2**64 - 1), min_size=0, max_size=6),
    low=st.floats(-1e6, 1e6),
    width=st.floats(0, 1e6),
    size=st.sampled_from([(), 1, 4, (2, 3)]),
)
def test_uniform_rows_are_each_generators_own_uniform_draws(
    seeds: list[int], low: float, width: float, size: Any
) -> None:
    """Row k is ``rngs[k].uniform(low, high, size)`` bit for bit, and every generator is
    left where that call leaves it."""
    high = low + width
    rngs = [np.random.default_rng(s) for s in seeds]
    refs = [np.random.default_rng(s) for s in seeds]
    rows = uniform_rows(rngs, low, high, size)
    shape = (size,) if isinstance(size, int) else size
    assert rows.shape == (len(seeds), *shape)
    assert rows.dtype == np.float64
    for row, ref in zip(rows, refs, strict=True):
        np.testing.assert_array_equal(row, ref.uniform(low, high, size))
    for rng, ref in zip(rngs, refs, strict=True):
        assert rng.bit_generator.state == ref.bit_generator.state


def test_uniform_rows_rejects_an_empty_or_infinite_range() -> None:
    rngs = [np.random.default_rng(0)]
    with pytest.raises(ValueError, match=r"finite low <= high, got low=1.0, high=0.0"):
        uniform_rows(rngs, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"finite low <= high"):
        uniform_rows(rngs, -np.inf, 0.0)


_DECLARED = {
    "gravity": Uniform(9.3, 10.3),
    "pole_mass": LogUniform(0.05, 0.2),
    "wide": LogUniform(1e-300, 1e300),
    "force": Uniform(-1e6, 1e6),
}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"gravity": 9.81},
        {"pole_mass": LogUniform(0.1, 0.2), "force": 3.0},
        {"gravity": Normal(9.8, 0.1, 9.3, 10.3)},
        {"force": np.float64(2.0)},
    ],
    ids=["declared", "fixed first", "narrowed and fixed", "normal", "numpy scalar"],
)
@given(seeds=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8))
def test_sampler_rows_equal_sample_params_per_generator(
    overrides: dict[str, Any], seeds: list[int]
) -> None:
    """The batched sampler (one ``random`` call per instance, array arithmetic over all)
    gives each instance what ``sample_params`` gives it from its own generator, in the
    declared order, and leaves each generator where ``sample_params`` leaves it."""
    resolved = resolve_overrides(_DECLARED, overrides)
    rngs = [np.random.default_rng(s) for s in seeds]
    refs = [np.random.default_rng(s) for s in seeds]
    rows, values = Sampler(resolved).rows(rngs)
    for row, ref in zip(rows, refs, strict=True):
        expected = sample_params(resolved, ref)
        assert list(row) == list(expected)
        assert params_equal(row, expected)
    for rng, ref in zip(rngs, refs, strict=True):
        assert rng.bit_generator.state == ref.bit_generator.state
    sampler = Sampler(resolved)
    if values is not None:
        assert values.shape == (len(seeds), len(sampler.names))
        for row, vals in zip(rows, values.tolist(), strict=True):
            assert [row[name] for name in sampler.names] == vals
