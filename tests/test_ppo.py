"""The PPO learner: GAE, determinism, exact resume, checkpoints, SIGINT, multi-agent
learning, the lean act path, recording the fragment stream and rendering an evaluation."""

from __future__ import annotations

import ctypes.util
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import simkit
from simkit._types import ROW_FIELDS, Fragment, stack_fragments
from simkit.clients.learners._checkpoint import load_checkpoint
from simkit.clients.learners._evaluate import evaluate_policy
from simkit.clients.learners.ppo import (
    PPOArgs,
    RewardScaler,
    _gae_recursion,
    build_model,
    clip_grad_norm,
    compute_gae,
    global_rows,
    policy_meta,
)
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
    arrays = (rewards, values, term, trunc, final, last)
    adv, ret = compute_gae(*map(torch.from_numpy, arrays), gamma=g, lam=lam)
    d2 = 3.0 + g * 2.0 - 1.5
    d1 = 2.0 + g * 5.0 - 1.0  # truncated: final value, and the chain stops here
    d0 = 1.0 + g * 1.0 - 0.5
    expected = np.array([[d0 + g * lam * d1], [d1], [d2]])
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(ret, expected + values, rtol=1e-6)
    # Termination: no bootstrap at all, even with a final value present.
    arrays = (rewards, values, trunc, np.zeros_like(trunc), final, last)
    adv_t, _ = compute_gae(*map(torch.from_numpy, arrays), gamma=g, lam=lam)
    assert adv_t[1, 0] == pytest.approx(2.0 - 1.0)


def _gae_numpy(
    rewards: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    final: np.ndarray,
    last: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE in numpy, written out (the host's formulation the learner had before GAE was
    written once over tensors): the reference of compute_gae's bits."""
    ended = terminated | truncated
    next_values = np.concatenate([values[1:], last[None]])
    bootstrap = np.where(terminated, 0.0, np.where(ended, final, next_values))
    delta = rewards + gamma * bootstrap - values
    adv = np.zeros(rewards.shape)
    last_adv = np.zeros(rewards.shape[1:])
    for t in reversed(range(len(rewards))):
        last_adv = delta[t] + np.where(ended[t], 0.0, gamma * lam) * last_adv
        adv[t] = last_adv
    return adv.astype(np.float32), (adv + values).astype(np.float32)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    t=st.integers(1, 12),
    r=st.integers(1, 5),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
    reward_dtype=st.sampled_from([np.float64, np.float32]),
)
def test_gae_has_the_bits_of_numpys_operations(
    seed: int, t: int, r: int, gamma: float, lam: float, reward_dtype: type
) -> None:
    # numpy's promotions (NEP 50: Python scalars are weak) decide the bits: gamma *
    # bootstrap in float32, delta in the rewards' dtype or wider, the recursion in
    # float64. float32 rewards (a delta in float32) check that compute_gae follows them.
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(t, r)).astype(reward_dtype)
    values = rng.normal(size=(t, r)).astype(np.float32)
    terminated = rng.random((t, r)) < 0.2
    truncated = ~terminated & (rng.random((t, r)) < 0.2)
    final = np.where(truncated, rng.normal(size=(t, r)), 0.0).astype(np.float32)
    last = rng.normal(size=r).astype(np.float32)
    arrays = (rewards, values, terminated, truncated, final, last)
    want = _gae_numpy(*arrays, gamma=gamma, lam=lam)
    got = compute_gae(*map(torch.from_numpy, arrays), gamma=gamma, lam=lam)
    for w, g in zip(want, got, strict=True):
        assert g.dtype == torch.float32
        assert np.array_equal(g.numpy(), w)


@pytest.mark.parametrize("delta_dtype", [np.float64, np.float32])
def test_gae_recursion_over_numpy_has_the_bits_of_torch(delta_dtype: type) -> None:
    """compute_gae runs its recursion in numpy on the CPU, over tensors elsewhere: the
    same code, the same bits (here both on the CPU)."""
    rng = np.random.default_rng(4)
    delta = rng.normal(size=(50, 3)).astype(delta_dtype)
    carry = np.where(rng.random((50, 3)) < 0.1, 0.0, 0.99 * 0.95)
    start = rng.normal(size=3)
    on_numpy = np.empty((50, 3))
    _gae_recursion(delta, carry, on_numpy, start)
    on_torch = torch.empty((50, 3), dtype=torch.float64)
    _gae_recursion(*map(torch.from_numpy, (delta, carry)), on_torch, torch.from_numpy(start))
    assert np.array_equal(on_numpy, on_torch.numpy())


def _fragment(rng: np.random.Generator, T: int, R: int) -> Fragment:
    term = rng.random((T, R)) < 0.02
    return Fragment(
        obs=rng.normal(size=(T, R, 3)),
        actions=rng.normal(size=(T, R, 2)).astype(np.float32),
        log_probs=np.zeros((T, R), np.float32),
        values=rng.normal(size=(T, R)).astype(np.float32),
        rewards=rng.normal(size=(T, R)) * 5,
        terminated=term,
        truncated=(rng.random((T, R)) < 0.02) & ~term,
        final_values=rng.normal(size=(T, R)).astype(np.float32),
        agent_mask=np.ones((T, R), bool),
        policy_version=np.zeros(T, np.int64),
        last_obs=np.zeros((R, 3)),
        last_values=rng.normal(size=R).astype(np.float32),
        env_ids=np.arange(R),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
        episode_rows=np.zeros(0, np.int64),
        source="s",
        sequence=0,
    )


def test_one_row_reward_scaling_is_the_generic_path_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    fast, generic = RewardScaler(0.99, 10.0), RewardScaler(0.99, 10.0)
    for _ in range(3):  # the running return carries across fragments
        f = _fragment(rng, 300, 1)
        a = fast.scale(f)
        ret = generic.returns if len(generic.returns) else np.zeros(1)
        b, generic_ret = generic._scale_rows(f.rewards, f.terminated, None, ret)
        generic.returns = generic_ret
        assert a.dtype == b.dtype
        assert a.tobytes() == b.tobytes()
        assert (fast.mean, fast.var, fast.count) == (generic.mean, generic.var, generic.count)
        assert fast.returns.tobytes() == generic.returns.tobytes()


def test_fragments_split_over_servers_scale_and_join_as_one() -> None:
    """The rows of one update, split over producers, give the learner the same batch
    (rewards scaled with the same statistics) as one producer's fragment."""
    rng = np.random.default_rng(1)
    whole = _fragment(rng, 40, 4)
    cut = 3
    halves = [
        dataclasses.replace(
            whole,
            **{name: getattr(whole, name)[:, rows] for name in ROW_FIELDS},
            last_obs=whole.last_obs[rows],
            last_values=whole.last_values[rows],
            env_ids=whole.env_ids[rows],
        )
        for rows in (slice(cut, 4), slice(0, cut))  # delivered out of slot order
    ]
    joined = stack_fragments(sorted(halves, key=lambda f: int(f.env_ids[0])))
    for name in ("obs", "rewards", "terminated", "last_values", "env_ids"):
        assert np.array_equal(getattr(joined, name), getattr(whole, name)), name
    one, two = RewardScaler(0.99, 10.0), RewardScaler(0.99, 10.0)
    assert one.scale(whole).tobytes() == two.scale(joined).tobytes()
    assert one.returns.tobytes() == two.returns.tobytes()
    assert np.array_equal(global_rows(halves[0]), [3])


def test_clip_grad_norm_is_torchs_bit_for_bit() -> None:
    torch.manual_seed(0)
    params = [torch.randn(5, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
    twins = [p.detach().clone().requires_grad_(True) for p in params]
    for ps in (params, twins):
        (ps[0].sum(0) * 30 + ps[1] ** 3).sum().backward()
    clip_grad_norm(params, 0.5)
    torch.nn.utils.clip_grad_norm_(twins, 0.5, foreach=True)
    for p, q in zip(params, twins, strict=True):
        assert p.grad is not None
        assert q.grad is not None
        assert torch.equal(p.grad, q.grad)
    assert float(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in params]))) < 0.51


def test_same_seed_same_parameters(tmp_path: Path) -> None:
    a = simkit.train(
        PPOArgs(**TINY), logdir=tmp_path / "a", max_rounds=4, tensorboard=False, servers=0
    )
    b = simkit.train(
        PPOArgs(**TINY), logdir=tmp_path / "b", max_rounds=4, tensorboard=False, servers=0
    )
    assert a.checkpoint is not None
    assert b.checkpoint is not None
    pa, pb = _params(a.checkpoint), _params(b.checkpoint)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    c = simkit.train(
        PPOArgs(**{**TINY, "seed": 4}),
        logdir=tmp_path / "c",
        max_rounds=4,
        tensorboard=False,
        servers=0,
    )
    assert c.checkpoint is not None
    assert not torch.equal(_params(c.checkpoint)["actor.0.weight"], pa["actor.0.weight"])


# Importing torch's inductor imports torch/utils/mkldnn.py, which uses its own deprecated
# torch.jit.script_method (torch 2.13); nothing of simkit's.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_update_is_deterministic(tmp_path: Path) -> None:
    args = PPOArgs(**{**TINY, "compile": True})
    a = simkit.train(args, logdir=tmp_path / "a", max_rounds=2, tensorboard=False, servers=0)
    b = simkit.train(args, logdir=tmp_path / "b", max_rounds=2, tensorboard=False, servers=0)
    eager = simkit.train(
        PPOArgs(**TINY), logdir=tmp_path / "e", max_rounds=2, tensorboard=False, servers=0
    )
    assert a.checkpoint is not None
    assert b.checkpoint is not None
    assert eager.checkpoint is not None
    pa, pb, pe = _params(a.checkpoint), _params(b.checkpoint), _params(eager.checkpoint)
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
        torch.testing.assert_close(pa[k], pe[k], rtol=1e-3, atol=1e-4)  # the same update


@pytest.mark.parametrize("env_id", ["simkit/CartPole-v0", "simkit/GoalNav-v0"])
def test_resume_is_exact(tmp_path: Path, env_id: str) -> None:
    args = {**TINY, "env_id": env_id, "num_steps": 37}  # episodes cross fragment boundaries
    full = simkit.train(
        PPOArgs(**args), logdir=tmp_path / "full", max_rounds=5, tensorboard=False, servers=0
    )
    part = simkit.train(
        PPOArgs(**args), logdir=tmp_path / "part", max_rounds=3, tensorboard=False, servers=0
    )
    assert part.checkpoint is not None
    state = load_checkpoint(part.checkpoint).state
    assert state["source"]["loop"] is not None  # envs resume mid-episode from snapshots
    rest = simkit.train(
        PPOArgs(**args),
        logdir=tmp_path / "part",
        resume=tmp_path / "part",
        max_rounds=2,
        tensorboard=False,
        servers=0,
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
    r = simkit.train(PPOArgs(**TINY), logdir=tmp_path, max_rounds=1, tensorboard=False, servers=0)
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
        simkit.train(
            PPOArgs(**TINY), logdir=tmp_path / "x", resume=ckpt, tensorboard=False, servers=0
        )
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
    r = simkit.train(PPOArgs(**TINY), logdir=tmp_path, max_rounds=1, tensorboard=False, servers=0)
    assert r.checkpoint is not None
    model = build_model(PPOArgs(**{**TINY, "hidden": (32,)}))
    from simkit.clients.learners._checkpoint import check_tensors

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
    # Its own process group, signalled as a whole: what Ctrl-C in a terminal does.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while not (logdir / "policy.safetensors").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"SIGINT received" in err
    ckpt = load_checkpoint(logdir)
    version = int(ckpt.state["version"])
    assert version >= 1
    # The default rollout is one local server; the signal reached the learner only
    # (the server runs in its own session), which took its session's snapshot.
    assert ckpt.state["source_kind"] == "servers"
    [session] = ckpt.state["source"]["sessions"]
    assert session["state"]["sequence"] == version
    more = simkit.train(
        PPOArgs.from_plain(ckpt.state["args"]),
        logdir=logdir,
        resume=logdir,
        max_rounds=1,
        tensorboard=False,
    )
    assert more.updates == version + 1


@pytest.mark.parametrize("servers", [0, 1], ids=["in-process", "through-a-server"])
def test_multi_agent_goalnav_return_rises(tmp_path: Path, servers: int) -> None:
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
    r = simkit.train(args, logdir=tmp_path, tensorboard=False, servers=servers)
    after = evaluate_policy(r.policy, episodes=12, seed=7)
    assert after.mean() > before + 5.0, (before, after.mean())


def evaluate_policy_untrained(args: PPOArgs, path: Path) -> float:
    """Mean deterministic return of the initial policy (same evaluation as after)."""
    from simkit.clients.learners._checkpoint import save_policy

    model = build_model(args)
    save_policy(path, model.state_dict(), policy_meta(args, 0))
    return float(evaluate_policy(path, episodes=12, seed=7).mean())


def test_lean_act_path_samples_as_the_model_does() -> None:
    from simkit.models._lean import LeanMLP

    for env_id in ("simkit/CartPole-v0", "simkit/GoalNav-v0", "simkit/Cheetah-v0"):
        model = build_model(PPOArgs(env_id=env_id))
        model.update_obs_stats(np.random.default_rng(0).normal(1.0, 3.0, (64, *model.obs_shape)))
        lean = LeanMLP.of(model)
        assert lean is not None, env_id
        obs = np.random.default_rng(1).normal(size=(5, *model.obs_shape))
        noise = np.random.default_rng(2).random((5, model.head.noise_width), dtype=np.float32)
        actions, log_probs, values = lean.act(obs, noise)
        out = model.act(obs, noise=torch.from_numpy(noise))
        # The same noise around the same mean (up to float32 rounding of the matmuls).
        np.testing.assert_allclose(actions, out.actions.numpy(), atol=1e-5)
        assert actions.dtype == out.actions.numpy().dtype
        np.testing.assert_allclose(log_probs, out.log_probs.numpy(), atol=1e-5)
        np.testing.assert_allclose(values, out.values.numpy(), atol=1e-5)
        np.testing.assert_allclose(lean.value(obs), out.values.numpy(), atol=1e-5)
        # A weight push reaches the lean path only through load().
        with torch.no_grad():
            model.critic[-1].bias.add_(1.0)
        assert not np.allclose(lean.value(obs), model.value(obs).detach().numpy(), atol=0.5)
        lean.load()
        np.testing.assert_allclose(lean.value(obs), model.value(obs).detach().numpy(), atol=1e-5)
    cnn_like = build_model(PPOArgs(env_id="simkit/CartPole-v0"))
    cnn_like.encoder = torch.nn.Identity()
    assert LeanMLP.of(cnn_like) is None  # anything but the plain MLP keeps model.act


@pytest.mark.parametrize("servers", [0, 1], ids=["in-process", "through-a-server"])
def test_record_keeps_every_episode_with_its_policy_versions(tmp_path: Path, servers: int) -> None:
    from simkit.recording import RecordingReader, verify_recording

    r = simkit.train(
        PPOArgs(**TINY),
        logdir=tmp_path / "run",
        max_rounds=4,
        tensorboard=False,
        record=tmp_path / "rec",
        servers=servers,
    )
    reader = RecordingReader(tmp_path / "rec")
    assert len(reader) >= 4
    assert {v.error for v in verify_recording(reader)} == {None}  # replays bit for bit
    versions = set()
    for k in range(len(reader)):
        ep = reader.load(k)
        assert ep.policy_version is not None
        versions |= set(ep.policy_version.tolist())
    assert versions <= set(range(r.updates))
    assert len(versions) > 1
    with pytest.raises(ValueError, match=r"record needs a single-agent simkit env"):
        simkit.train(
            PPOArgs(**{**TINY, "env_id": "simkit/GoalNav-v0"}),
            logdir=tmp_path / "ma",
            record=tmp_path / "rec2",
            tensorboard=False,
            servers=0,
        )


def test_eval_render_of_an_env_without_frames_is_refused(tmp_path: Path) -> None:
    from simkit.clients.learners._checkpoint import save_policy

    args = PPOArgs(env_id="simkit/GoalNav-v0")
    save_policy(tmp_path / "p.safetensors", build_model(args).state_dict(), policy_meta(args, 0))
    with pytest.raises(ValueError, match=r"--render supports single-agent envs"):
        evaluate_policy(tmp_path / "p.safetensors", episodes=1, render=tmp_path / "x.mp4")
    args = PPOArgs(env_id="simkit/CartPole-v0")
    save_policy(tmp_path / "c.safetensors", build_model(args).state_dict(), policy_meta(args, 0))
    with pytest.raises(ValueError, match=r"'simkit/CartPole-v0' cannot render RGB frames"):
        evaluate_policy(tmp_path / "c.safetensors", episodes=1, render=tmp_path / "x.mp4")


@pytest.mark.skipif(
    ctypes.util.find_library("OSMesa") is None,
    reason="libOSMesa not installed (apt-get install libosmesa6); .ci/run installs it",
)
def test_eval_renders_a_mujoco_policy_to_mp4(tmp_path: Path) -> None:
    from simkit.clients.learners._checkpoint import save_policy

    args = PPOArgs(env_id="simkit/Reacher-v0")
    policy = tmp_path / "policy.safetensors"
    save_policy(policy, build_model(args).state_dict(), policy_meta(args, 0))
    out = tmp_path / "reacher.mp4"
    env = {**os.environ, "MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"}
    cmd = [sys.executable, "-m", "simkit", "eval", str(policy), "--episodes", "1"]
    proc = subprocess.run(
        [*cmd, "--render", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"video: {out}" in proc.stdout
    check = (
        "import imageio, json, numpy as np, sys; f = imageio.mimread(sys.argv[1]); "
        "print(json.dumps([len(f), list(f[0].shape), bool((f[0] != f[-1]).any())]))"
    )
    read = subprocess.run(
        [sys.executable, "-c", check, str(out)], capture_output=True, text=True, timeout=120
    )
    assert read.returncode == 0, read.stderr[-2000:]
    frames, shape, moved = json.loads(read.stdout.strip().splitlines()[-1])
    assert frames > 10
    assert shape[2] == 3
    assert moved


def test_learner_device_auto_on_a_cpu_machine_trains_the_cpu_bits(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("auto picks CUDA here; the CPU-only equality is checked on CPU machines")
    runs = [
        simkit.train(
            PPOArgs(**{**TINY, "device": device}),
            logdir=tmp_path / device,
            max_rounds=2,
            tensorboard=False,
            servers=0,
        )
        for device in ("cpu", "auto")
    ]
    pa, pb = _params(runs[0].checkpoint), _params(runs[1].checkpoint)
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k


def test_learner_device_cuda_without_cuda_is_a_one_line_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from simkit.clients.learners.ppo import resolve_device

    with pytest.raises(ValueError, match="--device cuda: this machine has no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="--device must be cpu, cuda\\[:k\\] or auto, got 'tpu'"):
        resolve_device("tpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_learner_on_cuda_trains_and_checkpoints(tmp_path: Path) -> None:
    r = simkit.train(
        PPOArgs(**{**TINY, "device": "cuda"}),
        logdir=tmp_path,
        max_rounds=2,
        tensorboard=False,
        servers=0,
    )
    params = _params(r.checkpoint)
    assert all(t.device.type == "cpu" for t in params.values())
    assert all(torch.isfinite(t).all() for t in params.values() if t.is_floating_point())


def test_checkpoints_with_bad_optimizer_state_or_nan_weights_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file

    from simkit.cli import main
    from simkit.clients.learners._checkpoint import load_policy, save_checkpoint, save_policy

    simkit.train(
        PPOArgs(**TINY), logdir=tmp_path / "run", max_rounds=1, tensorboard=False, servers=0
    )
    ckpt = load_checkpoint(tmp_path / "run")
    # Adam's moment of the wrong shape for its parameter.
    opt = ckpt.optimizer
    state = opt["state"][0]
    state["exp_avg"] = torch.zeros(state["exp_avg"].numel() + 1)
    save_checkpoint(
        tmp_path / "bad" / "checkpoints",
        "update-00000001",
        model=ckpt.model,
        optimizer=opt,
        state=ckpt.state,
    )
    with pytest.raises(
        InvalidCheckpoint, match=r"optimizer.safetensors: optimizer state 'exp_avg' of parameter 0"
    ):
        simkit.train(
            PPOArgs(**TINY),
            logdir=tmp_path / "bad",
            resume=tmp_path / "bad",
            tensorboard=False,
            servers=0,
        )
    # A policy of NaN weights does not evaluate.
    policy = tmp_path / "run" / "policy.safetensors"
    tensors = load_file(str(policy))
    nan = {
        k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
        for k, v in tensors.items()
    }
    _tensors, meta = load_policy(policy)
    save_policy(tmp_path / "nan.safetensors", nan, meta)
    assert main(["eval", str(tmp_path / "nan.safetensors"), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "non-finite value(s)" in err[0]
    assert "nan.safetensors" in err[0]


def test_eval_of_a_checkpoint_without_policy_metadata_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.cli import main
    from simkit.clients.learners._checkpoint import save_checkpoint

    simkit.train(
        PPOArgs(**TINY), logdir=tmp_path / "run", max_rounds=1, tensorboard=False, servers=0
    )
    ckpt = load_checkpoint(tmp_path / "run")
    state = {k: v for k, v in ckpt.state.items() if k != "policy"}
    opt_state = ckpt.optimizer
    saved = save_checkpoint(
        tmp_path / "bad", "update-00000001", model=ckpt.model, optimizer=opt_state, state=state
    )
    assert main(["eval", str(saved), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"simkit eval: {saved / 'state.msgpack'}: holds no policy metadata"]


def test_the_same_policy_is_always_the_same_bytes(tmp_path: Path) -> None:
    """safetensors writes metadata in a hash map's random order; saved policies and
    weights sort it, so a run's files repeat byte for byte (fails before: two orders)."""
    from simkit.clients.learners._checkpoint import load_policy, save_policy
    from simkit.models import get_weights, load_weights, save_weights

    model = build_model(PPOArgs(**TINY))
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    meta = {"env_id": TINY["env_id"], "model": {"name": "mlp", "kwargs": {}}}
    outputs = set()
    for k in range(24):
        save_policy(tmp_path / f"p{k}.safetensors", tensors, meta)
        outputs.add((tmp_path / f"p{k}.safetensors").read_bytes())
    assert len(outputs) == 1
    back, back_meta = load_policy(tmp_path / "p0.safetensors")
    assert back_meta == meta
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)
    weights = get_weights(model, 3)
    files = set()
    for k in range(24):
        save_weights(tmp_path / f"w{k}.safetensors", weights)
        files.add((tmp_path / f"w{k}.safetensors").read_bytes())
    assert len(files) == 1
    assert load_weights(tmp_path / "w0.safetensors").version == 3
