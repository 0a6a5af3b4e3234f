"""Every input bounded, every error one line (issue 36): each hostile command line of the
attack drills is refused with one line on stderr and exit 2 before anything is
allocated or started (the hypothesis suites over the whole grammar are
tests/test_cli_fuzz.py and tests/test_recording_fuzz.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simkit.cli import main

DEEP = "x=" + "[" * 1000 + "]" * 1000


def _one_line(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    """The single stderr line of a refusal, checked to name ``words``."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for word in words:
        assert word in err[0], err[0]
    return err[0]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--metrics-port", "70000"], "--metrics-port must be a port in [0, 65535], got 70000"),
        (["--heartbeat-timeout", "nan"], "--heartbeat-timeout must be in (0, 604800], got nan"),
        (["--heartbeat-timeout", "-1"], "--heartbeat-timeout must be in (0, 604800], got -1"),
        (["--heartbeat-timeout", "inf"], "--heartbeat-timeout must be in (0, 604800], got inf"),
        (["--max-memory", "1"], "--max-memory must be in [16M, 1024T], got 1"),
        (["--max-sessions", "0"], "--max-sessions must be in [1, 65536], got 0"),
        (["--max-sessions-per-peer", "0"], "--max-sessions-per-peer must be in [1, 65536]"),
        (["--busy-poll-us", str(10**15)], "--busy-poll-us must be in [0, 1000000]"),
        (["--num-threads", str(10**6)], "--num-threads must be in [1, "),
        (["--torch-threads", str(10**6), "--policy"], "--torch-threads must be in [1, "),
        (["--fragment-length", "0"], "--fragment-length must be in [1, "),
        (["--num-envs", str(10**12)], "more than the"),
        (["--env-kwarg", DEEP], "--env-kwarg x: JSON nested 1000 levels deep, more than 32"),
    ],
)
def test_serve_refuses_out_of_bounds_flags_in_one_line(
    flags: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "simkit/CartPole-v0", "--bind", f"ipc://{tmp_path}/s", *flags]
    assert main(argv) == 2
    assert _one_line(capsys, "simkit serve: ", named)


def test_an_env_id_too_long_for_a_file_name_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An env id of 120,000 characters: ``OSError: File name too long`` from the default
    log directory named after it; now refused by its length before anything."""
    monkeypatch.chdir(tmp_path)
    env_id = "a" * 120_000
    for argv in (
        ["train", env_id, "--servers", "0"],
        ["serve", env_id, "--bind", f"ipc://{tmp_path}/s"],
        ["record", env_id, "--episodes", "1", "--out", str(tmp_path / "rec")],
        ["check", env_id],
    ):
        assert main(argv) == 2
        line = _one_line(capsys, "must be at most 256 characters, got 120,000")
        assert len(line) < 200
    assert list(tmp_path.iterdir()) == []


TRAIN = ["train", "simkit/CartPole-v0", "--servers", "0", "--no-progress"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--env-kwarg", "x={not json"], "cannot be made with it: "),
        (["--env-kwarg", "max_episode_steps=NaN"], "max_episode_steps must be an int or None"),
        (["--env-kwarg", DEEP], "--env-kwarg x: JSON nested 1000 levels deep, more than 32"),
        (["--num-envs", str(10**12)], "--num-envs 1,000,000,000,000 x --num-steps"),
        (["--num-steps", str(10**12)], "--num-steps 1,000,000,000,000 ("),
        (["--torch-threads", str(10**6)], "--torch-threads must be in [1, "),
        (["--env-threads", str(10**6)], "--env-threads must be in [1, "),
        (["--hidden", str(10**9)], "a network of layer widths [4, 1,000,000,000]"),
        (["--servers", str(10**6)], "--servers must be in [0, "),
        (["--learning-rate", "inf"], "--learning-rate must be > 0, got inf"),
        (["--server-timeout", "inf"], "--server-timeout must be in (0, 604800], got inf"),
        (["--print-every", "nan"], "--print-every must be in (0, "),
        (["--ray", "--servers", "1", "--server-cpus", "0"], "--server-cpus and --server-gpus"),
        (["--algo", "sac", "--buffer-size", str(10**12)], "--buffer-size 1,000,000,000,000 ("),
        (["--algo", "sac", "--batch-size", str(10**12)], "--batch-size 1,000,000,000,000 and"),
    ],
)
def test_train_refuses_out_of_bounds_flags_in_one_line_leaving_no_logdir(
    flags: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: TypeError, RecursionError, MemoryError and numpy's 14.6 TiB tracebacks, a
    segfault (a million torch threads), gigabytes of growth (--hidden, --servers), and a
    ``runs/<id>/LOCK`` left behind by a run refused after its log directory was made."""
    env = ["simkit/Pendulum-v0"] if "sac" in flags else []
    argv = [*TRAIN, "--logdir", str(tmp_path / "runs" / "a"), *flags]
    if env:
        argv[1] = env[0]
        argv.remove("--servers")
        argv.remove("0")
    assert main(argv) == 2
    line = _one_line(capsys, "simkit train: ", named)
    if "needs" in line:
        assert "of memory available" in line
    assert list(tmp_path.iterdir()) == []


def test_a_run_refused_after_making_its_logdir_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The network is refused once the run has made and locked its log directory (the
    model is built inside the run): the folders it made go again, a folder that was there
    keeps only what it held."""
    logdir = tmp_path / "a" / "b"
    assert main([*TRAIN, "--logdir", str(logdir), "--hidden", str(10**9)]) == 2
    _one_line(capsys, "a network of layer widths")
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert main([*TRAIN, "--logdir", str(kept), "--hidden", str(10**9)]) == 2
    _one_line(capsys, "a network of layer widths")
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]


def test_a_logdir_whose_lock_is_a_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``IsADirectoryError`` traceback."""
    (tmp_path / "LOCK").mkdir()
    assert main([*TRAIN, "--logdir", str(tmp_path), "--total-steps", "64"]) == 2
    _one_line(capsys, f"--logdir {tmp_path}: cannot lock {tmp_path / 'LOCK'}: Is a directory")
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "LOCK").mkdir()
    argv = ["record", "simkit/CartPole-v0", "--episodes", "1", "--out", str(tmp_path / "rec")]
    assert main(argv) == 1
    _one_line(capsys, f"cannot write {tmp_path / 'rec' / 'LOCK'}: Is a directory (EISDIR)")


def _killed_before_first_checkpoint(logdir: Path) -> None:
    """A real run, SIGKILLed once it wrote progress but before any checkpoint."""
    import os
    import signal
    import subprocess
    import sys
    import time

    argv = [*TRAIN, "--logdir", str(logdir), "--total-steps", "0", "--num-steps", "32"]
    argv += ["--num-minibatches", "4", "--checkpoint-every", "0", "--checkpoint-minutes", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "simkit", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (logdir / "progress.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (logdir / "progress.jsonl").exists()
    assert not (logdir / "checkpoints" / "latest").exists()


def test_a_run_killed_before_its_first_checkpoint_is_reused_and_resume_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: refused both ways (--resume: 'not a checkpoint'; a fresh run: 'use
    --resume'). Now a fresh run reuses the folder, saying so, and --resume says that
    there is nothing to resume and how to start the run again there (not from scratch
    under --resume: the run's settings died with it)."""
    from simkit.clients.learners._checkpoint import load_checkpoint

    logdir = tmp_path / "run"
    _killed_before_first_checkpoint(logdir)
    short = ["--total-steps", "64", "--num-steps", "32", "--num-minibatches", "4"]
    assert main([*TRAIN, "--resume", str(logdir), *short]) == 2
    line = _one_line(capsys, f"simkit train: {logdir}")
    assert line.endswith(
        "; nothing to resume: start the run again (its command without --resume, with "
        f"--logdir {logdir}: the folder is reused)"
    )
    assert main([*TRAIN, "--logdir", str(logdir), *short]) == 0
    err = capsys.readouterr().err
    assert (
        f"simkit train: --logdir {logdir} held a run that stopped before its first checkpoint "
        "(nothing to resume); starting a new run there"
    ) in err
    assert int(load_checkpoint(logdir).state["global_step"]) == 64
    assert len((logdir / "progress.jsonl").read_text().splitlines()) == 2


def test_eval_names_the_tensor_file_of_a_resigned_wrong_shape_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``simkit eval run/checkpoints`` named the checkpoints folder (``--resume``
    named the file); now every way to the checkpoint names ``update-N/model.safetensors``."""
    import hashlib
    import json

    from safetensors.torch import load, save

    from simkit.clients.learners._checkpoint import resolve_checkpoint

    logdir = tmp_path / "run"
    short = ["--total-steps", "64", "--num-steps", "32", "--num-minibatches", "4"]
    assert main([*TRAIN, "--logdir", str(logdir), *short]) == 0
    ckpt = resolve_checkpoint(logdir)
    file = ckpt / "model.safetensors"
    tensors = load(file.read_bytes())
    name = next(k for k, v in tensors.items() if v.ndim == 2)
    tensors[name] = tensors[name][:, :1].contiguous()
    data = save(tensors)
    file.write_bytes(data)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["model.safetensors"] = {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    for given in (logdir / "checkpoints", ckpt):
        assert main(["eval", str(given), "--episodes", "1"]) == 2
        _one_line(capsys, f"simkit eval: {file}: tensor {name!r} is ")
    assert main([*TRAIN, "--resume", str(logdir), "--total-steps", "128"]) == 2
    _one_line(capsys, f"simkit train: {file}: tensor {name!r} is ")


def test_a_class_that_is_not_an_env_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the CLI fuzzer: ``record json:JSONDecoder`` was an AttributeError deep
    in the vector (a class, but no env)."""
    for argv in (
        ["check", "json:JSONDecoder"],
        ["record", "json:JSONDecoder", "--episodes", "1", "--out", str(tmp_path / "x")],
    ):
        assert main(argv) == 2
        _one_line(capsys, "'json:JSONDecoder' is not an env class: json.JSONDecoder has no reset()")


def test_what_the_fuzzers_deep_runs_found_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by ``HYPOTHESIS_PROFILE=deep`` runs of tests/test_cli_fuzz.py: a PPO policy of
    another env given to ``record --policy`` (a RuntimeError from load_state_dict), and
    ``--render`` of an env that cannot render (gymnasium's NotImplementedError, or its
    DependencyNotInstalled for pygame): one line each."""
    import importlib.util

    run = tmp_path / "run"
    short = ["--total-steps", "64", "--num-steps", "32", "--num-minibatches", "4"]
    assert main([*TRAIN, "--logdir", str(run), *short]) == 0
    policy = run / "policy.safetensors"
    out = tmp_path / "rec"
    argv = ["record", "simkit/Pendulum-v0", "--episodes", "1", "--out", str(out)]
    capsys.readouterr()
    assert main([*argv, "--policy", str(policy)]) == 2
    _one_line(
        capsys,
        f"simkit record: --policy {policy}: a policy of simkit/CartPole-v0, which does not "
        "fit simkit/Pendulum-v0: ",
        "tensor names differ",
    )
    assert main(["eval", str(policy), "--episodes", "1", "--render", str(tmp_path / "v.gif")]) == 1
    _one_line(capsys, "simkit eval: env 'simkit/CartPole-v0' cannot render RGB frames")
    if importlib.util.find_spec("pygame") is None:
        gym = tmp_path / "gym"
        assert main(["record", "gym:CartPole-v1", "--episodes", "1", "--out", str(gym)]) == 0
        capsys.readouterr()
        assert main(["replay", str(gym), "--render", str(tmp_path / "v.gif")]) == 1
        _one_line(capsys, "simkit replay: gym:CartPole-v1 cannot render: pygame is not installed")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["check", "simkit/CartPole-v0", "--steps", str(10**8)], "--steps must be in [1, 1000000]"),
        (
            ["check", "simkit/BatchCartPole-v0", "--num-envs", str(10**12), "--steps", "2"],
            "1,000,000,000,000 env(s) x --steps 2 (the trajectories the kit compares) needs",
        ),
        (["demo", "--steps", str(10**9), "--no-remote"], "--steps must be in [1, 10000000]"),
        (["demo", "--check-steps", "0", "--no-remote"], "--check-steps must be in [1, 1000000]"),
    ],
)
def test_check_and_demo_bound_the_kits_trajectories(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the CLI fuzzer's deep runs: ``check --steps 10**8`` grew by gigabytes
    (the kit keeps its trajectories), a batch ``check --num-envs 10**12`` failed nine
    checks with MemoryError."""
    assert main(argv) == 2
    _one_line(capsys, f"simkit {argv[0]}: ", named)


def test_a_hyperparameter_beyond_float32_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the CLI fuzzer's deep run: ``--clip-coef 1e308`` (finite, > 0) overflowed
    when torch made it a float32: a RuntimeError traceback."""
    assert main([*TRAIN, "--logdir", str(tmp_path / "r"), "--clip-coef", "1e308"]) == 2
    _one_line(capsys, "simkit train: --clip-coef must be at most 3.403e+38 (a float32), got 1e+308")
    assert not (tmp_path / "r").exists()
