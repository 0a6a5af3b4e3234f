"""The PPO learner: GAE, determinism, exact resume, checkpoints, SIGINT, multi-agent learning."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from simkit.clients._checkpoint import load_checkpoint
from simkit.clients._train import _policy_meta, build_model, evaluate_policy, run_training
from simkit.clients.ppo import PPOArgs, compute_gae
from simkit.errors import InvalidCheckpoint

TINY = {
    "env_id": "simkit/CartPole-v0",
    "num_envs": 2,
    "num_steps": 32,
    "num_minibatches": 2,
    "update_epochs": 2,
    "total_steps": 64 * 20,
    "seed": 3,
}


def _params(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path).model


def test_gae_hand_computed_with_truncation_bootstrap() -> None:
    # T=3, R=1: step 0 ordinary, step 1 truncated (bootstrap from final value 5),
    # step 2 ordinary (bootstrap from last value 2); then a terminated row.
    g, lam = 0.9, 0.5
    rewards = np.array([[1.0], [2.0], [3.0]])
    values = np.array([[0.5], [1.0], [1.5]], dtype=np.float32)
    term = np.zeros((3, 1), dtype=bool)
    trunc = np.array([[False], [True], [False]])
    final = np.array([[0.0], [5.0], [0.0]], dtype=np.float32)
    last = np.array([2.0], dtype=np.float32)
    adv, ret = compute_gae(rewards, values, term, trunc, final, last, gamma=g, lam=lam)
    d2 = 3.0 + g * 2.0 - 1.5
    d1 = 2.0 + g * 5.0 - 1.0  # truncated: final value, and the chain stops here
    d0 = 1.0 + g * 1.0 - 0.5
    expected = np.array([[d0 + g * lam * d1], [d1], [d2]])
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(ret, expected + values, rtol=1e-6)
    # Termination: no bootstrap at all, even with a final value present.
    adv_t, _ = compute_gae(
        rewards, values, trunc, np.zeros_like(trunc), final, last, gamma=g, lam=lam
    )
    assert adv_t[1, 0] == pytest.approx(2.0 - 1.0)


def test_same_seed_same_parameters(tmp_path: Path) -> None:
    a = run_training(PPOArgs(**TINY), logdir=tmp_path / "a", max_updates=4, tensorboard=False)
    b = run_training(PPOArgs(**TINY), logdir=tmp_path / "b", max_updates=4, tensorboard=False)
    assert a.checkpoint is not None
    assert b.checkpoint is not None
    pa, pb = _params(a.checkpoint), _params(b.checkpoint)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    c = run_training(
        PPOArgs(**{**TINY, "seed": 4}), logdir=tmp_path / "c", max_updates=4, tensorboard=False
    )
    assert c.checkpoint is not None
    assert not torch.equal(_params(c.checkpoint)["actor.0.weight"], pa["actor.0.weight"])


@pytest.mark.parametrize("env_id", ["simkit/CartPole-v0", "simkit/GoalNav-v0"])
def test_resume_is_exact(tmp_path: Path, env_id: str) -> None:
    args = {**TINY, "env_id": env_id, "num_steps": 37}  # episodes cross fragment boundaries
    full = run_training(PPOArgs(**args), logdir=tmp_path / "full", max_updates=5, tensorboard=False)
    part = run_training(PPOArgs(**args), logdir=tmp_path / "part", max_updates=3, tensorboard=False)
    assert part.checkpoint is not None
    state = load_checkpoint(part.checkpoint).state
    assert state["source"]["vector"] is not None  # envs resume mid-episode from snapshots
    rest = run_training(
        PPOArgs(**args),
        logdir=tmp_path / "part",
        resume=tmp_path / "part",
        max_updates=2,
        tensorboard=False,
    )
    assert rest.updates == full.updates == 5
    assert rest.global_step == full.global_step
    assert full.checkpoint is not None
    assert rest.checkpoint is not None
    pf, pr = _params(full.checkpoint), _params(rest.checkpoint)
    for k in pf:
        assert torch.equal(pf[k], pr[k]), k
    of, orr = load_checkpoint(full.checkpoint).optimizer, load_checkpoint(rest.checkpoint).optimizer
    for i in of["state"]:
        for key in of["state"][i]:
            assert torch.equal(of["state"][i][key], orr["state"][i][key])


def test_corrupt_and_truncated_checkpoints_name_the_file(tmp_path: Path) -> None:
    r = run_training(PPOArgs(**TINY), logdir=tmp_path, max_updates=1, tensorboard=False)
    assert r.checkpoint is not None
    ckpt = r.checkpoint
    model_file = ckpt / "model.safetensors"
    data = model_file.read_bytes()
    model_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidCheckpoint, match=r"model\.safetensors: truncated"):
        load_checkpoint(ckpt)
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    model_file.write_bytes(bytes(flipped))
    with pytest.raises(InvalidCheckpoint, match=r"model\.safetensors: corrupt"):
        run_training(PPOArgs(**TINY), logdir=tmp_path / "x", resume=ckpt, tensorboard=False)
    model_file.write_bytes(data)
    (ckpt / "manifest.json").write_text("{not json")
    with pytest.raises(InvalidCheckpoint, match=r"manifest\.json: not valid JSON"):
        load_checkpoint(ckpt)
    (ckpt / "manifest.json").unlink()
    with pytest.raises(InvalidCheckpoint, match=r"not a checkpoint|manifest\.json: missing"):
        load_checkpoint(ckpt)
    with pytest.raises(InvalidCheckpoint, match=r"nowhere: not a checkpoint"):
        load_checkpoint(tmp_path / "nowhere")
    policy = tmp_path / "policy.safetensors"
    policy.write_bytes(policy.read_bytes()[:20])
    with pytest.raises(InvalidCheckpoint, match=r"policy\.safetensors: not a valid safetensors"):
        evaluate_policy(policy, episodes=1)


def test_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    r = run_training(PPOArgs(**TINY), logdir=tmp_path, max_updates=1, tensorboard=False)
    assert r.checkpoint is not None
    model = build_model(PPOArgs(**{**TINY, "hidden": (32,)}))
    from simkit.clients._checkpoint import check_tensors

    with pytest.raises(InvalidCheckpoint, match=r"model\.safetensors: tensor names differ"):
        check_tensors(
            r.checkpoint / "model.safetensors",
            load_checkpoint(r.checkpoint).model,
            model.state_dict(),
        )


def test_sigint_checkpoints_and_resumes(tmp_path: Path) -> None:
    logdir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "simkit",
        "train",
        "simkit/CartPole-v0",
        "--total-steps",
        "0",
        "--num-envs",
        "2",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--checkpoint-every",
        "0",
        "--no-progress",
        "--logdir",
        str(logdir),
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while not (logdir / "policy.safetensors").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"SIGINT received" in err
    ckpt = load_checkpoint(logdir)
    version = int(ckpt.state["version"])
    assert version >= 1
    more = run_training(
        PPOArgs(**TINY), logdir=logdir, resume=logdir, max_updates=1, tensorboard=False
    )
    assert more.updates == version + 1


def test_multi_agent_goalnav_return_rises(tmp_path: Path) -> None:
    args = PPOArgs(
        env_id="simkit/GoalNav-v0",
        num_envs=4,
        num_steps=128,
        num_minibatches=4,
        update_epochs=4,
        total_steps=4 * 3 * 128 * 12,
        seed=0,
        learning_rate=1e-3,
    )
    before = evaluate_policy_untrained(args, tmp_path / "untrained.safetensors")
    r = run_training(args, logdir=tmp_path, tensorboard=False)
    after = evaluate_policy(r.policy, episodes=12, seed=7)
    assert after.mean() > before + 5.0, (before, after.mean())


def evaluate_policy_untrained(args: PPOArgs, path: Path) -> float:
    """Mean deterministic return of the initial policy (same evaluation as after)."""
    from simkit.clients._checkpoint import save_policy

    model = build_model(args)
    save_policy(path, model.state_dict(), _policy_meta(args, 0))
    return float(evaluate_policy(path, episodes=12, seed=7).mean())
