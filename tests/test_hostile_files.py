"""Checkpoint and policy files edited by hand: whatever they hold, reading them ends in
one InvalidCheckpoint line, never a traceback or a line of megabytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from simkit.cli import main
from simkit.clients.learners._checkpoint import (
    POLICY_FORMAT,
    check_tensors,
    load_checkpoint,
    load_policy,
)
from simkit.errors import InvalidCheckpoint

DEEP_JSON = "[" * 100_000 + "]" * 100_000


def test_a_policy_whose_metadata_nests_past_the_recursion_limit_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``json.loads`` raised RecursionError, which ``simkit eval`` printed as a traceback."""
    path = tmp_path / "policy.safetensors"
    save_file({"w": torch.zeros(2)}, path, metadata={"format": POLICY_FORMAT, "meta": DEEP_JSON})
    with pytest.raises(InvalidCheckpoint, match=r"malformed policy metadata: .*recursion depth"):
        load_policy(path)
    assert main(["eval", str(path), "--episodes", "1"]) != 0
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err[-2000:]
    assert len(err.splitlines()) == 1, err[-2000:]


def test_a_manifest_nesting_past_the_recursion_limit_is_invalid_checkpoint(
    tmp_path: Path,
) -> None:
    (tmp_path / "manifest.json").write_text(DEEP_JSON)
    with pytest.raises(
        InvalidCheckpoint, match=r"manifest\.json: not valid JSON: .*recursion depth"
    ):
        load_checkpoint(tmp_path)


def test_tensor_names_that_differ_are_named_in_a_bounded_line() -> None:
    """A model spec of 100,000 layers listed every missing tensor: a 9 MB line."""
    expected = {f"actor.{i}.weight": torch.zeros(1) for i in range(10_000)}
    with pytest.raises(InvalidCheckpoint, match="missing 10000 ") as info:
        check_tensors(Path("policy.safetensors"), {"w": torch.zeros(1)}, expected)
    assert len(str(info.value)) < 400, str(info.value)
    assert "actor.0.weight" in str(info.value)
    assert "unexpected 1 ['w']" in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "huge", "folder"])
def test_a_key_directory_holding_something_no_key_file_is_makes_serve_one_line(
    tmp_path: Path, kind: str
) -> None:
    """``--curve-allow DIR`` reads every ``*.key`` in DIR, a folder clients may drop their
    public keys into: a FIFO named ``x.key`` blocked the server's start forever, and
    ``zmq.auth.load_certificate`` reads lines, so one endless line (``/dev/zero``) grew
    without bound. A key file is now a regular file of at most 64 KiB, or one line."""
    import os
    import subprocess
    import sys

    import zmq.auth

    keys = tmp_path / "keys"
    keys.mkdir()
    _, secret = zmq.auth.create_certificates(str(tmp_path), "server")
    zmq.auth.create_certificates(str(keys), "client")
    evil = keys / "evil.key"
    if kind == "fifo":
        os.mkfifo(evil)
    elif kind == "huge":
        evil.symlink_to("/dev/zero")
    else:
        evil.mkdir()
    argv = [sys.executable, "-m", "simkit", "serve", "simkit/CartPole-v0", "--bind"]
    argv += ["tcp://127.0.0.1:0", "--curve-secret-key", secret, "--curve-allow", str(keys)]

    def cap_memory() -> None:  # before, /dev/zero grew until this cap (a MemoryError)
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, preexec_fn=cap_memory)
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip().splitlines()
    assert len(err) == 1, err
    assert f"--curve-allow {evil}: " in err[0]
