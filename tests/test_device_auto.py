"""``--device auto``: the update step timed on each candidate device, the faster kept
(:mod:`simkit.clients.learners._device_pick`); the decision with injected candidates and
timings, the probe leaving the run's model and generators alone, the run reporting its
pick; the real CUDA probe where there is a GPU."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import simkit
from simkit.cli import main
from simkit.clients.learners import _device_pick
from simkit.clients.learners._args import PPOArgs, SACArgs
from simkit.clients.learners._checkpoint import load_checkpoint
from simkit.clients.learners._device_pick import DevicePick, pick_device
from simkit.clients.learners._train_sac import build_actor
from simkit.clients.learners.ppo import build_model, ppo_probe
from simkit.clients.learners.sac import sac_probe

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check runs it)"
)
RUN = [
    *("simkit/CartPole-v0", "--servers", "0", "--num-envs", "2", "--num-steps", "32"),
    *("--num-minibatches", "2", "--update-epochs", "1", "--no-progress", "--seed", "5"),
    *("--total-steps", "128"),
]
SAC_SMALL = SACArgs(
    env_id="simkit/Pendulum-v0",
    seed=7,
    total_steps=96,
    num_envs=2,
    num_steps=4,
    buffer_size=1000,
    batch_size=32,
    learning_starts=64,
    hidden=(32, 32),
)


def _timed(figures: dict[str, float]) -> Any:
    """A prober whose probe 'times' each device as ``figures`` say (seconds)."""

    def prober() -> tuple[Any, int]:
        return (lambda device: figures[str(device)]), 2048

    return prober


def _never() -> tuple[Any, int]:
    raise AssertionError("probed where nothing is to be chosen")


@pytest.fixture
def two_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with 'CUDA' (a name only: the probe is injected too)."""
    monkeypatch.setattr(_device_pick, "candidates", lambda: [CPU, CUDA])


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two candidates that are both the CPU: the real probe runs twice, the CPU is picked."""
    monkeypatch.setattr(_device_pick, "candidates", lambda: [CPU, CPU])


@pytest.mark.usefixtures("two_devices")
def test_auto_picks_the_device_whose_update_step_is_faster() -> None:
    fast = pick_device("auto", _timed({"cpu": 0.0042, "cuda": 0.0019}))
    assert fast.device == CUDA
    assert fast.describe() == "cuda (update 1.9 ms vs cpu 4.2 ms at 2,048 samples)"
    slow = pick_device("auto", _timed({"cpu": 0.0042, "cuda": 0.0084}))
    assert slow.device == CPU
    assert slow.describe() == "cpu (update 4.2 ms vs cuda 8.4 ms at 2,048 samples)"
    assert pick_device("auto", _timed({"cpu": 0.003, "cuda": 0.003})).device == CPU  # a tie


@pytest.mark.usefixtures("two_devices")
def test_a_device_whose_probe_fails_is_not_picked_and_the_reason_is_said() -> None:
    def prober() -> tuple[Any, int]:
        def probe(device: torch.device) -> float:
            if device.type == "cuda":
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
            return 0.5

        return probe, 64

    pick = pick_device("auto", prober)
    assert pick.device == CPU
    assert pick.describe() == (
        "cpu (update 500.0 ms vs cuda failed: CUDA out of memory. Tried to allocate "
        "2.00 GiB at 64 samples)"
    )


def test_without_cuda_auto_is_the_cpu_with_no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_device_pick, "candidates", lambda: [CPU])
    pick = pick_device("auto", _never)
    assert pick == DevicePick(CPU, "auto")
    assert pick.describe() == "cpu (no CUDA device: nothing to probe)"


@pytest.mark.usefixtures("two_devices")
def test_an_explicit_device_is_taken_as_it_is_with_no_probe() -> None:
    pick = pick_device("cpu", _never)
    assert pick.device == CPU
    assert pick.describe() == "cpu"
    with pytest.raises(ValueError, match="--device must be cpu, cuda\\[:k\\] or auto, got 'tpu'"):
        pick_device("tpu", _never)


@pytest.mark.usefixtures("two_cpus")
@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_the_probe_leaves_the_model_and_every_generator_as_they_were(algo: str) -> None:
    if algo == "ppo":
        args = PPOArgs(env_id="simkit/CartPole-v0", num_envs=2, num_steps=32, num_minibatches=2)
        model = build_model(args)
        model.update_obs_stats(torch.randn(8, *model.obs_shape))
        prober: Any = lambda: ppo_probe(args, model, 2)  # noqa: E731
        samples = 32
    else:
        model = build_actor(SAC_SMALL)
        prober = lambda: sac_probe(SAC_SMALL, model)  # noqa: E731
        samples = 32
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch_state = torch.get_rng_state()
    pick = pick_device("auto", prober)
    assert pick.device == CPU
    assert pick.samples == samples
    assert 0 < pick.seconds["cpu"] < 60
    assert torch.equal(torch.get_rng_state(), torch_state)
    state = model.state_dict()
    for k, v in before.items():
        assert torch.equal(state[k], v), k
        assert state[k].device == CPU, k
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.usefixtures("two_cpus")
def test_an_auto_run_trains_the_bits_of_its_pick_and_says_why_resumed_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *RUN, "--logdir", str(tmp_path / "cpu"), "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["train", *RUN, "--logdir", str(tmp_path / "auto"), "--device", "auto"]) == 0
    out, err = capsys.readouterr()
    line = r"cpu \(update \d+\.\d ms at 32 samples\)"
    assert re.search(rf"^simkit train: --device auto: {line}$", err, re.M), err
    assert re.search(rf"^  device: {line}$", out, re.M), out
    cpu = load_checkpoint(tmp_path / "cpu").model
    auto = load_checkpoint(tmp_path / "auto").model
    for k in cpu:
        assert torch.equal(cpu[k], auto[k]), k
    assert main(["train", *RUN, "--resume", str(tmp_path / "auto"), "--total-steps", "192"]) == 0
    out, err = capsys.readouterr()
    assert re.search(rf"^simkit train: --device auto: {line}$", err, re.M), err  # probed again


def test_a_cpu_machine_runs_auto_as_the_cpu_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: auto probes it")
    assert main(["train", *RUN, "--logdir", str(tmp_path), "--device", "auto"]) == 0
    out, err = capsys.readouterr()
    assert "simkit train: --device auto: cpu (no CUDA device: nothing to probe)" in err
    assert "  device: cpu (no CUDA device: nothing to probe)" in out
    capsys.readouterr()
    assert main(["train", *RUN, "--logdir", str(tmp_path / "cpu")]) == 0
    assert "  device: cpu\n" in capsys.readouterr().out


@pytest.mark.usefixtures("two_cpus")
def test_an_auto_sac_run_trains_the_bits_of_the_cpu(tmp_path: Path) -> None:
    runs = {
        device: simkit.train(
            SACArgs(**{**SAC_SMALL.to_plain(), "device": device}),
            logdir=tmp_path / device,
            servers=0,
            tensorboard=False,
        )
        for device in ("cpu", "auto")
    }
    assert runs["auto"].device.startswith("cpu (update ")
    assert runs["cpu"].device == "cpu"
    cpu, auto = (load_checkpoint(tmp_path / d).model for d in ("cpu", "auto"))
    for k in cpu:
        assert torch.equal(cpu[k], auto[k]), k


@needs_cuda
def test_the_real_probe_times_cpu_and_cuda_and_keeps_the_faster() -> None:
    args = PPOArgs(env_id="simkit/CartPole-v0", num_envs=8, num_steps=128, num_minibatches=4)
    model = build_model(args)
    pick = pick_device("auto", lambda: ppo_probe(args, model, 8))
    assert set(pick.seconds) == {"cpu", "cuda"}, pick
    assert pick.device.type == min(pick.seconds, key=lambda d: pick.seconds[d])
    actor = build_actor(SAC_SMALL)
    pick = pick_device("auto", lambda: sac_probe(SAC_SMALL, actor))
    assert set(pick.seconds) == {"cpu", "cuda"}, pick
    assert next(actor.parameters()).device == CPU


@needs_cuda
def test_an_auto_run_on_cuda_has_the_bits_of_the_explicit_device_it_picked(
    tmp_path: Path,
) -> None:
    tiny = {"env_id": "simkit/CartPole-v0", "num_envs": 2, "num_steps": 32, "seed": 3}
    auto = simkit.train(
        PPOArgs(**tiny, device="auto"), logdir=tmp_path / "auto", max_rounds=2, servers=0
    )
    picked = auto.device.split(" ")[0]
    explicit = simkit.train(
        PPOArgs(**tiny, device=picked), logdir=tmp_path / "explicit", max_rounds=2, servers=0
    )
    assert auto.checkpoint is not None
    assert explicit.checkpoint is not None
    a, b = load_checkpoint(auto.checkpoint).model, load_checkpoint(explicit.checkpoint).model
    for k in a:
        assert torch.equal(a[k], b[k]), k
