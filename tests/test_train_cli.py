"""``simkit train`` as a user meets it: resume semantics, bad input refused up front,
output a user can copy without a terminal, checkpoints by time."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from simkit.cli import main
from simkit.clients.learners._checkpoint import load_checkpoint
from simkit.clients.learners._train_cli import runnable

RUN = [
    *("simkit/CartPole-v0", "--servers", "0", "--num-envs", "4", "--num-steps", "64"),
    *("--num-minibatches", "2", "--update-epochs", "1", "--no-progress"),
]


def _train(tmp: Path, *extra: str) -> int:
    return main(["train", *RUN, "--logdir", str(tmp), *extra])


def test_resume_with_more_total_steps_trains_exactly_to_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _train(tmp_path, "--total-steps", "2048") == 0
    assert int(load_checkpoint(tmp_path).state["global_step"]) == 2048
    rc = main(["train", *RUN, "--resume", str(tmp_path), "--total-steps", "4096"])
    assert rc == 0
    assert int(load_checkpoint(tmp_path).state["global_step"]) == 4096  # in the same logdir
    capsys.readouterr()
    # Same or fewer steps: the run is complete, nothing is done.
    latest = (tmp_path / "checkpoints" / "latest").read_text()
    for total in ("4096", "1000"):
        assert main(["train", *RUN, "--resume", str(tmp_path), "--total-steps", total]) == 0
        out = capsys.readouterr().out
        assert "is complete (4,096 env steps" in out
        assert "nothing to do" in out
    assert (tmp_path / "checkpoints" / "latest").read_text() == latest


def test_resume_refuses_other_settings_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _train(tmp_path, "--total-steps", "512") == 0
    capsys.readouterr()
    rc = main(["train", *RUN, "--resume", str(tmp_path), "--seed", "7", "--total-steps", "1024"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1
    assert "--seed 7 differs from its 1" in err[0]
    rc = main(["train", "simkit/Pendulum-v0", "--resume", str(tmp_path)])
    assert rc == 2
    assert "the checkpoint trains 'simkit/CartPole-v0'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--total-steps", "-5"], r"--total-steps must be >= 0 \(0: until stopped\), got -5"),
        (["--num-steps", "0"], "--num-steps must be >= 1, got 0"),
        (["--learning-rate", "-1"], "--learning-rate must be > 0, got -1.0"),
        (["--gamma", "1.5"], r"--gamma must be in \(0, 1\], got 1.5"),
        (["--servers", "2", "--num-envs", "1"], "--num-envs must be >= 2, got 1"),
        (["--checkpoint-every", "-1"], "--checkpoint-every must be >= 0, got -1"),
        (["--num-minibatches", "2048"], "minibatches of fewer than 2 samples"),
        (["--seed", "-1"], r"--seed must be in \[0, 2\*\*63\), got -1"),
        (["--algo", "sac", "--seed", str(2**63)], r"--seed must be in \[0, 2\*\*63\), got 9"),
    ],
)
def test_bad_input_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    start = time.monotonic()
    rc = main(["train", "simkit/CartPole-v0", "--logdir", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1
    assert err[0].startswith("simkit train: ")
    assert re.search(message, err[0]), err[0]
    assert time.monotonic() - start < 2.0  # no server was started
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("gym:FrozenLake-v1", r"--algo ppo cannot learn 'gym:FrozenLake-v1': .*Box observation"),
        ("gym:Blackjack-v1", r"--algo ppo cannot learn 'gym:Blackjack-v1': .*Tuple"),
    ],
)
def test_an_env_the_policy_cannot_act_in_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], env_id: str, message: str
) -> None:
    """Observations the model cannot take are refused as the other bad input is (before:
    a traceback from building the model, after the log directory was planned)."""
    rc = main(["train", env_id, "--servers", "0", "--logdir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "run").exists()


def test_without_a_terminal_the_summary_is_whole_and_progress_is_plain_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / ("a-rather-long-directory-name-" * 3) / "run"
    rc = main(
        [
            "train",
            *RUN[:-1],  # progress on: without a terminal it prints plain lines
            *("--total-steps", "1024", "--print-every", "0.001", "--logdir", str(deep)),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "…" not in out
    assert f"  checkpoint: {deep}/checkpoints/update-00000004" in out
    simkit = runnable("simkit")  # the commands run from this shell as printed
    assert f"  resume: {simkit} train simkit/CartPole-v0 --resume {deep}" in out
    assert "simkit/CartPole-v0  1,024/1,024 steps  " in out  # a plain progress line


def test_checkpoints_by_time(tmp_path: Path) -> None:
    rc = _train(
        tmp_path,
        *("--total-steps", "1280", "--checkpoint-every", "0", "--checkpoint-minutes", "1e-9"),
    )
    assert rc == 0
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert names == ["update-00000004", "update-00000005"]  # the last two are kept
    lines = (tmp_path / "progress.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["version"] == 5


def _run_under(tmp: Path, name: str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    import os
    import subprocess
    import sys

    logdir = tmp / name
    subprocess.run(
        [
            *(sys.executable, "-m", "simkit", "train", *RUN, "--total-steps", "768"),
            *("--hidden", "32", "32", "--logdir", str(logdir), *extra),
        ],
        env={**os.environ, **env},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return dict(load_checkpoint(logdir).model)


def test_reproducible_mode_gives_the_same_parameters_under_other_kernels(tmp_path: Path) -> None:
    """Two kernel environments (as on an AVX-512 and an AVX2 machine): --reproducible
    pins both to the same kernels, so the parameters are the same bits."""
    import torch

    avx512 = {"OPENBLAS_CORETYPE": "SkylakeX", "ATEN_CPU_CAPABILITY": "avx512"}
    avx2 = {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2"}
    a = _run_under(tmp_path, "a", avx512, "--reproducible")
    b = _run_under(tmp_path, "b", avx2, "--reproducible")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_eval_refuses_a_count_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(tmp_path), "--episodes", "0"]) == 2
    assert capsys.readouterr().err.strip() == "simkit eval: --episodes must be >= 1, got 0"


def test_an_unpackaged_env_class_reaches_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``simkit train module:Class`` from the folder that holds the module: no packaging,
    no registering; a local server (a subprocess in the same folder) finds it too."""
    import shutil
    import sys

    example = Path(__file__).parents[1] / "docs" / "examples" / "authoring_example.py"
    shutil.copy(example, tmp_path / "my_envs.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_envs", raising=False)
    for servers in ("0", "1"):
        rc = main(
            [
                *("train", "my_envs:PointMass", "--servers", servers, "--num-envs", "2"),
                *("--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"),
                *("--total-steps", "128", "--no-progress", "--logdir", f"run{servers}"),
            ]
        )
        assert rc == 0, capsys.readouterr().err
        assert int(load_checkpoint(tmp_path / f"run{servers}").state["global_step"]) == 128
    rc = main(["train", "my_envs:Nope", "--servers", "0"])
    assert rc == 2
    assert "module my_envs has no 'Nope'" in capsys.readouterr().err


def test_the_rounding_of_total_steps_is_said_up_front_and_the_summary_names_the_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = tmp_path / "rec"
    rc = _train(tmp_path / "run", "--total-steps", "1000", "--record", str(rec))
    captured = capsys.readouterr()
    assert rc == 0
    assert (
        "--total-steps 1,000 is 3 updates of 256 env steps: training stops at 768" in captured.err
    )
    assert f"  recording: {runnable('simkit')} replay {rec} --verify" in captured.out


def test_train_record_into_an_existing_recording_is_refused_unless_resuming(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new run does not add its episodes to another run's recording (as ``simkit
    record`` without --append); the run that wrote it goes on there on --resume."""
    from simkit.recording import RecordingReader

    rec, run = tmp_path / "rec", tmp_path / "run"
    assert _train(run, "--total-steps", "512", "--record", str(rec)) == 0
    episodes = len(RecordingReader(rec))
    assert episodes > 0
    capsys.readouterr()
    assert _train(tmp_path / "other", "--total-steps", "512", "--record", str(rec)) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"simkit train: --record {rec} already holds a recording ({episodes} episodes); "
        "choose another DIR, or --resume the run that wrote it (its episodes go on there)"
    ]
    assert len(RecordingReader(rec)) == episodes
    resume = ["train", "simkit/CartPole-v0", "--resume", str(run), "--total-steps", "1024"]
    assert main([*resume, "--record", str(rec), "--no-progress"]) == 0
    assert len(RecordingReader(rec)) > episodes


def _interrupted(algo: str, logdir: Path, *, stop_early: bool, resume: bool = False) -> None:
    """A small run of ``algo`` stopped early (``stop_early``: fewer than 20 episodes
    before its end), or to its end; ``resume`` continues the run in ``logdir``."""
    import simkit
    from simkit.clients.learners._args import SACArgs
    from simkit.clients.learners.ppo import PPOArgs

    common: dict[str, Any] = {"logdir": logdir, "tensorboard": False, "servers": 0}
    if resume:
        common["resume"] = logdir
    if algo == "ppo":
        args = PPOArgs(
            env_id="simkit/CartPole-v0",
            num_envs=4,
            num_steps=64,
            num_minibatches=2,
            update_epochs=1,
            total_steps=64 * 4 * 8,
        )
        simkit.train(args, max_rounds=7 if stop_early else None, **common)
    else:
        sac = SACArgs(
            env_id="simkit/Pendulum-v0",
            total_steps=1200,
            num_envs=2,
            num_steps=4,
            buffer_size=2000,
            batch_size=32,
            learning_starts=64,
            hidden=(32, 32),
        )
        simkit.train(sac, max_rounds=75 if stop_early else None, **common)


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_resumed_run_reports_over_the_same_episodes_and_goes_on_with_the_wall_time(
    tmp_path: Path, algo: str
) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _interrupted(algo, straight, stop_early=False)
    _interrupted(algo, resumed, stop_early=True)

    def rows(logdir: Path) -> list[dict[str, Any]]:
        return [json.loads(x) for x in (logdir / "progress.jsonl").read_text().splitlines()]

    before = rows(resumed)[-1]
    _interrupted(algo, resumed, stop_early=False, resume=True)
    after = [r for r in rows(resumed) if r["global_step"] > before["global_step"]]
    assert after, "the resumed run wrote no progress"
    last_straight, last_resumed = rows(straight)[-1], after[-1]
    assert last_resumed["global_step"] == last_straight["global_step"]
    # The same 20 episodes; before, only those since the resume.
    assert last_resumed["mean_return"] == last_straight["mean_return"]
    assert after[0]["elapsed_s"] >= before["elapsed_s"]  # was 0 again: the time before lost


def _settings_of(*argv: str) -> Any:
    from simkit.cli import build_parser
    from simkit.clients.learners._train import plan
    from simkit.clients.learners._train_cli import train_keywords

    ns = build_parser().parse_args(["train", *argv])
    return plan(ns.env_id, **train_keywords(ns)).settings


@pytest.mark.parametrize(
    "flags",
    [
        ["simkit/Cheetah-v0", "--servers", "2", "--wait-for-servers"],
        ["simkit/Cheetah-v0", "--ray", "--servers", "2"],
        ["simkit/Cheetah-v0", "--connect", "tcp://127.0.0.1:1", "--connect", "tcp://127.0.0.1:2"],
        ["simkit/Pendulum-v0", "--algo", "sac", "--servers", "2"],
    ],
)
def test_an_unset_num_envs_gives_every_server_a_slot(flags: list[str]) -> None:
    """The README's ``--servers 2`` commands run: without --num-envs each server gets
    one env slot (the default 1 refused two servers)."""
    assert _settings_of(*flags).num_envs == 2
    assert _settings_of(*flags[:1]).num_envs == 1
    with pytest.raises(ValueError, match="--num-envs must be >= 2, got 1"):
        _settings_of(*flags, "--num-envs", "1")


def test_env_kwargs_reach_an_in_process_rollout_and_its_checkpoint(tmp_path: Path) -> None:
    """``--env-kwarg KEY=VALUE`` (``simkit serve``'s flag and parser) builds the envs
    of an in-process rollout and of the servers the run starts, is kept in the
    checkpoint and comes back on --resume (a --connect server must have been started
    with the same kwargs: tests/test_trust.py)."""
    from simkit.cli import build_parser
    from simkit.clients.learners._train_cli import train_keywords

    flags = ["--env-kwarg", "max_episode_steps=3", "--env-kwarg", "name=x"]
    ns = build_parser().parse_args(["train", "simkit/CartPole-v0", *flags])
    assert train_keywords(ns)["env_kwargs"] == {"max_episode_steps": 3, "name": "x"}
    with pytest.raises(  # the run makes one env with them before anything starts
        ValueError, match=r"^--env-kwarg max_episode_steps=3, name='x': simkit/CartPole-v0 can"
    ):
        _settings_of("simkit/CartPole-v0", *flags)
    assert _settings_of("simkit/CartPole-v0", *flags[:2]).env_kwargs == {"max_episode_steps": 3}
    with pytest.raises(ValueError, match="--env-kwarg takes KEY=VALUE, got 'oops'"):
        _settings_of("simkit/CartPole-v0", "--env-kwarg", "oops")
    run = ["train", "simkit/CartPole-v0", "--num-envs", "2", "--num-steps", "8"]
    run += ["--num-minibatches", "2", "--no-progress", "--logdir", str(tmp_path)]
    served = tmp_path / "served"
    served_run = [*run[:-1], str(served), "--servers", "1", *flags[:2]]
    assert main([*served_run, "--total-steps", "16"]) == 0
    assert load_checkpoint(served).state["args"]["env_kwargs"] == {"max_episode_steps": 3}
    assert main([*run, "--servers", "0", *flags[:2], "--total-steps", "16"]) == 0
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.state["args"]["env_kwargs"] == {"max_episode_steps": 3}
    assert (
        main(["train", "simkit/CartPole-v0", "--resume", str(tmp_path), "--total-steps", "32"]) == 0
    )
    resumed = load_checkpoint(tmp_path)
    assert resumed.state["args"]["env_kwargs"] == {"max_episode_steps": 3}
    assert _settings_of("simkit/CartPole-v0", "--resume", str(tmp_path)).env_kwargs == {
        "max_episode_steps": 3
    }


def test_connecting_to_a_dead_endpoint_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"ipc://{tmp_path}/nobody.sock"
    rc = main(
        [
            *("train", *RUN[:1], "--connect", endpoint, "--server-timeout", "0.5"),
            *("--logdir", str(tmp_path / "run")),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert len(err) == 1, err
    assert err[0].startswith(f"simkit train: no rollout server answered at {endpoint}")
    assert "simkit serve simkit/CartPole-v0 --policy" in err[0]
    assert "reconnect()" not in err[0]


def _interrupt(
    argv: list[str], ready: Any, tmp: Path, pids: list[int] | None = None
) -> tuple[int, str]:
    """Runs ``simkit *argv`` in its own process group (its pid appended to ``pids``)
    and, once ``ready()`` holds, sends SIGINT to the group (Ctrl-C in a terminal);
    returns its exit status and stderr."""
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "simkit", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=tmp,
    )
    if pids is not None:
        pids.append(proc.pid)
    try:
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1]
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err


def test_ctrl_c_during_start_up_eval_and_record_is_one_line(tmp_path: Path) -> None:
    import simkit
    from simkit.clients.learners.ppo import PPOArgs
    from simkit.recording import RecordingReader

    def spawning() -> bool:  # the learner started its servers: it is starting up
        return any(Path(f"/proc/{pid}/task/{pid}/children").read_text() for pid in pids)

    pids: list[int] = []
    rc, err = _interrupt(
        ["train", *RUN[:1], "--servers", "2", "--logdir", "run"], spawning, tmp_path, pids
    )
    assert (rc, err.strip()) == (130, "simkit train: interrupted before training started"), err
    assert not (tmp_path / "run" / "progress.jsonl").exists()

    args = PPOArgs(num_envs=2, num_steps=32, num_minibatches=2, update_epochs=1, total_steps=64)
    simkit.train(args, logdir=tmp_path / "policy", servers=0, tensorboard=False)
    started = time.monotonic()
    rc, err = _interrupt(
        ["eval", str(tmp_path / "policy"), "--episodes", "1000000"],
        lambda: time.monotonic() - started > 2.0,
        tmp_path,
    )
    assert (rc, err.strip()) == (130, "simkit eval: interrupted"), err

    out = tmp_path / "rec"
    rc, err = _interrupt(
        [*("record", *RUN[:1], "--episodes", "1000000", "--out", str(out))],
        lambda: any(out.glob("*")) and time.sleep(0.5) is None,
        tmp_path,
    )
    kept = len(RecordingReader(out))
    assert rc == 130, err
    assert err.strip() == f"simkit record: interrupted; {kept} complete episodes kept in {out}"


def test_record_into_an_existing_recording_needs_append(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.recording import RecordingReader

    out = tmp_path / "rec"
    argv = ["record", "simkit/CartPole-v0", "--episodes", "2", "--num-envs", "2", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"simkit record: --out {out} already holds a recording (2 episodes); add --append "
        "to add episodes to it, or choose another --out"
    ]
    assert len(RecordingReader(out)) == 2
    assert main([*argv, "--append"]) == 0
    assert len(RecordingReader(out)) == 4


def _ppo(env_id: str, total: int, **kw: Any) -> Any:
    from simkit.clients.learners.ppo import PPOArgs

    return PPOArgs(
        env_id=env_id,
        num_envs=2,
        num_steps=32,
        num_minibatches=2,
        update_epochs=1,
        total_steps=total,
        hidden=(16,),
        **kw,
    )


def test_a_total_below_one_update_trains_one_and_a_resume_rounds_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--total-steps 1000 with 2048-step updates trained forever (0 updates: "until
    stopped"); a resume of a finished run trained one update more."""
    import simkit

    r = simkit.train(_ppo(RUN[0], 40), logdir=tmp_path, servers=0, max_rounds=3)
    assert (r.updates, r.global_step) == (1, 64)
    assert "--total-steps 40 is 1 update of 64 env steps: training stops at 64" in (
        capsys.readouterr().err
    )
    r = simkit.train(_ppo(RUN[0], 100), logdir=tmp_path, servers=0, resume=tmp_path)
    assert (r.updates, r.global_step) == (1, 64)  # 100 // 64: one update, the one done
    assert r.complete
    r = simkit.train(_ppo(RUN[0], 130), logdir=tmp_path, servers=0, resume=tmp_path)
    assert (r.updates, r.global_step, r.complete) == (2, 128, False)


def test_a_multi_agent_run_counts_steps_as_it_said_it_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import simkit

    r = simkit.train(_ppo("simkit/GoalNav-v0", 1000), logdir=tmp_path, servers=0)
    said = re.search(r"training stops at ([\d,]+)", capsys.readouterr().err)
    assert said is not None
    assert r.global_step == int(said.group(1).replace(",", ""))


def test_a_logdir_holds_one_run_unless_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second training into a logdir, or another env into it, mixed silently
    (progress.jsonl interleaved, checkpoints overwritten); --resume continues it."""
    from simkit.recording._format import DirectoryLock

    assert _train(tmp_path, "--total-steps", "256") == 0
    capsys.readouterr()
    before = (tmp_path / "progress.jsonl").read_text()
    for argv in (RUN, ["simkit/Pendulum-v0", *RUN[1:]]):
        assert main(["train", *argv, "--logdir", str(tmp_path), "--total-steps", "512"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"simkit train: --logdir {tmp_path} holds a run already (simkit/CartPole-v0, "
            f"256 env steps): continue it with --resume {tmp_path}, or choose another --logdir"
        ]
    assert (tmp_path / "progress.jsonl").read_text() == before
    lock = DirectoryLock(tmp_path)  # a run in progress there
    try:
        rc = main(["train", *RUN, "--resume", str(tmp_path), "--total-steps", "512"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1
        assert len(err) == 1
        assert re.fullmatch(
            rf"simkit train: log directory '{tmp_path}' is already being written by pid "
            r"\d+; one run per log directory \(pick another --logdir or stop it\)",
            err[0],
        ), err[0]
    finally:
        lock.release()
    assert main(["train", *RUN, "--resume", str(tmp_path), "--total-steps", "512"]) == 0
    assert int(load_checkpoint(tmp_path).state["global_step"]) == 512


def test_reproducible_mode_says_it_is_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import simkit.clients.learners._train_cli as train_cli

    monkeypatch.setattr(train_cli, "is_pinned", lambda: True)  # as after the re-exec
    assert _train(tmp_path, "--total-steps", "256", "--reproducible") == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "simkit train: --reproducible: numeric kernels pinned to their AVX2 paths in the "
        "learner and the servers it starts (the same seed gives the same parameters on any "
        "x86-64 CPU)"
    )


@pytest.mark.parametrize("servers", ["0", "1"])
def test_a_batch_env_trains_in_process_and_through_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], servers: str
) -> None:
    """A batch env was refused with "train it through a rollout server", --servers 1
    included: its spaces were read through a local vector, which cannot hold one."""
    rc = main(
        [
            *("train", "simkit/BatchCartPole-v0", "--servers", servers, "--num-envs", "4"),
            *RUN[5:],
            *("--total-steps", "256", "--logdir", str(tmp_path)),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert int(load_checkpoint(tmp_path).state["global_step"]) == 256
    capsys.readouterr()
    assert main(["eval", str(tmp_path), "--episodes", "2"]) == 0
    assert capsys.readouterr().out.startswith("2 episodes: mean return")


def test_the_live_line_fits_the_terminal_with_the_key_fields_first() -> None:
    """At 80 columns it read "simkit... 2... 8,169 steps/s...", with no ETA at any width."""
    import io

    from rich.console import Console

    from simkit.clients.learners._progress import ProgressLine

    screen = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    line = ProgressLine(
        progress=True,
        print_every=1.0,
        env_id="simkit/Cheetah-v0",
        total=1_000_000,
        done=0,
        console=screen,
    )
    extra = ["lag 0.0", "env 48% inference 18% update 28% idle 6%", "servers 2/2"]
    line.show(8_169, 8_169.4, -12.34, extra)
    line.stop()
    key = ["simkit/Cheetah-v0", "8,169/1,000,000 steps", "8,169 steps/s", "return -12.3"]
    for width in (60, 80, 100, 200):
        text = line.text(width)
        assert len(text) <= width, text
        shown = [f for f in [*key, "ETA 2:01", *extra] if f in text]
        assert text.startswith(" ".join(shown[:5])) or text.startswith("  ".join(shown))
        assert shown == [*key, "ETA 2:01", *extra][: len(shown)]  # most important first
        assert len(shown) >= (5 if width >= 80 else 3), text
    assert "lag 0.0" in line.text(200)
    assert "─" in line.text(200)
    assert line.text(20) == "simkit/Cheetah-v0"
    assert line.text(10) == "simkit/Ch…"
    assert "ETA 2:01" in screen.file.getvalue()  # type: ignore[attr-defined]


def _result(logdir: Path) -> Any:
    """A finished four-update run's TrainResult in ``logdir``."""
    from simkit.clients.learners._run import TrainResult

    return TrainResult(
        logdir=logdir,
        checkpoint=logdir / "checkpoints" / "update-00000004",
        policy=logdir / "policy.safetensors",
        global_step=1024,
        updates=4,
        elapsed_s=1.5,
        steps_per_s=682.0,
        mean_return=21.5,
        dropped=0,
        stopped=False,
        times={"env": 1.0, "update": 0.5},
    )


def test_the_summary_never_breaks_a_path_at_80_columns(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from simkit.clients.learners._train_cli import _print_summary

    logdir = tmp_path / ("a-rather-long-directory-name-" * 3) / "run"
    result = _result(logdir)
    screen = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    _print_summary("simkit/CartPole-v0", result, console=screen)
    out = screen.file.getvalue()  # type: ignore[attr-defined]
    simkit = runnable("simkit")
    for whole in (
        f"checkpoint: {logdir}/checkpoints/update-00000004",
        f"{simkit} eval {logdir}/policy.safetensors",
        f"{simkit} train simkit/CartPole-v0 --resume {logdir}",
    ):
        assert whole in out, out
    assert "env steps" in out
    assert "1,024" in out


@pytest.mark.parametrize("verb", ["eval", "record"])
def test_eval_and_record_refuse_a_negative_seed_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    """``record --seed -1`` ended in a Gymnasium traceback, ``eval`` named no flag."""
    argv = {
        "eval": ["eval", str(tmp_path), "--seed", "-1"],
        "record": [
            *("record", RUN[0], "--episodes", "1", "--out", str(tmp_path / "r")),
            "--seed",
            "-1",
        ],
    }[verb]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"simkit {verb}: --seed must be in [0, 2**63), got -1"
    assert not (tmp_path / "r").exists()


def test_recording_into_a_folder_another_writer_holds_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.recording._format import DirectoryLock

    rec = tmp_path / "rec"
    rec.mkdir()
    lock = DirectoryLock(rec)
    try:
        rc = _train(tmp_path / "run", "--total-steps", "256", "--record", str(rec))
    finally:
        lock.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert len(err) == 1
    assert err[0].startswith(f"simkit train: recording directory '{rec}' is already being")
    assert not (tmp_path / "run" / "progress.jsonl").exists()  # refused before training


def test_record_into_the_logdir_or_a_file_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--record DIR`` equal to ``--logdir DIR`` collided with the run's own lock
    ("already being written by pid <this pid>", exit 1); a ``--record`` that is a file was
    an errno (exit 1) where ``--logdir`` of a file is one line, exit 2: both are refused
    as bad input."""
    run = tmp_path / "run"
    assert _train(run, "--total-steps", "256", "--record", str(run)) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"simkit train: --record {run} must not be the --logdir (use e.g. {run / 'rec'})"
    ]
    afile = tmp_path / "afile"
    afile.write_text("")
    assert _train(run, "--total-steps", "256", "--record", str(afile)) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"simkit train: --record {afile}: a file, not a folder"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_the_summary_quotes_paths_so_its_commands_paste(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--logdir "q run"`` printed ``simkit eval q run/policy.safetensors``, which a
    shell runs as two arguments; the held-logdir refusal said the same."""
    import shlex

    from simkit.clients.learners._train_cli import _print_summary

    logdir = tmp_path / "q run"
    result = _result(logdir)
    capsys.readouterr()
    _print_summary("simkit/CartPole-v0", result)
    out = capsys.readouterr().out
    lines = {
        line.split(": ", 1)[0].strip(): line.split(": ", 1)[1] for line in out.splitlines()[1:]
    }
    assert shlex.split(lines["evaluate"])[-1] == str(logdir / "policy.safetensors")
    assert shlex.split(lines["resume"])[-1] == str(logdir)
    assert shlex.split(lines["TensorBoard"])[-1] == str(logdir / "tb")
