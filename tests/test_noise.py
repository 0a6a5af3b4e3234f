"""Placement-independent sampling: keyed noise and a row-independent forward pass."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from simkit._noise import NOISE_BLOCK, SlotNoise, TorchSlotNoise, keyed_normal, normal_table
from simkit.models import ModelSpec, build_model
from simkit.models._actor_critic import ActOutput
from simkit.models._lean import LeanMLP
from simkit.rollout._policy import RowPolicy, host_output


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


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    first=st.integers(0, 3 * NOISE_BLOCK),
    n=st.integers(1, NOISE_BLOCK + 40),
    step=st.integers(0, 2**40),
    rows=st.integers(1, 3),
    width=st.integers(1, 5),
    kind=st.sampled_from(["normal", "uniform"]),
)
def test_torch_noise_has_the_numpy_bits(
    seed: int, first: int, n: int, step: int, rows: int, width: int, kind: str
) -> None:
    host = _noise(seed, first, n, kind, rows, width)
    torch_noise = TorchSlotNoise(host, torch.device("cpu"))
    for s in (step, step + 1):
        got = torch_noise.draw(s)
        assert got.dtype == torch.float32
        assert np.array_equal(got.numpy(), host.draw(s))


@given(
    seed=st.integers(0, 2**63 - 1),
    first=st.integers(0, 2 * NOISE_BLOCK),
    n=st.integers(1, NOISE_BLOCK + 40),
    step=st.integers(0, 2**40),
    count=st.integers(1, 4),
    width=st.integers(1, 3),
    kind=st.sampled_from(["normal", "uniform"]),
)
def test_torch_noise_of_several_steps_is_each_steps_draw(
    seed: int, first: int, n: int, step: int, count: int, width: int, kind: str
) -> None:
    host = _noise(seed, first, n, kind, 1, width)
    got = TorchSlotNoise(host, torch.device("cpu")).draw_steps(step, count)
    assert got.shape == (count, n, width)
    for k in range(count):
        assert np.array_equal(got[k].numpy(), host.draw(step + k))


def test_torch_noise_of_no_steps_is_refused() -> None:
    noise = TorchSlotNoise(_noise(0, 0, 2, "uniform"), torch.device("cpu"))
    with pytest.raises(ValueError, match="count >= 1, got 0 and 0"):
        noise.draw_steps(0, 0)


@given(
    seed=st.integers(0, 2**63 - 1),
    first=st.integers(0, 2 * NOISE_BLOCK),
    n=st.integers(1, NOISE_BLOCK + 40),
    step=st.integers(0, 2**40),
    count=st.integers(1, 5),
    width=st.integers(1, 3),
    kind=st.sampled_from(["normal", "uniform"]),
)
def test_host_noise_of_several_steps_is_each_steps_draw(
    seed: int, first: int, n: int, step: int, count: int, width: int, kind: str
) -> None:
    """The steps drawn at once have each step's bits (and torch's, computed apart)."""
    host = _noise(seed, first, n, kind, 1, width)
    got = host.draw_steps(step, count)
    assert got.shape == (count, n, width)
    assert got.dtype == np.float32
    on_torch = TorchSlotNoise(host, torch.device("cpu")).draw_steps(step, count).numpy()
    assert np.array_equal(got, on_torch)
    for k in range(count):
        assert np.array_equal(got[k], host.draw(step + k))


def test_host_noise_of_no_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="count >= 1, got 0 and 0"):
        _noise(0, 0, 2, "uniform").draw_steps(0, 0)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "model-act"])
def test_row_policy_drawing_noise_ahead_acts_as_step_by_step(lean: bool) -> None:
    """A host policy draws many steps of noise at once (few rows): it acts as one that
    draws each step alone, for steps in any order (a restored loop goes back)."""
    obs_space = spaces.Box(-5.0, 5.0, (4,), np.float32)
    act_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    obs = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)

    def policy() -> RowPolicy:
        torch.manual_seed(0)
        model = build_model(ModelSpec("mlp", {"hidden_sizes": [16]}), obs_space, act_space)
        return RowPolicy(
            model,
            torch.device("cpu"),
            seed=5,
            first_slot=1,
            num_slots=2,
            rows_per_slot=1,
            action_space=act_space,
            lean=lean,
        )

    ahead, alone = policy(), policy()
    alone.host_ahead = 1
    assert ahead.host_ahead > 100
    for step in [0, 1, 2, 7, 3, 683, 682, 5000, 0]:
        got, want = ahead.act(obs, step), alone.act(obs, step)
        for a, b in [(got.actions, want.actions), (got.log_probs, want.log_probs)]:
            assert np.array_equal(a, b)
        part = slice(1, 2)
        got, want = ahead.act(obs[part], step, part), alone.act(obs[part], step, part)
        assert np.array_equal(got.actions, want.actions)


def test_the_normal_table_is_the_inverse_cdf_rounded_to_float32() -> None:
    # The committed table, recomputed: Phi^-1(1 - (h - 1/2) / 2**24) at 40 digits.
    import mpmath

    mpmath.mp.dps = 40
    two = mpmath.mpf(2)
    knots = [two**e + j * two ** (e - 7) for e in range(23) for j in range(128)]
    knots += [two**23, two**23 + 2**16]
    want = np.array(
        [float(mpmath.sqrt(2) * mpmath.erfinv(1 - (2 * h - 1) / two**24)) for h in knots]
    ).astype(np.float32)
    assert normal_table().tobytes() == want.tobytes()


def test_keyed_normals_are_standard_normals_with_the_same_bits_in_numpy_and_torch() -> None:
    # Every one of the 2**24 inputs: numpy and torch (on the CPU) agree bit for bit.
    k = np.arange(2**24, dtype=np.int64)
    z = keyed_normal(k)
    assert z.dtype == np.float32
    on_torch = keyed_normal(torch.from_numpy(k), torch.from_numpy(normal_table()))
    assert on_torch.dtype == torch.float32
    assert on_torch.numpy().tobytes() == z.tobytes()
    assert np.array_equal(z, -z[::-1])  # symmetric: k and 2**24 - 1 - k
    assert np.all(np.diff(z) >= 0)  # monotone
    assert abs(float(z.astype(np.float64).mean())) < 1e-9
    assert abs(float(z.astype(np.float64).var()) - 1.0) < 1e-5
    assert float(z.max()) == pytest.approx(5.42, abs=0.01)
    # Within 4e-6 of the exact inverse CDF at (k + 1/2) / 2**24, tails included.
    from statistics import NormalDist

    inv = NormalDist().inv_cdf
    picked = np.concatenate([np.arange(600), np.random.default_rng(0).integers(0, 2**24, 20_000)])
    exact = np.array([inv((int(i) + 0.5) / 2**24) for i in picked])
    assert np.abs(z[picked] - exact).max() < 4e-6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_keyed_normals_on_cuda_have_the_cpu_bits() -> None:
    k = np.arange(2**24, dtype=np.int64)
    cuda = torch.device("cuda")
    got = keyed_normal(torch.from_numpy(k).to(cuda), torch.from_numpy(normal_table()).to(cuda))
    assert got.cpu().numpy().tobytes() == keyed_normal(k).tobytes()


def test_a_checkpoint_of_the_earlier_normal_noise_restarts_the_envs_with_a_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Gaussian-head run checkpointed before the keyed normals (no ``normal_noise``
    entry) would resume its rollout with other noise: the learner resumes exactly, the
    rollout state is not restored, and a line says why. A run of today's noise resumes
    its rollout."""
    import hashlib
    import json

    import simkit
    from simkit import snapshot
    from simkit.clients.learners._checkpoint import load_checkpoint

    kw: dict[str, Any] = {
        "num_envs": 2, "num_steps": 16, "num_minibatches": 2, "update_epochs": 1,
        "servers": 0, "tensorboard": False,
    }  # fmt: skip
    run = simkit.train("simkit/Pendulum-v0", logdir=tmp_path / "old", max_rounds=1, **kw)
    ckpt = load_checkpoint(run.checkpoint)
    assert ckpt.state["normal_noise"] == 2
    capsys.readouterr()
    simkit.train(
        "simkit/Pendulum-v0", logdir=tmp_path / "old", resume=tmp_path / "old", max_rounds=1, **kw
    )
    assert "normal noise version" not in capsys.readouterr().err
    path = load_checkpoint(tmp_path / "old").path
    state = snapshot.loads((path / "state.msgpack").read_bytes())
    del state["normal_noise"]  # as simkit wrote it before
    data = snapshot.dumps(state)
    (path / "state.msgpack").write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["state.msgpack"] = {
        "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()
    }  # fmt: skip
    (path / "manifest.json").write_text(json.dumps(manifest))
    rest = simkit.train(
        "simkit/Pendulum-v0", logdir=tmp_path / "old", resume=tmp_path / "old", max_rounds=1, **kw
    )
    err = capsys.readouterr().err
    assert (
        "sampled its Gaussian actions from normal noise version 1 and this simkit draws "
        "version 2" in err
    )
    assert "the learner resumes exactly, the envs start afresh" in err
    assert rest.updates == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torch_noise_on_cuda_has_the_numpy_bits() -> None:
    cuda = torch.device("cuda")
    for seed, first, n, rows, width in [
        (0, 0, 1, 1, 1),
        (9, 1000, 3000, 2, 3),
        (2**62, 5, 70, 1, 4),
    ]:
        for kind in ("uniform", "normal"):
            host = _noise(seed, first, n, kind, rows, width)
            on_cuda = TorchSlotNoise(host, cuda)
            for step in (0, 1, 77, 2**40):
                assert np.array_equal(on_cuda.draw(step).cpu().numpy(), host.draw(step))


def _discrete_policy(device: torch.device, first: int, n: int) -> RowPolicy:
    obs_space = spaces.Box(-5.0, 5.0, (4,), np.float32)
    act_space = spaces.Discrete(3)
    torch.manual_seed(0)
    model = build_model(ModelSpec("mlp", {"hidden_sizes": [16]}), obs_space, act_space)
    return RowPolicy(
        model,
        device,
        seed=4,
        first_slot=first,
        num_slots=n,
        rows_per_slot=1,
        action_space=act_space,
        lean=False,
    )


def test_row_policy_with_device_noise_acts_as_with_host_noise() -> None:
    """The device-noise act path (run here on the CPU) samples the host path's actions,
    whole and part by part."""
    obs = np.random.default_rng(2).standard_normal((40, 4)).astype(np.float32)
    host = _discrete_policy(torch.device("cpu"), 3, 40)
    assert host.device_noise is None
    device = _discrete_policy(torch.device("cpu"), 3, 40)
    device.device_noise = TorchSlotNoise(device.noise, torch.device("cpu"))
    for step in (0, 5):
        want = host.act(obs, step)
        got = device.act(obs, step)
        assert np.array_equal(got.actions, want.actions)
        assert got.actions.dtype == np.int64
        assert np.array_equal(got.log_probs, want.log_probs)
        assert np.array_equal(got.values, want.values)
        part = device.act(obs[10:30], step, slice(10, 30))
        assert np.array_equal(part.actions, want.actions[10:30])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_row_policy_on_cuda_computes_its_noise_there() -> None:
    obs = np.random.default_rng(2).standard_normal((40, 4)).astype(np.float32)
    on_cuda = _discrete_policy(torch.device("cuda"), 3, 40)
    assert on_cuda.device_noise is not None
    host = _discrete_policy(torch.device("cpu"), 3, 40)
    for step in (0, 5):
        got, want = on_cuda.act(obs, step), host.act(obs, step)
        # Same noise; the forward's last bits may differ across devices.
        assert (got.actions == want.actions).mean() > 0.9
        assert np.array_equal(on_cuda.device_noise.draw(step).cpu().numpy(), host.noise.draw(step))


@pytest.mark.parametrize(
    "actions",
    [
        torch.tensor([0, 5, 2**40, 3]),
        torch.randn(4, 3, generator=torch.Generator().manual_seed(0)),
        torch.randn(4, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1)),
        torch.tensor([[1, 2], [0, 7], [3, 3], [9, 0]]),
    ],
    ids=["discrete", "box32", "box64-2d", "multidiscrete"],
)
def test_one_packed_copy_keeps_the_bits_of_three(actions: torch.Tensor) -> None:
    gen = torch.Generator().manual_seed(2)
    log_probs = torch.randn(4, generator=gen) * 1e30
    log_probs[1] = float("-inf")
    values = torch.randn(4, generator=gen)
    values[2] = float("nan")
    got = host_output(ActOutput(actions, log_probs, values))
    want = (actions.numpy(), log_probs.numpy(), values.numpy())
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        assert g.shape == w.shape
        assert np.array_equal(g, w, equal_nan=True)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    first=st.integers(0, 40 * NOISE_BLOCK),
    n=st.integers(1, 9 * NOISE_BLOCK),
    step=st.one_of(st.integers(0, 100), st.integers(0, 2**62)),
)
def test_device_noise_block_states_are_numpys_advanced_states(
    seed: int, first: int, n: int, step: int
) -> None:
    """TorchSlotNoise jumps each block's state ahead with precomputed affine maps of the
    LCG (one numpy advance per step, not one per block): numpy's states, bit for bit."""
    host = _noise(seed, first, n, "uniform")
    on_cpu = TorchSlotNoise(host, torch.device("cpu"))
    bits = np.random.PCG64()
    want = []
    for block, _, _ in host._blocks:
        bits.state = host._start
        bits.advance((step << 64) | (block << 32))
        want.append(int(bits.state["state"]["state"]))
    assert on_cpu._states(step) == want


def test_device_noise_advances_numpy_once_per_step() -> None:
    """The per-step cost does not grow with numpy advances per block (a block is 1024
    slots: a 64k-slot session has 64)."""
    host = _noise(3, 0, 9 * NOISE_BLOCK, "uniform")
    on_cpu = TorchSlotNoise(host, torch.device("cpu"))
    want = on_cpu._states(5)
    calls: list[int] = []

    class Counting:
        def __init__(self, bits: np.random.PCG64) -> None:
            self.bits = bits

        @property
        def state(self) -> dict[str, Any]:
            return self.bits.state

        @state.setter
        def state(self, value: dict[str, Any]) -> None:
            self.bits.state = value

        def advance(self, delta: int) -> None:
            calls.append(delta)
            self.bits.advance(delta)

    host._bits = Counting(host._bits)  # type: ignore[assignment]
    assert on_cpu._states(5) == want
    assert len(calls) <= 1
