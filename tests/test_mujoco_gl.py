"""A MUJOCO_GL naming a missing or unknown OpenGL backend: simkit still loads and runs every
env that needs no MuJoCo, and a MuJoCo env fails in one line saying what is missing and which
backend works. MuJoCo reads MUJOCO_GL at import, so each case runs in its own interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BROKEN = ["foo"]  # an unknown name; a missing library (osmesa here) fails the same way


def _run(args: list[str], backend: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYOPENGL_PLATFORM"}
    return subprocess.run(
        [sys.executable, *args],
        env={**env, "MUJOCO_GL": backend},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("backend", BROKEN)
def test_simkit_list_and_non_mujoco_envs_work_whatever_mujoco_gl(
    backend: str, tmp_path: Path
) -> None:
    listed = _run(["-m", "simkit", "list"], backend, tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "simkit/Cheetah-v0" in listed.stdout
    script = (
        "import simkit; env = simkit.make('simkit/CartPole-v0'); env.reset(seed=0); "
        "env.step(0); import sys; print(sorted(m for m in sys.modules if m.startswith('mujoco')))"
    )
    made = _run(["-c", script], backend, tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    assert made.stdout.strip() == "[]"


@pytest.mark.parametrize("backend", BROKEN)
def test_a_mujoco_env_says_in_one_line_what_is_missing(backend: str, tmp_path: Path) -> None:
    made = _run(["-c", "import simkit; simkit.make('simkit/Cheetah-v0')"], backend, tmp_path)
    assert made.returncode == 1
    last = made.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"simkit.errors.RenderUnavailable: MuJoCo cannot load with MUJOCO_GL={backend}: "
    )
    assert "with MUJOCO_GL unset everything but rendering works" in last
    # The CLI prints that line alone, without a traceback.
    cli = ["-m", "simkit", "record", "simkit/Cheetah-v0", "--episodes", "1", "--out", "rec"]
    recorded = _run(cli, backend, tmp_path)
    assert recorded.returncode == 1
    assert recorded.stderr.strip().splitlines() == [
        "simkit: " + last.removeprefix("simkit.errors.RenderUnavailable: ")
    ]


def test_a_gymnasium_mujoco_env_says_it_in_one_line_too(tmp_path: Path) -> None:
    # Gymnasium imports MuJoCo itself (gym:HalfCheetah-v5); gym:CartPole-v1 needs none.
    script = (
        "import simkit\n"
        "simkit.make('gym:CartPole-v1').reset(seed=0)\n"
        "simkit.make('gym:HalfCheetah-v5')\n"
    )
    made = _run(["-c", script], "foo", tmp_path)
    assert made.returncode == 1
    assert (
        made.stderr.strip()
        .splitlines()[-1]
        .startswith("simkit.errors.RenderUnavailable: MuJoCo cannot load with MUJOCO_GL=foo: ")
    )


def test_the_message_names_what_is_missing_and_what_works() -> None:
    from simkit._mujoco import GL_BACKENDS, _backend_works, gl_unavailable

    error = gl_unavailable("osmesa", AttributeError("no glGetError"), at_import=True)
    assert "libOSMesa is not installed (Debian/Ubuntu: apt-get install libosmesa6)" in str(error)
    working = [b for b in GL_BACKENDS if b != "osmesa" and _backend_works(b)]
    if working:
        assert f"MUJOCO_GL={working[0]}" in str(error)
    else:
        assert "no OpenGL backend works here" in str(error)
    unknown = gl_unavailable("foo", RuntimeError("invalid"), at_import=False)
    assert str(unknown).startswith("MuJoCo cannot render with MUJOCO_GL=foo: MuJoCo knows no such")


def test_every_cli_command_prints_a_render_error_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dataclasses

    from simkit import cli
    from simkit.errors import RenderUnavailable

    def broken(args: object) -> int:
        raise RenderUnavailable("MuJoCo cannot load with MUJOCO_GL=foo: ...")

    monkeypatch.setitem(cli.COMMANDS, "list", dataclasses.replace(cli.COMMANDS["list"], run=broken))
    assert cli.main(["list"]) == 1
    assert capsys.readouterr().err == "simkit: MuJoCo cannot load with MUJOCO_GL=foo: ...\n"


def test_eval_render_shows_its_progress(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("imageio")
    import numpy as np

    import simkit
    from simkit.cli import main
    from simkit.clients.learners._checkpoint import save_policy
    from simkit.clients.learners.ppo import PPOArgs, build_model, policy_meta

    # Tiny frames instead of OpenGL: the progress is what is under test (tests/test_ppo.py
    # renders for real where libOSMesa is installed).
    monkeypatch.setattr(simkit.MujocoEnv, "render", lambda self: np.zeros((16, 16, 3), np.uint8))
    args = PPOArgs(env_id="simkit/Reacher-v0")
    policy = tmp_path / "policy.safetensors"
    save_policy(policy, build_model(args).state_dict(), policy_meta(args, 0))
    out = tmp_path / "out.mp4"
    assert main(["eval", str(policy), "--episodes", "2", "--render", str(out)]) == 0
    assert out.is_file()
    assert capsys.readouterr().err.splitlines() == [  # two 100-step episodes: 200 frames
        "simkit eval: rendered 100 frames, 0/2 episodes",
        "simkit eval: rendered 101 frames, 1/2 episodes",
        "simkit eval: rendered 200 frames, 1/2 episodes",
        "simkit eval: rendered 200 frames, 2/2 episodes",
    ]


def test_eval_renders_a_gif_at_the_asked_frame_rate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    imageio = pytest.importorskip("imageio")
    import itertools

    import numpy as np

    import simkit
    from simkit.clients.learners._checkpoint import save_policy
    from simkit.clients.learners._evaluate import evaluate_policy
    from simkit.clients.learners.ppo import PPOArgs, build_model, policy_meta

    shade = itertools.count()  # frames that differ, or the GIF writer merges them
    monkeypatch.setattr(
        simkit.MujocoEnv, "render", lambda self: np.full((16, 16, 3), next(shade) % 256, np.uint8)
    )
    args = PPOArgs(env_id="simkit/Reacher-v0")
    policy = tmp_path / "policy.safetensors"
    save_policy(policy, build_model(args).state_dict(), policy_meta(args, 0))
    out = tmp_path / "out.gif"
    evaluate_policy(policy, episodes=1, render=out, fps=20)  # imageio's gif writer has no fps
    assert imageio.v3.improps(out).n_images == 100  # the reset and 99 of the 100 steps
    assert imageio.v3.immeta(out)["duration"] == 50  # ms per frame
