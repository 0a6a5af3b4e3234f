"""Checkpoints that never lose a run: SAC's first checkpoint and cadence, resume taking
the algorithm from the checkpoint, progress.jsonl after a resume, full disks and
read-only folders (train, record, --logdir), crafted checkpoints refused in one line."""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import json
import os
import re
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zstandard
from safetensors.numpy import save as st_save

import simkit
from simkit import snapshot
from simkit.cli import main
from simkit.clients.learners._args import PPOArgs, SACArgs
from simkit.clients.learners._checkpoint import load_checkpoint, save_checkpoint
from simkit.clients.learners._replay import REPLAY_FORMAT, ReplayBuffer
from simkit.clients.learners.sac import SAC, CheckpointCadence
from simkit.errors import InvalidCheckpoint, WriteFailed

ENV = "simkit/Pendulum-v0"
SMALL = SACArgs(
    env_id=ENV,
    seed=7,
    total_steps=360,
    num_envs=2,
    num_steps=4,
    buffer_size=1000,
    batch_size=32,
    learning_starts=64,
    hidden=(32, 32),
)
SAC_CLI = [
    *("train", ENV, "--algo", "sac", "--servers", "0", "--total-steps", "200"),
    *("--learning-starts", "50", "--batch-size", "16", "--hidden", "16", "16"),
    *("--buffer-size", "500", "--no-progress"),
]
PPO_CLI = [
    *("train", "simkit/CartPole-v0", "--servers", "0", "--num-envs", "4", "--num-steps", "64"),
    *("--num-minibatches", "2", "--update-epochs", "1", "--no-progress"),
]


def _sac(tmp: Path, args: SACArgs = SMALL, **kw: Any) -> Any:
    kw.setdefault("servers", 0)
    kw.setdefault("tensorboard", False)
    return simkit.train(args, logdir=tmp, **kw)


def _crash_on_call(monkeypatch: pytest.MonkeyPatch, cls: Any, name: str, call: int) -> None:
    """``cls.name`` raises RuntimeError("crash") on its ``call``-th call (a killed run)."""
    original = getattr(cls, name)
    calls = [0]

    def crashing(self: Any, *args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == call:
            raise RuntimeError("crash")
        return original(self, *args, **kw)

    monkeypatch.setattr(cls, name, crashing)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _hidden(directory: Path) -> list[str]:
    """Temporary leftovers anywhere under ``directory``."""
    return [str(p) for p in directory.rglob("*") if p.name.startswith(".") or "tmp" in p.name]


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def _resign(checkpoint: Path, name: str, data: bytes) -> None:
    """Replaces file ``name`` of ``checkpoint`` and updates the manifest to match (what
    someone crafting a checkpoint does: the hashes are no signature)."""
    (checkpoint / name).write_bytes(data)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def enospc_on_fsync(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A full disk as a flush finds it: ``os.fsync`` fails with ENOSPC once the list it
    returns holds a 1 (so a test picks the moment)."""
    armed: list[int] = []
    real = os.fsync

    def fsync(fd: Any) -> None:
        if armed:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return armed


def read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Makes ``folder`` (and everything under it) refuse writes with EROFS, as a
    read-only mount does (chmod does not stop root, who runs these tests)."""
    prefix = os.path.abspath(folder)

    def inside(path: Any) -> bool:
        try:
            p = os.path.abspath(os.fspath(path))
        except TypeError:
            return False  # a file descriptor
        return p == prefix or p.startswith(prefix + os.sep)

    def refuse(path: Any) -> OSError:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

    real_open, real_os_open = builtins.open, os.open
    real_mkdir, real_replace = os.mkdir, os.replace

    def fake_open(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        if inside(file) and any(c in mode for c in "wax+"):
            raise refuse(file)
        return real_open(file, mode, *args, **kw)

    def fake_os_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
        if inside(path) and flags & writes:
            raise refuse(path)
        return real_os_open(path, flags, *args, **kw)

    def fake_mkdir(path: Any, *args: Any, **kw: Any) -> None:
        if inside(path):
            if os.path.isdir(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(path))
            raise refuse(path)
        real_mkdir(path, *args, **kw)

    def fake_replace(src: Any, dst: Any, **kw: Any) -> None:
        if inside(dst):
            raise refuse(dst)
        real_replace(src, dst, **kw)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr(os, "replace", fake_replace)


# --------------------------------------------------------------- item 8: cadence


def test_a_sac_run_killed_after_learning_starts_resumes_from_its_first_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default cadence (100k steps, minutes apart) a run killed before its
    first interval kept nothing; now it checkpoints once learning starts, and the resumed
    run ends with the uninterrupted run's bits."""
    _sac(tmp_path / "straight")
    _crash_on_call(monkeypatch, SAC, "run", 5)
    with pytest.raises(RuntimeError, match="crash"):
        _sac(tmp_path / "killed")
    monkeypatch.undo()
    ckpt = load_checkpoint(tmp_path / "killed")
    assert ckpt.state["counters"]["learning_step"] == SMALL.learning_starts
    _sac(tmp_path / "killed", resume=tmp_path / "killed")
    _same(load_checkpoint(tmp_path / "straight").model, load_checkpoint(tmp_path / "killed").model)


def test_the_cadence_bounds_the_lost_time_by_half_the_run_and_the_minutes() -> None:
    cad = CheckpointCadence(steps=0, minutes=5.0, now=0.0, step=0, learning=False)
    assert not cad.due(now=3.0, step=100, learning=False)
    assert cad.due(now=4.0, step=120, learning=True)  # learning just started
    cad.written(now=4.0, step=120, learning=True, took_s=0.1)
    # then intervals of the run's age at the last checkpoint (>= 30 s), up to 5 minutes
    assert not cad.due(now=33.0, step=500, learning=True)
    assert cad.due(now=34.0, step=510, learning=True)
    cad.written(now=34.0, step=510, learning=True, took_s=0.1)
    assert not cad.due(now=67.0, step=900, learning=True)
    assert cad.due(now=68.0, step=910, learning=True)
    cad.written(now=1000.0, step=9000, learning=True, took_s=0.1)
    assert not cad.due(now=1299.0, step=9900, learning=True)
    assert cad.due(now=1300.0, step=9900, learning=True)  # the 5 minutes
    # a checkpoint that takes long to write is written less often (<= 5% of the time)
    slow = CheckpointCadence(steps=0, minutes=5.0, now=0.0, step=0, learning=True)
    slow.written(now=40.0, step=400, learning=True, took_s=5.0)
    assert not slow.due(now=139.0, step=1400, learning=True)
    assert slow.due(now=140.0, step=1400, learning=True)
    # steps, and never by time with minutes=0
    steps = CheckpointCadence(steps=1000, minutes=0.0, now=0.0, step=0, learning=True)
    assert not steps.due(now=1e6, step=999, learning=True)
    assert steps.due(now=1e6, step=1000, learning=True)
    never = CheckpointCadence(steps=0, minutes=0.0, now=0.0, step=0, learning=False)
    assert not never.due(now=1e6, step=10**9, learning=True)  # only at the end


# ---------------------------------------------------- item 9: --resume takes --algo


def test_resume_of_a_sac_run_needs_no_algo_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SAC_CLI, "--logdir", str(tmp_path)]) == 0
    capsys.readouterr()
    rc = main(["train", ENV, "--resume", str(tmp_path), "--total-steps", "240", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert load_checkpoint(tmp_path).state["counters"]["global_step"] == 240
    assert "--algo sac --resume" in capsys.readouterr().out  # the summary's resume line
    rc = main(["train", ENV, "--algo", "ppo", "--resume", str(tmp_path), "--total-steps", "300"])
    assert rc == 2
    assert "a sac checkpoint; use --algo sac" in _one_line(capsys.readouterr().err)


# ----------------------------------------------- item 10: progress.jsonl after resume


def _steps(logdir: Path) -> list[int]:
    lines = (logdir / "progress.jsonl").read_text().splitlines()
    return [json.loads(line)["global_step"] for line in lines]


def _tb_steps(logdir: Path) -> list[int]:
    """The steps of TensorBoard's ``charts/SPS`` as TensorBoard shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir / "tb"))
    events.Reload()
    return [e.step for e in events.Scalars("charts/SPS")]


def test_sac_progress_never_goes_backwards_after_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import simkit.clients.learners.sac as sac_module

    monkeypatch.setattr(sac_module, "WRITE_EVERY_S", 0.0)  # a line every round
    _crash_on_call(monkeypatch, SAC, "run", 8)
    with pytest.raises(RuntimeError, match="crash"):
        _sac(tmp_path, tensorboard=True)
    monkeypatch.undo()
    kept = int(load_checkpoint(tmp_path).state["counters"]["global_step"])
    assert max(_steps(tmp_path)) > kept  # lines past the checkpoint were written
    monkeypatch.setattr(sac_module, "WRITE_EVERY_S", 0.0)
    _sac(tmp_path, resume=tmp_path, tensorboard=True)
    steps = _steps(tmp_path)
    assert steps == sorted(set(steps)), steps
    assert steps[-1] == SMALL.total_steps
    assert _tb_steps(tmp_path) == steps  # TensorBoard hides what the resume redid


def test_ppo_progress_never_goes_backwards_after_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from simkit.clients.learners.ppo import PPO

    args = PPOArgs(
        env_id="simkit/CartPole-v0",
        total_steps=8 * 256,
        num_envs=4,
        num_steps=64,
        num_minibatches=2,
        update_epochs=1,
    )
    _crash_on_call(monkeypatch, PPO, "update", 6)
    with pytest.raises(RuntimeError, match="crash"):
        simkit.train(args, logdir=tmp_path, servers=0, checkpoint_every=4)
    monkeypatch.undo()
    assert _steps(tmp_path) == [256 * k for k in range(1, 6)]
    simkit.train(args, logdir=tmp_path, servers=0, resume=tmp_path)
    assert _steps(tmp_path) == [256 * k for k in range(1, 9)]
    assert _tb_steps(tmp_path) == [256 * k for k in range(1, 9)]


# --------------------------------------------- item 11: full disks, read-only folders


def _tiny_checkpoint(directory: Path, name: str, value: float, **kw: Any) -> Path:
    return save_checkpoint(
        directory,
        name,
        model={"w": torch.full((3,), value)},
        optimizer={"state": {}, "param_groups": []},
        state={"args": {}, "value": value},
        **kw,
    )


@pytest.mark.parametrize("where", ["a file", "the replay file", "the latest pointer"])
def test_a_failed_checkpoint_leaves_nothing_and_the_previous_one_resumable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    ckpts = tmp_path / "checkpoints"
    _tiny_checkpoint(ckpts, "step-0000000001", 1.0)

    def full(path: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    extra = {"replay.safetensors.zst": full} if where == "the replay file" else None
    if where == "a file":
        real = builtins.open
        count = [0]

        def fake_open(file: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
            if "w" in mode and "step-0000000002" in str(file):
                count[0] += 1
                if count[0] == 2:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
            return real(file, mode, *a, **kw)

        monkeypatch.setattr(builtins, "open", fake_open)
    elif where == "the latest pointer":
        real_replace = os.replace

        def fake_replace(src: Any, dst: Any) -> None:
            if str(dst).endswith("latest"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", fake_replace)
    with pytest.raises(WriteFailed) as info:
        _tiny_checkpoint(ckpts, "step-0000000002", 2.0, extra=extra)
    monkeypatch.undo()
    message = str(info.value)
    assert "\n" not in message
    assert str(ckpts) in message
    assert "No space left on device (ENOSPC)" in message
    assert f"the previous checkpoint {ckpts / 'step-0000000001'} is intact" in message
    assert info.value.errno == errno.ENOSPC
    assert _hidden(tmp_path) == []
    assert (ckpts / "latest").read_text().strip() == "step-0000000001"
    assert float(load_checkpoint(tmp_path).model["w"][0]) == 1.0


def test_leftovers_of_a_killed_writer_are_removed_by_the_next_checkpoint(
    tmp_path: Path,
) -> None:
    ckpts = tmp_path / "checkpoints"
    _tiny_checkpoint(ckpts, "step-0000000001", 1.0)
    dead = 2**22 + 12345  # above any pid_max: no such process
    (ckpts / f".step-0000000002.tmp-{dead}").mkdir()
    (ckpts / f".step-0000000002.tmp-{dead}" / "model.safetensors").write_bytes(b"half")
    (ckpts / f".latest.tmp-{dead}").write_text("step-0000000002")
    (ckpts / f".step-0000000003.tmp-{os.getppid()}").mkdir()  # a live writer's: kept
    _tiny_checkpoint(ckpts, "step-0000000004", 4.0)
    assert sorted(p.name for p in ckpts.iterdir()) == [
        f".step-0000000003.tmp-{os.getppid()}",
        "latest",
        "step-0000000001",
        "step-0000000004",
    ]


def test_a_sac_run_whose_first_checkpoint_fails_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full(self: ReplayBuffer, path: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ReplayBuffer, "save", full)
    assert main([*SAC_CLI, "--logdir", str(tmp_path)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"simkit train: cannot write {tmp_path / 'checkpoints'}")
    assert "No space left on device (ENOSPC)" in line
    assert "no earlier checkpoint" in line
    assert _hidden(tmp_path) == []
    monkeypatch.undo()
    assert main(["train", ENV, "--resume", str(tmp_path), "--no-progress"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{tmp_path / 'checkpoints'}: no complete checkpoint" in line
    assert "no checkpoints/ inside" not in line


def test_a_sac_run_whose_later_checkpoint_fails_resumes_exactly_from_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sac(tmp_path / "straight")
    real = ReplayBuffer.save
    calls = [0]

    def full_the_second_time(self: ReplayBuffer, path: Any) -> None:
        calls[0] += 1
        if calls[0] == 2:  # the first (learning starts) is written, the final one is not
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, path)

    monkeypatch.setattr(ReplayBuffer, "save", full_the_second_time)
    with pytest.raises(WriteFailed, match=r"the previous checkpoint .*step-\d+ is intact"):
        _sac(tmp_path / "run")
    monkeypatch.undo()
    assert _hidden(tmp_path / "run") == []
    _sac(tmp_path / "run", resume=tmp_path / "run")
    _same(load_checkpoint(tmp_path / "straight").model, load_checkpoint(tmp_path / "run").model)


def test_a_ppo_run_on_a_full_disk_ends_in_one_line_keeping_its_checkpoint(
    tmp_path: Path, enospc_on_fsync: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    import simkit.clients.learners._run as run  # the run writes every algorithm's checkpoints

    real = run.save_checkpoint
    saved: list[Path] = []

    def save_then_fill(*args: Any, **kw: Any) -> Path:
        saved.append(real(*args, **kw))
        enospc_on_fsync.append(1)  # the disk is full after the first checkpoint
        return saved[-1]

    run.save_checkpoint = save_then_fill  # type: ignore[assignment]
    try:
        rc = main([*PPO_CLI, "--logdir", str(tmp_path), "--checkpoint-every", "1"])
    finally:
        run.save_checkpoint = real  # type: ignore[assignment]
    enospc_on_fsync.clear()
    assert rc == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"simkit train: cannot write {tmp_path}")
    assert "No space left on device (ENOSPC)" in line
    assert _hidden(tmp_path) == []
    assert load_checkpoint(tmp_path).path == saved[0]


@pytest.mark.parametrize("argv", [PPO_CLI, SAC_CLI], ids=["ppo", "sac"])
def test_tensorboard_on_a_full_disk_ends_the_run_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    from torch.utils.tensorboard import SummaryWriter

    def full(self: Any, *args: Any, **kw: Any) -> None:  # what its writer thread raises
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(SummaryWriter, "add_scalar", full)
    assert main([*argv, "--logdir", str(tmp_path)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line == (
        f"simkit train: cannot write {tmp_path / 'tb'}: No space left on device (ENOSPC) "
        "(TensorBoard scalars)"
    )


def test_logdir_naming_a_file_or_a_read_only_folder_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    for argv in (PPO_CLI, SAC_CLI):
        assert main([*argv, "--logdir", str(file)]) == 2
        line = _one_line(capsys.readouterr().err)
        assert line == f"simkit train: --logdir {file}: a file, not a folder"
    read_only(monkeypatch, tmp_path / "ro")
    for argv in (PPO_CLI, SAC_CLI):
        assert main([*argv, "--logdir", str(tmp_path / "ro" / "run")]) == 2
        line = _one_line(capsys.readouterr().err)
        assert line.startswith(f"simkit train: --logdir {tmp_path / 'ro' / 'run'}: cannot write")
        assert "Read-only file system (EROFS)" in line


def test_record_into_a_read_only_folder_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    read_only(monkeypatch, tmp_path)
    out = tmp_path / "rec"
    rc = main(["record", "simkit/CartPole-v0", "--episodes", "2", "--out", str(out)])
    assert rc == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"simkit record: cannot write {out}")
    assert "Read-only file system (EROFS)" in line


def test_record_on_a_full_disk_keeps_the_complete_episodes_and_no_torn_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.recording import RecordingReader

    real = os.writev
    count = [0]

    def writev(fd: int, parts: Any) -> int:
        count[0] += 1
        if count[0] >= 3:  # the third episode gets half written, then the disk is full
            if count[0] == 3:
                os.write(fd, b"".join(parts)[:100])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, parts)

    monkeypatch.setattr(os, "writev", writev)
    out = tmp_path / "rec"
    argv = ["record", "simkit/CartPole-v0", "--episodes", "6", "--num-envs", "1"]
    rc = main([*argv, "--out", str(out)])
    monkeypatch.undo()
    assert rc == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"simkit record: cannot write {out}")
    assert "No space left on device (ENOSPC)" in line
    reader = RecordingReader(out)
    assert len(reader) == 2
    assert reader.skipped == []
    assert [p.name for p in out.iterdir() if p.name.endswith("tmp")] == []


# -------------------------------------------------- item 12: crafted checkpoints


def test_a_resigned_state_without_args_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, algo_free in ((SAC_CLI, ["--algo", "sac"]), (PPO_CLI, [])):
        logdir = tmp_path / argv[1].replace("/", "_")
        assert main([*argv, "--logdir", str(logdir), "--total-steps", "256"]) == 0
        ckpt = load_checkpoint(logdir)
        state = snapshot.loads((ckpt.path / "state.msgpack").read_bytes())
        del state["args"]
        _resign(ckpt.path, "state.msgpack", snapshot.dumps(state))
        capsys.readouterr()
        rc = main(["train", argv[1], *algo_free, "--resume", str(logdir), "--no-progress"])
        assert rc == 2
        line = _one_line(capsys.readouterr().err)
        assert f"{ckpt.path / 'state.msgpack'}: no args" in line
    with pytest.raises(InvalidCheckpoint, match="no args"):
        _sac(tmp_path / "x", resume=tmp_path / "simkit_Pendulum-v0")


@pytest.mark.parametrize(
    ("algo", "key", "bad", "match"),
    [
        ("sac", "servers", None, r"servers must be an integer >= 0, got None"),
        ("sac", "tally", "x", r"tally must be \{'returns'"),
        ("sac", "counters", {"global_step": -5}, r"counters.global_step must be an integer"),
        ("ppo", "version", None, r"version must be an integer >= 0, got None"),
        ("ppo", "tally", -5, r"tally must be"),
        ("ppo", "generator", -5, r"cannot restore the learner: .*out of bounds"),
        ("ppo", "global_step", -5, r"global_step must be an integer >= 0, got -5"),
        ("ppo", "source_kind", "x", r"source_kind must be 'local', 'device' or 'servers', got 'x'"),
        ("ppo", "normal_noise", "x", r"normal_noise must be an integer >= 1, got 'x'"),
        ("ppo", "args", [], r"bad args: a map of settings expected, got list"),
    ],
)
def test_resigned_state_entries_of_the_wrong_kind_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], algo: str, key: str, bad: Any, match: str
) -> None:
    argv = SAC_CLI if algo == "sac" else PPO_CLI
    assert main([*argv, "--logdir", str(tmp_path), "--total-steps", "256"]) == 0
    ckpt = load_checkpoint(tmp_path)
    state = snapshot.loads((ckpt.path / "state.msgpack").read_bytes())
    state[key] = bad
    _resign(ckpt.path, "state.msgpack", snapshot.dumps(state))
    progress = (tmp_path / "progress.jsonl").read_text()
    capsys.readouterr()
    rc = main(["train", argv[1], "--resume", str(tmp_path), "--total-steps", "512"])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2
    assert line.startswith(f"simkit train: {ckpt.path}")
    assert re.search(match, line), line
    assert (tmp_path / "progress.jsonl").read_text() == progress


def _saved_buffer(tmp: Path, **fields: np.ndarray) -> Path:
    buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(1,))
    n = 4
    buf.add(
        np.ones((n, 3), np.float32),
        np.zeros((n, 1), np.float32),
        np.ones(n, np.float32),
        np.ones((n, 3), np.float32),
        np.zeros(n, bool),
        np.zeros(n, bool),
        np.zeros(n, np.int64),
    )
    for name, value in fields.items():
        getattr(buf, name)[: len(value)] = value
    path = tmp / "replay.safetensors.zst"
    buf.save(path)
    return path


@pytest.mark.parametrize("field", ["rewards", "obs", "next_obs", "actions"])
def test_a_replay_buffer_with_non_finite_values_is_refused(tmp_path: Path, field: str) -> None:
    value = {"rewards": [np.nan], "actions": [[np.inf]]}.get(field, [[0.0, np.nan, 0.0]])
    path = _saved_buffer(tmp_path, **{field: np.array(value, np.float32)})
    with pytest.raises(
        InvalidCheckpoint, match=rf"{re.escape(str(path))}: .*'{field}' has 1 non-finite"
    ):
        ReplayBuffer.load(path)


def test_a_resume_from_a_buffer_with_nan_rewards_is_refused(tmp_path: Path) -> None:
    _sac(tmp_path, max_rounds=12)
    ckpt = load_checkpoint(tmp_path)
    buf = ReplayBuffer.load(ckpt.extra["replay.safetensors.zst"])
    buf.rewards[3] = np.nan
    buf.save(tmp_path / "bad.zst")
    _resign(ckpt.path, "replay.safetensors.zst", (tmp_path / "bad.zst").read_bytes())
    with pytest.raises(InvalidCheckpoint, match=r"'rewards' has 1 non-finite value"):
        _sac(tmp_path, resume=tmp_path)


def test_a_buffer_of_other_shapes_than_the_env_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    _sac(tmp_path, max_rounds=2)
    ckpt = load_checkpoint(tmp_path)
    path = _saved_buffer(tmp_path)  # obs (3,) like Pendulum, capacity 10: not the run's
    _resign(ckpt.path, "replay.safetensors.zst", path.read_bytes())
    with pytest.raises(InvalidCheckpoint, match=r"capacity 10, expected 1000"):
        _sac(tmp_path, resume=tmp_path)


def _bomb(path: Path, header: dict[str, Any], body_mb: int) -> None:
    """A replay file whose header says one thing and whose zstd frame inflates to
    ``body_mb`` MB of zeros after it (a few kB on disk)."""
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        writer = zstandard.ZstdCompressor(level=1).stream_writer(fh, closefd=False)
        writer.write(len(text).to_bytes(8, "little") + text)
        zeros = bytes(1 << 20)
        for _ in range(body_mb):
            writer.write(zeros)
        writer.flush(zstandard.FLUSH_FRAME)
    assert path.stat().st_size < 1 << 20


def _header(capacity: int, inserted: int, end: int) -> dict[str, Any]:
    meta = {
        "format": REPLAY_FORMAT,
        "capacity": str(capacity),
        "obs_shape": "[3]",
        "obs_dtype": "float32",
        "action_shape": "[1]",
        "action_dtype": "float32",
        "inserted": str(inserted),
        "dropped_no_final": "0",
    }
    return {
        "__metadata__": meta,
        "obs": {"dtype": "F32", "shape": [1, 3], "data_offsets": [0, end]},
    }


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("declares more than its capacity holds", r"at most \d+"),
        ("inflates past what it declares", r"more data than"),
        ("is of another capacity than the run's", r"capacity 10000000, expected 1000"),
    ],
)
def test_a_zstd_bomb_is_refused_before_it_is_inflated(
    tmp_path: Path, kind: str, match: str
) -> None:
    path = tmp_path / "replay.safetensors.zst"
    expect: dict[str, Any] = {}
    if kind.startswith("declares"):
        _bomb(path, _header(10, 4, 256 << 20), 256)
    elif kind.startswith("inflates"):
        _bomb(path, _header(10, 1, 12), 256)
    else:
        _bomb(path, _header(10_000_000, 10_000_000, 256 << 20), 256)
        expect = {"capacity": 1000, "obs_shape": (3,), "action_shape": (1,)}
    tracemalloc.start()
    try:
        with pytest.raises(InvalidCheckpoint, match=match):
            ReplayBuffer.load(path, **expect)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 1e6:.0f} MB inflated"


def test_replay_save_and_load_still_round_trip_with_expectations(tmp_path: Path) -> None:
    path = _saved_buffer(tmp_path)
    back = ReplayBuffer.load(path, capacity=10, obs_shape=(3,), action_shape=(1,))
    assert len(back) == 4
    with pytest.raises(InvalidCheckpoint, match=r"obs_shape \(3,\), expected \(4,\)"):
        ReplayBuffer.load(path, obs_shape=(4,))
    other = st_save({"counters": np.zeros(3, np.int64)}, {"format": REPLAY_FORMAT})
    (tmp_path / "o.zst").write_bytes(zstandard.ZstdCompressor().compress(other))
    with pytest.raises(InvalidCheckpoint, match=r"o\.zst"):
        ReplayBuffer.load(tmp_path / "o.zst")
