"""PPO through rollout servers: training over a stream, losing one of two servers, and
waiting for a lost server to come back (``--wait-for-servers``)."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import simkit
from simkit.clients.learners._server_source import _started_endpoint, spawn_servers, stop_servers
from simkit.clients.learners.ppo import PPOArgs
from simkit.errors import ServerStartFailed

ARGS = {
    "env_id": "simkit/CartPole-v0",
    "num_envs": 4,
    "num_steps": 16,
    "num_minibatches": 2,
    "update_epochs": 1,
    "total_steps": 0,
    "seed": 5,
}


def test_trains_through_a_local_server(tmp_path: Path) -> None:
    r = simkit.train(PPOArgs(**ARGS), logdir=tmp_path, servers=1, max_rounds=3, tensorboard=False)
    assert r.updates == 3
    assert r.global_step == 3 * 4 * 16


def test_same_seed_same_parameters_through_a_server(tmp_path: Path) -> None:
    import torch

    from simkit.clients.learners._checkpoint import load_checkpoint

    runs = [
        simkit.train(
            PPOArgs(**ARGS), logdir=tmp_path / name, servers=1, max_rounds=3, tensorboard=False
        )
        for name in ("a", "b")
    ]
    ckpt_a, ckpt_b = runs[0].checkpoint, runs[1].checkpoint
    assert ckpt_a is not None
    assert ckpt_b is not None
    pa, pb = load_checkpoint(ckpt_a).model, load_checkpoint(ckpt_b).model
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k


@pytest.mark.parametrize(
    ("env_id", "num_envs"), [("simkit/CartPole-v0", 4), ("simkit/GoalNav-v0", 2)]
)
def test_placement_does_not_change_the_parameters(
    tmp_path: Path, env_id: str, num_envs: int
) -> None:
    """Sync mode, same seed: in process, 1 server and 2 servers train the same bits."""
    import torch

    args = {**ARGS, "env_id": env_id, "num_envs": num_envs, "num_steps": 23}
    params = [
        _params(
            simkit.train(
                PPOArgs(**args),
                logdir=tmp_path / str(servers),
                servers=servers,
                max_rounds=3,
                tensorboard=False,
            ).checkpoint
        )
        for servers in (0, 1, 2)
    ]
    for other in params[1:]:
        assert other.keys() == params[0].keys()
        for k in params[0]:
            assert torch.equal(params[0][k], other[k]), k  # type: ignore[arg-type]


def _params(path: Path | None) -> dict[str, object]:
    from simkit.clients.learners._checkpoint import load_checkpoint

    assert path is not None
    return dict(load_checkpoint(path).model)


@pytest.mark.parametrize("servers", [1, 2])
def test_resume_through_servers_is_exact(tmp_path: Path, servers: int) -> None:
    import torch

    from simkit.clients.learners._checkpoint import load_checkpoint

    args = {**ARGS, "num_steps": 37}  # episodes cross fragment boundaries
    kw = {"servers": servers, "tensorboard": False, "checkpoint_every": 2}
    full = simkit.train(PPOArgs(**args), logdir=tmp_path / "full", max_rounds=5, **kw)
    part = simkit.train(PPOArgs(**args), logdir=tmp_path / "part", max_rounds=3, **kw)
    state = load_checkpoint(tmp_path / "part").state
    assert state["source_kind"] == "servers"
    sessions = state["source"]["sessions"]
    assert [s["env_offset"] for s in sessions] == [0, 2][:servers]
    # The envs are mid-episode: the snapshot carries running episodes.
    assert any(int(s["state"]["episode_lengths"].max()) > 0 for s in sessions)
    assert part.updates == 3
    # No --servers on resume: as many local servers as the checkpoint streamed from.
    rest = simkit.train(
        PPOArgs(**args),
        logdir=tmp_path / "part",
        resume=tmp_path / "part",
        max_rounds=2,
        tensorboard=False,
    )
    assert rest.updates == full.updates == 5
    assert rest.global_step == full.global_step
    pf, pr = _params(full.checkpoint), _params(rest.checkpoint)
    for k in pf:
        assert torch.equal(pf[k], pr[k]), k  # type: ignore[arg-type]


def test_resume_with_another_server_count_names_the_layout(tmp_path: Path) -> None:
    from simkit.errors import InvalidCheckpoint

    simkit.train(PPOArgs(**ARGS), logdir=tmp_path, servers=2, max_rounds=1, tensorboard=False)
    with pytest.raises(InvalidCheckpoint, match=r"holds 2 server session\(s\).*servers=2"):
        simkit.train(
            PPOArgs(**ARGS), logdir=tmp_path, resume=tmp_path, servers=1, tensorboard=False
        )


def _kill_after_first_update(
    monkeypatch: pytest.MonkeyPatch, proc: Any, then: Callable[[], None] = lambda: None
) -> None:
    """Kills ``proc`` inside the first update's bookkeeping (its policy snapshot), so
    always mid-run however fast the updates are, then calls ``then``."""
    import simkit.clients.learners._run as train_module  # the run writes the policy snapshots

    save_policy = train_module.save_policy
    done: list[bool] = []

    def save_then_kill(*args: Any, **kwargs: Any) -> None:
        save_policy(*args, **kwargs)
        if not done:
            done.append(True)
            proc.kill()
            proc.wait()
            then()

    monkeypatch.setattr(train_module, "save_policy", save_then_kill)


def test_killed_server_is_reported_and_the_run_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    procs, endpoints = spawn_servers("simkit/CartPole-v0", 2)
    _kill_after_first_update(monkeypatch, procs[1])
    try:
        r = simkit.train(
            PPOArgs(**ARGS),
            logdir=tmp_path,
            connect=endpoints,
            max_rounds=20,
            tensorboard=False,
            server_timeout=3.0,
        )
    finally:
        stop_servers(procs)
    err = capfd.readouterr().err
    assert f"server {endpoints[1]} stopped answering" in err
    assert "going on with 1 server(s)" in err
    assert r.updates == 20


def test_spawned_servers_build_their_envs_with_env_kwargs() -> None:
    """``simkit train --servers N --env-kwarg KEY=VALUE``: the servers it starts get the
    flags (each value as JSON) and build their envs with them (before, they were
    refused); a value JSON cannot carry is refused naming the key."""
    from simkit.clients import RemoteVectorEnv

    kwargs = {"max_episode_steps": 2, "params": {"gravity": 9.5}}
    procs, endpoints = spawn_servers("simkit/CartPole-v0", 1, env_kwargs=kwargs)
    try:
        env = RemoteVectorEnv(endpoints, timeout=10.0)
        try:
            env.reset(seed=0)
            env.step(env.action_space.sample())
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            assert (terminated | truncated).all()
        finally:
            env.close()
    finally:
        stop_servers(procs)
    with pytest.raises(ValueError, match=r"env_kwargs\['model'\] must be JSON.*got object"):
        spawn_servers("simkit/CartPole-v0", 1, env_kwargs={"model": object()})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_a_server_that_does_not_start_shows_its_own_last_lines() -> None:
    """Its import error, its bind error: what the server printed, not ``''``."""
    with pytest.raises(
        ServerStartFailed, match=r"(?s)did not start \(exit 2\):.*no env registered as"
    ):
        spawn_servers("simkit/Nope-v0", 1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bind = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(
            ServerStartFailed, match=rf"cannot bind '{bind}': Address already in use"
        ):
            spawn_servers("simkit/CartPole-v0", 1, binds=[bind])


def test_a_started_server_that_goes_on_printing_never_blocks_on_its_pipe() -> None:
    """After the line that names its endpoint nobody waits on a server's output: it is
    read and dropped, so a server that logs a lot (lost sessions, warnings) never
    blocks on a full pipe."""
    talker = (
        "import sys; print('simkit serve: serving x on tcp://127.0.0.1:5555', flush=True); "
        "sys.stdout.write(('a lost session ' * 8 + '\\n') * 16384); sys.stdout.flush()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", talker], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert _started_endpoint(proc, "x") == "tcp://127.0.0.1:5555"
        assert proc.wait(timeout=30) == 0  # 2 MB through a 64 KiB pipe
    finally:
        stop_servers([proc])


def test_simkit_train_says_in_one_line_why_its_server_did_not_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The server's own lines, no traceback, exit 1."""
    from simkit.cli import main

    def fail(env_id: str, count: int, **_: Any) -> Any:
        raise ServerStartFailed(f"simkit serve {env_id} did not start (exit 1):\nImportError: x")

    monkeypatch.setattr("simkit.clients.learners._sources.spawn_servers", fail)
    code = main(["train", "simkit/CartPole-v0", "--logdir", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert "simkit train: simkit serve simkit/CartPole-v0 did not start (exit 1):" in err
    assert "ImportError: x" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("env_id", ["simkit/CartPole-v0", "gym:CartPole-v1"])
def test_wait_for_servers_reconnects_to_a_restarted_server(
    env_id: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second server is killed after the first update and restarted on its port
    3 s later. simkit envs continue from the boundary snapshot; a Gymnasium env has
    none: its session reopens with fresh envs, and the run says at start and in its
    result that such a continuation is not exact."""
    binds = [f"tcp://127.0.0.1:{_free_port()}" for _ in range(2)]
    procs, endpoints = spawn_servers(env_id, 2, binds=binds)
    restarted: list = []  # type: ignore[type-arg]  # Popen of the restarted server

    def restart() -> None:
        time.sleep(3.0)  # longer than the server timeout: the learner notices and waits
        more, _ = spawn_servers(env_id, 1, binds=[binds[1]])
        restarted.extend(more)

    killer = threading.Thread(target=restart, daemon=True)
    _kill_after_first_update(monkeypatch, procs[1], then=killer.start)
    try:
        r = simkit.train(
            PPOArgs(**{**ARGS, "env_id": env_id}),
            logdir=tmp_path,
            connect=endpoints,
            max_rounds=6,
            tensorboard=False,
            server_timeout=1.0,
            wait_for_servers=True,
        )
        killer.join(timeout=30)
    finally:
        stop_servers(procs + restarted)
    err = capfd.readouterr().err
    assert f"server {endpoints[1]} stopped answering" in err
    assert "waiting for it to come back" in err
    assert f"server {endpoints[1]} is back" in err
    assert "going on with" not in err
    assert restarted
    # Every update had both servers' rows: the run never went on with one.
    assert r.updates == 6
    assert r.global_step == 6 * 4 * 16
    if env_id.startswith("gym:"):
        assert "its envs restart from seed" in err
        assert err.index("have no snapshots") < err.index("stopped answering")  # at start
        assert r.not_exact is not None
        assert "have no snapshots" in r.not_exact
    else:
        assert "its session restored at version 1's boundary" in err
        assert r.not_exact is None


class _FakeStream:
    """Two servers' fragments; ``b`` fails after delivering one, with two more queued."""

    def __init__(self) -> None:
        from simkit.clients.remote._connection import ServerUnavailable

        self.version = 0
        self.endpoints = ["a", "b"]
        self.script: list[object] = [
            ("a", 0),
            ("b", 0),
            ("a", 1),
            ServerUnavailable("b", 1.0, "a fragment"),
            ("a", 2),
        ]
        self.queued_b = [("b", 1), ("b", 2)]

    def next_fragment(self) -> object:
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def server_config(self, endpoint: str) -> object:
        return None

    def remove_server(self, endpoint: str) -> list[object]:
        self.endpoints.remove(endpoint)
        kept, self.queued_b = self.queued_b, []
        return kept


def test_a_lost_servers_received_fragments_all_reach_the_learner() -> None:
    from simkit.clients.learners._server_source import ServerSource

    lines: list[str] = []
    source = ServerSource.__new__(ServerSource)  # the failure policy alone, on a fake stream
    source.stream = _FakeStream()  # type: ignore[assignment]  # duck-typed PolicyStream
    source.report = lines.append
    source.locate = None  # unsupervised: a lost server is dropped
    source.give_up = lambda: False
    source.mode = "sync"
    source.lost = []
    source.restored = []
    source.dropped = 0
    source._kept = []
    source._failed = None
    source._boundary = None
    got = []
    for item in source.fragments():
        got.append(item)
        if len(got) == 7:
            break
    # Everything b sent before it died is handed over, then None (rows changed).
    assert got == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2), None, ("a", 2)]
    assert source.lost == ["b"]
    assert "server b stopped answering" in lines[0]
    assert "kept its 2 received fragment(s), going on with 1 server(s): ['a']" in lines[0]


def test_a_sigkilled_learner_leaves_no_local_server_behind(tmp_path: Path) -> None:
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    learner = subprocess.Popen(
        [
            *(sys.executable, "-m", "simkit", "train", "simkit/CartPole-v0", "--servers", "1"),
            *("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2"),
            *("--total-steps", "0", "--no-progress", "--logdir", str(tmp_path)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "progress.jsonl").exists():
        assert learner.poll() is None, "the learner exited before training"
        assert time.monotonic() < deadline, "the learner did not start training in 60 s"
        time.sleep(0.1)
    children = [
        int(pid)
        for task in Path(f"/proc/{learner.pid}/task").iterdir()
        for pid in (task / "children").read_text().split()
    ]
    assert children, "the learner started no server process"
    learner.send_signal(signal.SIGKILL)
    learner.wait()
    deadline = time.monotonic() + 10
    for pid in children:
        while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
            assert time.monotonic() < deadline, f"server {pid} outlived its learner by 10 s"
            time.sleep(0.1)
        with contextlib.suppress(ChildProcessError):  # not our child: init reaps it
            os.waitpid(pid, os.WNOHANG)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


_LOSE_THE_SERVER = {
    "ppo": (
        "simkit.clients.learners._run",
        [
            *("simkit/CartPole-v0", "--num-envs", "4", "--num-steps", "16"),
            *("--num-minibatches", "2", "--update-epochs", "1"),
        ],
    ),
    "sac": (
        "simkit.clients.learners._run",
        [
            *("simkit/Pendulum-v0", "--algo", "sac", "--num-envs", "2", "--num-steps", "4"),
            *("--learning-starts", "16", "--batch-size", "8", "--buffer-size", "100"),
            *("--hidden", "8", "--checkpoint-steps", "8"),
        ],
    ),
}


@pytest.mark.parametrize("algo", sorted(_LOSE_THE_SERVER))
def test_losing_the_last_server_checkpoints_and_ends_in_one_line(
    algo: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import importlib

    import simkit.clients.learners._sources as rollout_module
    from simkit.cli import main

    module_name, flags = _LOSE_THE_SERVER[algo]
    train_module = importlib.import_module(module_name)

    spawned: list[Any] = []
    real_spawn = rollout_module.spawn_servers

    def spawn(*args: Any, **kwargs: Any) -> Any:
        procs, endpoints = real_spawn(*args, **kwargs)
        spawned.extend(procs)
        return procs, endpoints

    monkeypatch.setattr(rollout_module, "spawn_servers", spawn)
    save_policy = train_module.save_policy

    def save_then_kill(*args: Any, **kwargs: Any) -> None:
        save_policy(*args, **kwargs)
        if spawned and spawned[0].poll() is None:
            spawned[0].kill()
            spawned[0].wait()

    monkeypatch.setattr(train_module, "save_policy", save_then_kill)
    rc = main(
        [
            *("train", *flags, "--servers", "1", "--total-steps", "0"),
            *("--server-timeout", "1", "--no-progress", "--logdir", str(tmp_path)),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert err[-1].startswith("simkit train: every rollout server was lost")
    resume = "--algo sac --resume" if algo == "sac" else "--resume"
    assert f"{resume} {tmp_path}" in err[-1]
    from simkit.clients.learners._checkpoint import load_checkpoint

    state = load_checkpoint(tmp_path).state
    if algo == "ppo":
        assert int(state["version"]) >= 1  # the update made before the loss is kept
        assert state["source"]["servers"] == 1  # a resume starts one server again
    else:
        assert int(state["counters"]["global_step"]) >= 8  # the rounds before the loss
        assert state["servers"] == 1


@pytest.mark.parametrize("servers", [0, 1])
@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_gym_runs_checkpoint_and_resume_say_they_are_not_exact(
    algo: str, servers: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A Gymnasium env has no snapshots: its checkpoints hold no env states and a
    resume restarts the envs afresh: the run, in process (SAC's default) or through a
    server, says so when it checkpoints and when it resumes."""
    env = "gym:Pendulum-v1"
    if algo == "ppo":
        ppo = PPOArgs(**{**ARGS, "env_id": env, "num_envs": 2})
        kw: dict[str, Any] = {"servers": servers, "tensorboard": False}
        simkit.train(ppo, logdir=tmp_path, max_rounds=2, **kw)
        err = capfd.readouterr().err
        r = simkit.train(ppo, logdir=tmp_path, resume=tmp_path, max_rounds=1, **kw)
    else:
        from simkit.clients.learners._args import SACArgs

        sac = SACArgs(
            env_id=env,
            num_envs=2,
            num_steps=4,
            total_steps=32,
            learning_starts=16,
            batch_size=8,
            buffer_size=100,
            hidden=(8,),
        )
        simkit.train(sac, logdir=tmp_path, servers=servers, tensorboard=False, checkpoint_steps=16)
        err = capfd.readouterr().err
        sac = dataclasses.replace(sac, total_steps=48)
        r = simkit.train(sac, logdir=tmp_path, resume=tmp_path, servers=servers, tensorboard=False)
    assert f"the envs of {env} have no snapshots: a resume from a checkpoint restarts" in err
    assert "does not continue exactly" in err
    resumed = capfd.readouterr().err
    assert "the checkpoint holds no env states" in resumed
    assert "does not continue exactly where the checkpointed one stopped" in resumed
    assert r.not_exact == f"the envs of {env} have no snapshots"


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_recording_the_run_cannot_open_stops_it_before_anything_starts(
    algo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``record`` held by another writer: the run (from Python, not only the CLI, which
    checks the lock itself) raises before it starts a server or takes over Ctrl-C, so
    nothing is left running and Ctrl-C still interrupts the caller."""
    import signal

    import simkit
    from simkit.clients.learners._args import SACArgs
    from simkit.errors import RecordingLocked
    from simkit.recording import FragmentRecorder

    started: list[Any] = []

    def spawn(*a: Any, **kw: Any) -> Any:
        procs, endpoints = spawn_servers(*a, **kw)
        started.extend(procs)
        return procs, endpoints

    monkeypatch.setattr("simkit.clients.learners._sources.spawn_servers", spawn)
    env_id = "simkit/CartPole-v0" if algo == "ppo" else "simkit/Cheetah-v0"
    held = FragmentRecorder(tmp_path / "rec", env_id, root_seed=1)
    handler = signal.getsignal(signal.SIGINT)
    kw: dict[str, Any] = {"logdir": tmp_path / "run", "servers": 1, "record": tmp_path / "rec"}

    def run() -> None:
        if algo == "ppo":
            simkit.train(PPOArgs(**ARGS), tensorboard=False, **kw)
        else:
            sac = SACArgs(env_id=env_id, num_envs=1, total_steps=64, learning_starts=32)
            simkit.train(sac, tensorboard=False, **kw)

    try:
        with pytest.raises(RecordingLocked):
            run()
    finally:
        held.close()
        stop_servers(started)
    assert started == []
    assert signal.getsignal(signal.SIGINT) is handler


@pytest.mark.parametrize("wait", [False, True], ids=["dropped", "replaced"])
def test_a_server_restarted_between_updates_is_a_lost_server(tmp_path: Path, wait: bool) -> None:
    """A server restarted on its endpoint while the learner updated answered the next
    weights with "this connection has no stream session" (the socket reconnects by
    itself), which ended the run, with or without wait_for_servers. It is a lost
    server now: dropped (its rows gone), or with wait_for_servers its session reopened."""
    from simkit.clients.learners._server_source import ServerSource
    from simkit.models import ModelSpec, build_model
    from simkit.servers import RolloutServer

    cartpole = "simkit/CartPole-v0"
    binds = [f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"]
    servers = [RolloutServer(cartpole, 2, e, policy=True, device="cpu").start() for e in binds]
    lines: list[str] = []
    spec = ModelSpec("mlp", {"hidden_sizes": [16]})
    src = ServerSource(
        binds, spec, env_id=cartpole, num_envs=2, num_steps=16, seed=0, timeout=5.0,
        wait_for_servers=wait, report=lines.append,
    )  # fmt: skip
    try:
        model = build_model(spec, src.observation_space, src.action_space)
        fragments = src.fragments()
        src.push_weights(model, version=0)
        assert [next(fragments) is not None for _ in range(2)] == [True, True]
        servers[1].stop()
        servers.append(RolloutServer(cartpole, 2, binds[1], policy=True, device="cpu").start())
        src.push_weights(model, version=1)
        fresh, lost = [], False  # a dropped server's loss is a None among the fragments
        while len(fresh) < (2 if wait else 1) or not (wait or lost):
            f = next(fragments)
            lost = lost or f is None
            if f is not None and f.policy_version.max() == 1:
                fresh.append(f)
        said = "\n".join(lines)
        assert f"server {binds[1]} restarted: it answers, but its stream session is gone" in said
        assert (f"server {binds[1]} is back" in said) is wait
        assert src.stream.endpoints == (binds if wait else binds[:1])
    finally:
        src.close()
        for s in servers:
            s.stop()
