"""The benchmark scripts' own file handling (their measurements run in bench/, not here)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_sb3_curve_goes_to_a_new_folder_and_a_rerun_starts_it_afresh(tmp_path: Path) -> None:
    bench_sac = load_script("bench_sac")
    path = tmp_path / "runs" / "sb3-hc-1" / "progress.jsonl"
    curve = bench_sac.CurveLog(path)
    curve.write(1000, 2.5, -300.0)
    curve.write(2000, 5.0, -250.0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [
        {"global_step": 1000, "elapsed_s": 2.5, "mean_return": -300.0},
        {"global_step": 2000, "elapsed_s": 5.0, "mean_return": -250.0},
    ]
    bench_sac.CurveLog(path).write(1000, 3.0, -310.0)
    assert len(path.read_text().splitlines()) == 1


def test_the_sac_step_profile_counts_only_matrix_products_as_products() -> None:
    import torch

    bench_sac_step = load_script("bench_sac_step")
    a = torch.ones(64, 64)

    def products(k: int) -> float:
        for _ in range(k):
            torch.mm(a, a)
            torch.bmm(a[None], a[None])
        return 0.0

    def elementwise(k: int) -> float:
        for _ in range(k):
            torch.relu(a + 1.0)
        return 0.0

    assert bench_sac_step.profile_split(products, 4)[0] > 0.0
    no_products, rest = bench_sac_step.profile_split(elementwise, 4)
    assert no_products == 0.0
    assert rest > 0.0


def test_the_sac_bench_measures_the_default_placement_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its first row runs ``run_sac`` as ``simkit train --algo sac`` does without
    ``--servers`` (servers=None), whatever the default is; the second the other placement."""
    bench_sac = load_script("bench_sac")
    asked: list[int | None] = []

    def fake_run_simkit(servers: int | None, *_: object) -> tuple[float, float]:
        asked.append(servers)
        return 1.0, 1.0

    monkeypatch.setattr(bench_sac, "run_simkit", fake_run_simkit)
    monkeypatch.setattr(bench_sac, "run_sb3", lambda *_: (1.0, 1.0))
    bench_sac.main(["--rounds", "1"])
    from simkit.clients.learners._train_sac import SAC_DEFAULT_SERVERS

    assert asked == [None, 1 if SAC_DEFAULT_SERVERS == 0 else 0]


@pytest.mark.parametrize(
    "script", ["device_check.sh", "fetch_device_wheels.sh", "device_mjwarp.sh", "_device_common.sh"]
)
def test_the_device_scripts_parse(script: str) -> None:
    done = subprocess.run(["bash", "-n", str(ROOT / "bench" / script)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.parametrize("script", ["device_check.sh", "device_mjwarp.sh"])
def test_the_device_checks_share_their_helpers(script: str) -> None:
    """Both checks source bench/_device_common.sh and define none of its helpers again
    (copies of them had drifted apart)."""
    text = (ROOT / "bench" / script).read_text()
    assert "source bench/_device_common.sh" in text
    for name in ("device_mode", "say", "device_header", "step", "run", "install_wheels"):
        assert re.search(rf"^\s*{name}\(\)", text, re.MULTILINE) is None, name


def test_the_device_check_refuses_an_unknown_option(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_check.sh"), "--gpu"],
        capture_output=True,
        env={**os.environ, "OUT": str(tmp_path)},
    )
    assert done.returncode == 2
    assert done.stderr.decode() == "usage: bench/device_check.sh [--cpu], got '--gpu'\n"
    assert not list(tmp_path.iterdir())


def test_the_mjwarp_device_check_refuses_an_unknown_option(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_mjwarp.sh"), "--gpu"],
        capture_output=True,
        env={**os.environ, "OUT": str(tmp_path)},
    )
    assert done.returncode == 2
    assert done.stderr.decode() == "usage: bench/device_mjwarp.sh [--cpu], got '--gpu'\n"
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.mjwarp
@pytest.mark.gpu_prep
@pytest.mark.skipif(
    importlib.util.find_spec("mujoco_warp") is None,
    reason="mujoco_warp is not installed (pip install 'simkit[gpu]')",
)
def test_the_mjwarp_device_check_dry_runs_on_the_cpu(tmp_path: Path) -> None:
    """``--cpu``: the MJWarp CUDA tests collected and a tiny MJWarp bench on Warp's CPU
    backend, with the determinism check, in one markdown report."""
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_mjwarp.sh"), "--cpu"],
        capture_output=True,
        env={**os.environ, "OUT": str(tmp_path)},
        timeout=240,
    )
    assert done.returncode == 0, done.stderr.decode()
    report = (tmp_path / "device_mjwarp.md").read_text()
    assert "# simkit MuJoCo Warp check (cpu mode)" in report
    assert "test_agrees_with_the_c_engine_over_1000_steps[cuda]" in report
    assert "| BatchCheetah mjwarp (step_batch) | " in report
    assert "16 worlds x 10 steps: bit-identical" in report


@pytest.mark.gpu_prep
def test_the_device_check_dry_runs_on_the_cpu(tmp_path: Path) -> None:
    """``--cpu``: the CUDA tests collected, the device loop's main job (tiny), gpu_check's
    quick PPO and whole-loop rows and one tiny training run per learner, all in one
    markdown report."""
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_check.sh"), "--cpu"],
        capture_output=True,
        env={**os.environ, "OUT": str(tmp_path)},
        timeout=240,
    )
    assert done.returncode == 0, done.stderr.decode()
    report = (tmp_path / "device_check.md").read_text()
    assert "# simkit device check (cpu mode)" in report
    assert "test_torch_noise_on_cuda_has_the_numpy_bits" in report
    assert "| PPO.update | cpu | 2,048 |" in report
    assert "| device loop (LocalSource device_loop + PPO.update) | cpu | 4,096 |" in report
    assert "| 1 | " in report  # the main job's seed row (it reached the dry run's target)
    rows = [line for line in report.splitlines() if line.startswith("| ") and "| cpu |" in line]
    assert [r.split(" | ")[0] for r in rows[3:]] == [
        "| PPO simkit/Cheetah-v0, 64 envs x 64 steps, 4096 steps",
        "| SAC gym:Pendulum-v1, 300 steps (200 random)",
    ]
    assert "| PPO minibatch step, 64x64 | 64 | " in report  # --device auto's probe sweep
    assert report.count("`: exit ") == 5  # the CUDA tests, the main job, the probe, two trainings
    assert report.count("`: exit 0, ") == 5


def test_the_noise_draw_bench_times_the_draw_it_replaced_on_the_same_stream(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from simkit._noise import SlotNoise

    bench = load_script("bench_noise_draw")
    noise = SlotNoise(3, first_slot=100, num_slots=40, rows_per_slot=1, width=2, kind="normal")
    old = bench._ziggurat(noise)(5)
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(3, spawn_key=(0x706F6C,))))
    gen.bit_generator.advance(5 << 64)
    want = gen.standard_normal((140, 2), dtype=np.float32)[100:]
    assert old.tobytes() == want.tobytes()  # numpy's normals of the keyed stream positions
    monkeypatch.setattr(sys, "argv", ["bench_noise_draw.py", "--rounds", "1"])
    bench.main()
    out = capsys.readouterr().out
    assert re.search(r"\| 4,096 x 6 \| [\d.]+ \| [\d.]+ \| [\d.]+x \| [\d.]+ \|", out), out
