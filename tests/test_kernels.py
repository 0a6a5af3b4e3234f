"""simkit._kernels: the pinned environment starts numpy cleanly on any x86-64 CPU, a pinned
process computes the same pins and the same CPU description as an unpinned one, and the
kernels bits were made under are recorded and explain a difference on another CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simkit._kernels import (
    PINS,
    RECORD_PORTABLY,
    cpu_simd,
    is_pinned,
    kernel_mode,
    numpy_avx512_targets,
    pinned_env,
    why_bits_may_differ,
)
from simkit.recording import Episode, RecordEpisodes, RecordingReader, RecordingWriter
from simkit.recording._io import encode_record
from simkit.vector import VectorEnv

_PROBE = (
    "import json, numpy; from simkit import _kernels as k; "
    "print(json.dumps([k.numpy_avx512_targets(), k.pinned_env().get('NPY_DISABLE_CPU_FEATURES'), "
    "k.cpu_simd(), k.is_pinned()]))"
)


def _probe(env: dict[str, str]) -> tuple[list[str], str | None, str, bool]:
    """What a process started with ``env`` computes (numpy's warnings are errors there)."""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    targets, disable, simd, pinned = json.loads(done.stdout)
    return targets, disable, simd, pinned


@pytest.mark.kernels
def test_numpy_starts_without_a_warning_under_the_pinned_env() -> None:
    """The pins name numpy's dispatch targets only: a name numpy does not dispatch on
    (``AVX512F`` under numpy 2.4) is an ImportWarning, an error under ``-W error``."""
    targets, disable, _, pinned = _probe(pinned_env())
    assert pinned
    assert targets == numpy_avx512_targets()
    assert disable == (" ".join(targets) or None)


def test_the_pins_name_only_numpys_avx512_dispatch_targets() -> None:
    import numpy as np

    try:
        umath = np._core._multiarray_umath
    except AttributeError:  # numpy < 2
        umath = np.core._multiarray_umath  # type: ignore[attr-defined]
    dispatch = set(umath.__cpu_dispatch__)
    targets = numpy_avx512_targets()
    assert set(targets) <= dispatch
    assert all(t.startswith("AVX512") or t == "X86_V4" for t in targets)
    env = pinned_env({})
    assert {k: env[k] for k in PINS} == PINS
    assert env.get("NPY_DISABLE_CPU_FEATURES", "").split() == targets


@pytest.mark.kernels
def test_a_process_with_avx512_disabled_computes_the_same_pins_and_cpu() -> None:
    """A process whose numpy already has its AVX-512 targets disabled (pinned, or started
    as on an AVX2 machine) sees them as absent: it still pins the same targets (its
    children, e.g. the servers of ``--reproducible``, stay pinned) and describes the same
    CPU."""
    disabled = {**pinned_env(), "OPENBLAS_CORETYPE": "SkylakeX"}
    targets, disable, simd, pinned = _probe(disabled)
    assert targets == numpy_avx512_targets()
    assert disable == (" ".join(targets) or None)
    assert simd == cpu_simd()
    assert not pinned  # OpenBLAS is not on its AVX2 kernels
    assert not is_pinned()
    assert kernel_mode() == {"reproducible": False, "simd": cpu_simd()}


def test_pinned_means_numpys_avx512_targets_are_disabled_too() -> None:
    env = pinned_env()
    assert is_pinned(env)
    if numpy_avx512_targets():  # an AVX-512 CPU: the PINS alone leave numpy's loops free
        assert not is_pinned({k: v for k, v in env.items() if k != "NPY_DISABLE_CPU_FEATURES"})


# ---------------------------------------------------------------- stated and recorded


def _other_simd() -> str:
    """A SIMD description of a CPU of the other kind than this one."""
    return "avx avx2 fma" if "avx512" in cpu_simd() else "avx avx2 avx512f avx512bw fma"


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        (None, None),  # stored before simkit kept kernels: unknown
        ({"reproducible": True, "simd": "avx avx2 avx512f fma"}, "with --reproducible"),
        ({"reproducible": False, "simd": "same"}, None),
        ({"reproducible": False, "simd": "other"}, "on a CPU with other SIMD features"),
    ],
)
def test_why_bits_may_differ_from_this_process(recorded: Any, expected: str | None) -> None:
    if recorded is not None and recorded["simd"] == "same":
        recorded = {**recorded, "simd": cpu_simd()}
    if recorded is not None and recorded["simd"] == "other":
        recorded = {**recorded, "simd": _other_simd()}
    why = why_bits_may_differ(recorded)
    if expected is None:
        assert why is None
    else:
        assert why is not None
        assert expected in why, why
        assert "\n" not in why


def test_both_sides_on_the_avx2_paths_make_the_same_bits() -> None:
    """A --reproducible recording verified by a pinned process, or an AVX2 CPU's recording
    verified pinned: the same kernels, nothing to explain."""
    avx2 = {"reproducible": False, "simd": "avx avx2 fma"}
    pinned = {"reproducible": True, "simd": _other_simd()}
    import simkit._kernels as k

    for recorded in (avx2, pinned):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(k, "is_pinned", lambda env=None: True)
            assert why_bits_may_differ(recorded) is None


def _record(directory: Path, episodes: int = 2) -> None:
    kwargs = {"max_episode_steps": 12}
    vec = VectorEnv("simkit/CartPole-v0", 2, env_kwargs=kwargs)
    env = RecordEpisodes(
        vec, directory, env_id="simkit/CartPole-v0", env_kwargs=kwargs, max_episodes=episodes
    )
    rng = np.random.default_rng(0)
    env.reset(seed=3)
    while env.writer.episodes_written < episodes:
        env.step(rng.integers(0, 2, size=2))
    env.close()


def test_a_recording_stores_the_kernels_it_was_made_under(tmp_path: Path) -> None:
    _record(tmp_path / "rec")
    reader = RecordingReader(tmp_path / "rec")
    assert [s.kernels for s in reader.stats()] == [kernel_mode()] * 2
    assert [ep.kernels for ep in reader] == [kernel_mode()] * 2


def test_a_malformed_kernels_map_is_refused_on_write(tmp_path: Path) -> None:
    _record(tmp_path / "rec", episodes=1)
    ep = RecordingReader(tmp_path / "rec").load(0)
    ep.kernels = {"reproducible": "yes", "simd": ""}
    with pytest.raises(TypeError, match=r'kernels must be \{"reproducible": bool, "simd": str\}'):
        encode_record(ep)


def _rewrite(src: Path, dst: Path, kernels: dict[str, Any], nudge: bool) -> None:
    """``src``'s episodes into ``dst`` stamped with ``kernels``; with ``nudge``, the last
    reward one ulp up (as another CPU's rounding would make it)."""
    with RecordingWriter(dst, compression="none", background=False) as writer:
        for ep in RecordingReader(src):
            assert isinstance(ep, Episode)
            rewards = np.array(ep.rewards)
            if nudge:
                rewards[-1] = np.nextafter(rewards[-1], np.inf)
            writer.write(dataclasses.replace(ep, rewards=rewards, kernels=kernels))


def test_replay_verify_says_bits_may_differ_for_another_cpus_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An episode recorded without --reproducible on a CPU with other SIMD features that
    replays differently: one line saying why and how to record portably, instead of a
    bare divergence; the same divergence of this CPU's own recording stays bare."""
    from simkit.cli import main

    _record(tmp_path / "rec", episodes=1)
    other = {"reproducible": False, "simd": _other_simd()}
    _rewrite(tmp_path / "rec", tmp_path / "other", other, nudge=True)
    _rewrite(tmp_path / "rec", tmp_path / "here", kernel_mode(), nudge=True)
    _rewrite(tmp_path / "rec", tmp_path / "fine", other, nudge=False)

    assert main(["replay", str(tmp_path / "other"), "--verify", "--workers", "1"]) == 1
    fail = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1
    assert "field reward differs" in fail[0]
    assert (
        " -- bits may differ on this CPU: the recording was made without --reproducible on "
        "a CPU with other SIMD features (" in fail[0]
    )
    assert fail[0].endswith(RECORD_PORTABLY)

    assert main(["replay", str(tmp_path / "here"), "--verify", "--workers", "1"]) == 1
    fail = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1
    assert "field reward differs" in fail[0]
    assert "bits may differ" not in fail[0]

    assert main(["replay", str(tmp_path / "fine"), "--verify", "--workers", "1"]) == 0
    assert "1/1 episodes replayed bit for bit" in capsys.readouterr().out


def _simkit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "simkit", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _as_on_avx2() -> dict[str, str]:
    """This environment with numpy's AVX-512 dispatch and OpenBLAS's AVX-512 kernels
    disabled: what an AVX2 CPU runs (and not pinned: the other libraries are free)."""
    return {
        **os.environ,
        "NPY_DISABLE_CPU_FEATURES": " ".join(numpy_avx512_targets()),
        "OPENBLAS_CORETYPE": "Haswell",
    }


@pytest.mark.kernels
def test_a_reproducible_recording_verifies_with_avx512_dispatch_on_and_off(
    tmp_path: Path,
) -> None:
    """GoalNav's numpy arithmetic rounds differently on the AVX-512 paths (the committed
    multi-agent fixture diverged there): a ``--reproducible`` recording is pinned, and
    ``simkit replay --verify`` replays it pinned whatever it was started with."""
    rec = tmp_path / "goalnav"
    made = _simkit(
        *("record", "simkit/GoalNav-v0", "--episodes", "2", "--num-envs", "2"),
        *("--out", str(rec), "--reproducible"),
    )
    assert made.returncode == 0, made.stderr
    assert all(
        s.kernels == {**kernel_mode(), "reproducible": True} for s in RecordingReader(rec).stats()
    )
    for env in (None, _as_on_avx2()):
        done = _simkit("replay", str(rec), "--verify", "--workers", "1", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "2/2 episodes replayed bit for bit" in done.stdout


_TRAIN = [
    *("train", "simkit/CartPole-v0", "--servers", "0", "--num-envs", "4", "--num-steps", "64"),
    *("--num-minibatches", "2", "--update-epochs", "1", "--hidden", "32", "32", "--no-progress"),
]


def _params(logdir: Path) -> dict[str, Any]:
    from simkit.clients.learners._checkpoint import load_checkpoint

    return dict(load_checkpoint(logdir).model)


def _resume_command(out: str) -> list[str]:
    """The summary's ``resume:`` command, as arguments after ``simkit``."""
    (line,) = [x for x in out.splitlines() if x.startswith("  resume: ")]
    words = line.removeprefix("  resume: ").split()
    assert Path(words[0]).name == "simkit"
    return words[1:]


def _interrupted(argv: list[str], logdir: Path) -> subprocess.CompletedProcess[str]:
    """``simkit *argv`` stopped with SIGINT (Ctrl-C) once its first checkpoint is in
    ``logdir``: it checkpoints after the update in progress and prints its summary."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "simkit", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (logdir / "checkpoints" / "latest").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_a_reproducible_run_resumed_with_its_printed_command_equals_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """A ``--reproducible`` run stopped with Ctrl-C, then resumed with the command its
    summary prints, ends with the parameters of the run left alone, bit for bit; resumed
    without ``--reproducible`` the checkpoint keeps it, and says so (resumed unpinned, an
    AVX-512 CPU would go on with other bits)."""
    import shutil

    import torch

    from simkit.clients.learners._checkpoint import load_checkpoint

    total = ("--total-steps", "10240", "--reproducible")
    whole = _simkit(*_TRAIN, *total, "--logdir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    argv = [*_TRAIN, *total, "--checkpoint-every", "1", "--logdir", str(tmp_path / "a")]
    stopped = _interrupted(argv, tmp_path / "a")
    assert stopped.returncode == 0, stopped.stderr
    assert "simkit train simkit/CartPole-v0 (stopped)" in stopped.stdout
    assert int(load_checkpoint(tmp_path / "a").state["global_step"]) < 10240
    command = _resume_command(stopped.stdout)
    assert command == [
        *("train", "simkit/CartPole-v0", "--resume", str(tmp_path / "a"), "--reproducible")
    ]
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    resumed = _simkit(*command)
    assert resumed.returncode == 0, resumed.stderr
    kept = _simkit("train", "simkit/CartPole-v0", "--resume", str(tmp_path / "b"))
    assert kept.returncode == 0, kept.stderr
    assert (
        "simkit train: --resume: the checkpoint was trained with --reproducible: kept (as if "
        "given)" in kept.stderr.splitlines()
    )
    assert _resume_command(kept.stdout)[-1] == "--reproducible"
    want = _params(tmp_path / "whole")
    for logdir in ("a", "b"):
        assert int(load_checkpoint(tmp_path / logdir).state["global_step"]) == 10240
        got = _params(tmp_path / logdir)
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), (logdir, k)
    pinned = {**kernel_mode(), "reproducible": True}
    assert load_checkpoint(tmp_path / "b").state["kernels"] == pinned


def _plan(reproducible: bool, kernels: Any) -> Any:
    from simkit.clients.learners._args import PPOArgs, RunOptions
    from simkit.clients.learners._checkpoint import Checkpoint
    from simkit.clients.learners._train import Plan

    ckpt = Checkpoint(Path("run"), {}, {}, {} if kernels is None else {"kernels": kernels})
    return Plan(PPOArgs(), RunOptions(reproducible=reproducible), [], ckpt)


def test_resume_states_what_the_checkpoints_kernels_mean_for_the_run() -> None:
    from simkit.clients.learners._train import resumed_kernels

    pinned = {"reproducible": True, "simd": cpu_simd()}
    kept = "the checkpoint was trained with --reproducible: kept (as if given)"
    assert resumed_kernels(_plan(False, pinned)) == (True, kept)
    assert resumed_kernels(_plan(True, pinned)) == (True, None)
    keep, said = resumed_kernels(_plan(True, {"reproducible": False, "simd": cpu_simd()}))
    assert keep
    assert said is not None
    assert said.startswith(
        "the checkpoint was trained without --reproducible: the kernels are pinned from here on"
    )
    assert resumed_kernels(_plan(False, {"reproducible": False, "simd": cpu_simd()})) == (
        False,
        None,
    )
    keep, said = resumed_kernels(_plan(False, {"reproducible": False, "simd": _other_simd()}))
    assert not keep
    assert said is not None
    assert said.startswith(
        "the checkpoint was trained without --reproducible on a CPU with other SIMD features ("
    )
    assert resumed_kernels(_plan(False, None)) == (False, None)  # from before they were kept
