"""No peer and no file chooses what code runs: env ids a stream peer sends, or a
recording or policy file holds, are refused before anything is imported unless the
operator or user named them; and ``--env-kwarg`` builds the same envs in every
placement, because the servers build only what their operator gave them."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simkit
from simkit.cli import main as simkit_main
from simkit.clients import PolicyStream
from simkit.errors import UnknownEnv, UntrustedEnv
from simkit.models import ModelSpec
from simkit.protocol import EnvNotAllowed, RemoteError
from simkit.registry import check_trusted, names_code
from simkit.servers import RolloutServer
from simkit.servers._stream_settings import StreamSettings

CARTPOLE = "simkit/CartPole-v0"
SPEC = ModelSpec("mlp", {"hidden_sizes": [8]})

EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")

from simkit.envs.cartpole import CartPole


class Evil(CartPole):
    pass
"""


@pytest.fixture
def evil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module ``evilmod`` on ``sys.path`` that writes the returned marker file when
    imported (and holds a real env class ``Evil``); the marker must never appear where
    nobody named the module."""
    folder = tmp_path / "mods"
    folder.mkdir()
    marker = tmp_path / "IMPORTED"
    (folder / "evilmod.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    sys.modules.pop("evilmod", None)
    yield marker
    sys.modules.pop("evilmod", None)


def test_names_code_tells_ids_that_import_modules_from_those_that_do_not() -> None:
    assert names_code("os:system")
    assert names_code("evilmod:Evil")
    assert names_code("gym:evilmod:Evil-v0")  # Gymnasium imports the module first
    assert not names_code(CARTPOLE)
    assert not names_code("gym:CartPole-v1")


def test_check_trusted_refuses_unnamed_code_and_overlong_ids_and_passes_named_ones() -> None:
    with pytest.raises(UntrustedEnv, match=r"'os:system'.*--trust os:system"):
        check_trusted("os:system")
    check_trusted("evilmod:Evil", ["evilmod:Evil"])  # named: allowed (nothing imported here)
    check_trusted(CARTPOLE)
    with pytest.raises(UnknownEnv, match="1 to 256 characters, got 120000"):
        check_trusted("x" * 120_000)
    with pytest.raises(TypeError, match="must be a str, got int"):
        check_trusted(7)  # type: ignore[arg-type]


def test_a_module_colon_name_must_be_a_class_not_any_callable() -> None:
    """``simkit train os:system`` named by a user is still not an env class: one line."""
    with pytest.raises(UnknownEnv, match=r"'os:system' is not an env class"):
        simkit.spec("os:system")


def test_admit_env_builds_only_the_operators_envs_with_the_operators_kwargs() -> None:
    s = StreamSettings(
        env_id=CARTPOLE, env_kwargs={"max_episode_steps": 5}, num_envs=1, allowed_envs=("x/Y-v0",)
    )
    assert s.admit_env(None, {}) == (CARTPOLE, {"max_episode_steps": 5})
    assert s.admit_env(CARTPOLE, {"max_episode_steps": 5}) == (CARTPOLE, {"max_episode_steps": 5})
    assert s.admit_env("x/Y-v0", {}) == ("x/Y-v0", {})
    with pytest.raises(EnvNotAllowed, match="only the envs its operator named") as info:
        s.admit_env("os:system", {"command": "id"})
    assert info.value.code == "env_not_allowed"
    with pytest.raises(EnvNotAllowed, match="only with the kwargs its operator gave"):
        s.admit_env(CARTPOLE, {})  # the learner asks for other envs than the server builds
    with pytest.raises(EnvNotAllowed, match="only with the kwargs"):
        s.admit_env("x/Y-v0", {"render_mode": "human"})


@pytest.fixture(scope="module")
def policy_server() -> Iterator[RolloutServer]:
    srv = RolloutServer(
        CARTPOLE,
        2,
        "tcp://127.0.0.1:0",
        policy=True,
        device="cpu",
        fragment_length=4,
        env_kwargs={"max_episode_steps": 5},
        allow_envs=["simkit/Pendulum-v0"],
    ).start()
    yield srv
    srv.stop()


def _open(endpoint: str, **kw: Any) -> None:
    with PolicyStream(endpoint, SPEC, num_envs=2, seed=1, timeout=20, **kw) as stream:
        assert stream.observation_space is not None


@pytest.mark.parametrize(
    ("env_id", "env_kwargs"),
    [
        ("evilmod:Evil", {}),
        ("os:system", {"command": "touch IMPORTED"}),
        ("gym:evilmod:Evil-v0", {}),
        ("simkit/Cheetah-v0", {}),  # registered, but not what this server serves
        (CARTPOLE, {"max_episode_steps": 500}),  # the served id with other kwargs
    ],
)
def test_a_stream_asking_for_another_env_is_refused_before_import_and_the_server_goes_on(
    policy_server: RolloutServer, evil: Path, env_id: str, env_kwargs: dict[str, Any]
) -> None:
    with pytest.raises(RemoteError) as info:
        _open(policy_server.endpoint, env_id=env_id, env_kwargs=env_kwargs)
    assert info.value.remote_code == "env_not_allowed"
    assert "operator" in str(info.value)
    if env_id != CARTPOLE:  # the message alone (what a learner prints) names both ids
        assert f"{CARTPOLE} or simkit/Pendulum-v0, not {env_id}" in str(info.value)
    assert not evil.exists()
    assert "evilmod" not in sys.modules
    _open(policy_server.endpoint)  # the server keeps serving
    _open(policy_server.endpoint, env_id=CARTPOLE, env_kwargs={"max_episode_steps": 5})
    _open(policy_server.endpoint, env_id="simkit/Pendulum-v0")  # --allow-env


def test_serve_refuses_an_unknown_allow_env_at_start() -> None:
    assert simkit_main(["serve", CARTPOLE, "--policy", "--allow-env", "nope/Nope-v0"]) == 2


def _train(logdir: Path, *extra: str) -> str:
    """sha256 of the policy a two-update CartPole run with ``max_episode_steps=5`` trains."""
    argv = [
        "train",
        CARTPOLE,
        "--num-envs",
        "4",
        "--num-steps",
        "16",
        "--total-steps",
        "128",
        "--hidden",
        "8",
        "--logdir",
        str(logdir),
        "--no-progress",
        *extra,
    ]
    assert simkit_main(argv) == 0
    return hashlib.sha256((logdir / "policy.safetensors").read_bytes()).hexdigest()


@pytest.mark.slow
def test_env_kwarg_gives_one_result_in_process_on_servers_and_over_connect(
    tmp_path: Path,
) -> None:
    """Through the stream path: the servers ``simkit train`` starts build the learner's
    ``--env-kwarg``, and a ``--connect`` server started with the same kwargs gives the
    same bits; one started without them refuses the learner in one line."""
    kw = ["--env-kwarg", "max_episode_steps=5"]
    local = _train(tmp_path / "local", *kw, "--servers", "0")
    assert _train(tmp_path / "one", *kw, "--servers", "1") == local
    assert _train(tmp_path / "two", *kw, "--servers", "2") == local
    assert _train(tmp_path / "plain", "--servers", "0") != local  # the kwarg matters
    srv = RolloutServer(
        CARTPOLE,
        4,
        "tcp://127.0.0.1:0",
        policy=True,
        device="cpu",
        env_kwargs={"max_episode_steps": 5},
    ).start()
    try:
        assert _train(tmp_path / "connect", *kw, "--connect", srv.endpoint) == local
        argv = ["train", CARTPOLE, "--connect", srv.endpoint, "--total-steps", "128"]
        argv += ["--num-envs", "4", "--num-steps", "16", "--logdir", str(tmp_path / "bad")]
        assert simkit_main([*argv, "--no-progress"]) != 0
    finally:
        srv.stop()


def _record_evil(directory: Path) -> None:
    """Two CartPole episodes recorded under the id ``evilmod:Evil`` (imported here, where
    the test names it)."""
    from simkit.recording import RecordEpisodes
    from simkit.vector import VectorEnv

    evilmod = __import__("evilmod")
    vec = VectorEnv([evilmod.Evil, evilmod.Evil])
    env = RecordEpisodes(vec, directory, env_id="evilmod:Evil")
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    done = 0
    while done < 2:
        _, _, term, trunc, _ = env.step(rng.integers(0, 2, size=2))
        done += int(np.sum(term | trunc))
    env.close()


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from simkit.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_replay_of_a_recording_naming_a_module_imports_nothing_unless_trusted(
    tmp_path: Path, evil: Path
) -> None:
    _record_evil(tmp_path / "rec")
    evil.unlink()
    out = _cli("replay", str(tmp_path / "rec"), "--verify", "--workers", "1", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "UntrustedEnv" in out.stdout
    assert "--trust evilmod:Evil" in out.stdout
    assert "Traceback" not in out.stderr
    assert not evil.exists()
    out = _cli("replay", str(tmp_path / "rec"), "--verify", "--trust", "evilmod:Evil", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "episodes replayed bit for bit" in out.stdout
    assert evil.exists()


def _evil_policy(tmp_path: Path) -> Path:
    """A valid policy file whose metadata names the env ``evilmod:Evil``."""
    from simkit.clients.learners._checkpoint import load_policy, save_policy

    logdir = tmp_path / "run"
    _train(logdir, "--servers", "0")
    tensors, meta = load_policy(logdir / "policy.safetensors")
    path = tmp_path / "p.safetensors"
    save_policy(path, tensors, {**meta, "env_id": "evilmod:Evil"})
    return path


def test_eval_of_a_policy_naming_a_module_imports_nothing_unless_trusted(
    tmp_path: Path, evil: Path
) -> None:
    path = _evil_policy(tmp_path)
    out = _cli("eval", str(path), "--episodes", "1", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1
    assert "--trust evilmod:Evil" in out.stderr
    assert not evil.exists()
    with pytest.raises(UntrustedEnv, match="evilmod:Evil"):
        simkit.load_policy(path)  # the Python API refuses by default too
    assert not evil.exists()
    out = _cli("eval", str(path), "--episodes", "1", "--trust", "evilmod:Evil", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert evil.exists()


def test_buffer_from_a_recording_of_another_env_imports_nothing(tmp_path: Path, evil: Path) -> None:
    """``--buffer-from`` builds only the env the command line names: a recording naming a
    module is refused in one line before that module is imported."""
    _record_evil(tmp_path / "rec")
    evil.unlink()
    out = _cli(
        "train",
        "simkit/Pendulum-v0",
        "--algo",
        "sac",
        "--servers",
        "0",
        "--buffer-from",
        str(tmp_path / "rec"),
        "--total-steps",
        "10",
        "--learning-starts",
        "5",
        "--logdir",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert "was recorded on 'evilmod:Evil'" in out.stderr
    assert "Traceback" not in out.stderr
    assert not evil.exists()


@pytest.mark.slow
def test_train_connects_to_a_curve_server_with_its_key_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server bound with CURVE admitted no ``simkit train --connect``: the learner had
    no flags for keys. With ``--curve-server-key`` and ``--curve-secret-key`` it trains
    the bits of an in-process run; without them it is refused."""
    import zmq.auth

    keys = tmp_path / "keys"
    keys.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(keys, "server")
    client_public, client_secret = zmq.auth.create_certificates(keys, "learner")
    srv = RolloutServer(
        CARTPOLE,
        4,
        "tcp://127.0.0.1:0",
        policy=True,
        device="cpu",
        curve_secret_key=zmq.auth.load_certificate(server_secret)[1],
        curve_allowed_clients=[zmq.auth.load_certificate(client_public)[0]],
    ).start()
    curve = ["--curve-server-key", server_public, "--curve-secret-key", client_secret]
    try:
        local = _train(tmp_path / "local", "--servers", "0")
        assert _train(tmp_path / "curve", "--connect", srv.endpoint, *curve) == local
        argv = ["train", CARTPOLE, "--connect", srv.endpoint, "--server-timeout", "1"]
        argv += ["--logdir", str(tmp_path / "plain"), "--no-progress"]
        capsys.readouterr()
        assert simkit_main(argv) == 1
        err = capsys.readouterr().err
        assert f"no rollout server answered at {srv.endpoint}" in err
        assert "a server with CURVE answers only learners holding its keys" in err
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "flags",
    [
        ["--connect", "tcp://127.0.0.1:1", "--curve-server-key", "k"],
        ["--connect", "tcp://127.0.0.1:1", "--curve-secret-key", "k"],
        ["--servers", "1", "--curve-server-key", "k", "--curve-secret-key", "k"],
    ],
)
def test_curve_key_flags_go_together_with_connect(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", CARTPOLE, *flags, "--logdir", str(tmp_path / "run"), "--no-progress"]
    assert simkit_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("simkit train: --curve-server-key and --curve-secret-key go together")
    assert not (tmp_path / "run").exists()


def test_curve_key_files_that_hold_no_keys_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("not a certificate\n")
    argv = ["train", CARTPOLE, "--connect", "tcp://127.0.0.1:1", "--no-progress"]
    argv += ["--curve-server-key", str(bad), "--curve-secret-key", str(bad)]
    argv += ["--logdir", str(tmp_path / "run")]
    assert simkit_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"simkit train: --curve-server-key {bad} / --curve-secret-key {bad}: ")


def _policy_with_env(tmp_path: Path, env_id: str, env_kwargs: dict[str, Any]) -> Path:
    """A valid CartPole policy file whose metadata names ``env_id`` and ``env_kwargs``."""
    from simkit.clients.learners._checkpoint import load_policy, save_policy

    logdir = tmp_path / "run"
    _train(logdir, "--servers", "0")
    tensors, meta = load_policy(logdir / "policy.safetensors")
    path = tmp_path / "p.safetensors"
    save_policy(path, tensors, {**meta, "env_id": env_id, "env_kwargs": env_kwargs})
    return path


@pytest.mark.parametrize(
    ("env_id", "env_kwargs", "named"),
    [
        ("simkit/GoalNav-v0", {"n_agents": 10**9}, "n_agents"),
        (CARTPOLE, {"no_such_argument": 1}, "no_such_argument"),
    ],
)
def test_env_kwargs_a_policy_file_holds_that_its_env_refuses_are_one_line(
    tmp_path: Path, env_id: str, env_kwargs: dict[str, Any], named: str
) -> None:
    """A file's env_kwargs size and configure the env it names: GoalNav's
    ``n_agents=10**9`` built a billion agent names and spaces (the machine out of memory),
    a kwarg the env does not take was a bare TypeError. Both are InvalidCheckpoint,
    naming the file's env_kwargs, before anything large is allocated."""
    from simkit.errors import InvalidCheckpoint

    path = _policy_with_env(tmp_path, env_id, env_kwargs)
    with pytest.raises(InvalidCheckpoint, match=rf"env_kwargs.*{named}"):
        simkit.load_policy(path)
    out = _cli("eval", str(path), "--episodes", "1", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert named in out.stderr


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ({"name": "no_such_model", "kwargs": {}}, "no_such_model"),
        ({"name": "mlp", "kwargs": {"no_such_argument": 1}}, "no_such_argument"),
        ({"name": "mlp", "kwargs": {"hidden_sizes": [10**9, 10**9]}}, "memory"),
    ],
)
def test_a_model_spec_a_policy_file_holds_that_cannot_be_built_is_one_line(
    tmp_path: Path, model: dict[str, Any], named: str
) -> None:
    """An unknown model name or kwargs the model does not take ended ``simkit eval`` with
    an UnknownModel/TypeError traceback; they are InvalidCheckpoint, naming the spec."""
    from simkit.clients.learners._checkpoint import load_policy, save_policy
    from simkit.errors import InvalidCheckpoint

    logdir = tmp_path / "run"
    _train(logdir, "--servers", "0")
    tensors, meta = load_policy(logdir / "policy.safetensors")
    path = tmp_path / "p.safetensors"
    save_policy(path, tensors, {**meta, "model": model})
    with pytest.raises(InvalidCheckpoint, match=named):
        simkit.load_policy(path)
    out = _cli("eval", str(path), "--episodes", "1", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
