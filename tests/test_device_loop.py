"""The whole loop on one device (the rollout loop over torch: ``LocalSource(device_loop=
True)``, PPO.update): a torch BatchEnv, keyed noise, the policy, fragment storage, GAE,
reward scaling and the update on the learner's device, run here on ``device="cpu"`` (the
same code as on CUDA)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from device_helpers import no_host_reads

import simkit
from simkit._noise import SlotNoise
from simkit._types import Fragment
from simkit.clients.learners._device_pick import device_loop_support, use_device_loop
from simkit.clients.learners._sources import LocalSource
from simkit.clients.learners.ppo import PPO, PPOArgs, RewardScaler, build_model
from simkit.rollout._loop import DeviceFragment

CPU = torch.device("cpu")


def _source(env_id: str, n: int, t: int, seed: int = 3, **kw: Any) -> tuple[LocalSource, Any]:
    args = PPOArgs(env_id=env_id, num_envs=n, num_steps=t, seed=seed, **kw)
    model = build_model(args)
    source = LocalSource(
        env_id, model, num_envs=n, num_steps=t, seed=seed, device=CPU, device_loop=True
    )
    source.push_weights(model, version=0)
    return source, model


def _host_fragment(rewards: np.ndarray, terminated: np.ndarray) -> Fragment:
    t, r = rewards.shape
    return Fragment(
        obs=np.zeros((t, r, 1), np.float32),
        actions=np.zeros((t, r), np.int64),
        log_probs=np.zeros((t, r), np.float32),
        values=np.zeros((t, r), np.float32),
        rewards=rewards,
        terminated=terminated,
        truncated=np.zeros((t, r), np.bool_),
        final_values=np.zeros((t, r), np.float32),
        agent_mask=np.ones((t, r), np.bool_),
        policy_version=np.zeros(t, np.int64),
        last_obs=np.zeros((r, 1), np.float32),
        last_values=np.zeros(r, np.float32),
        env_ids=np.arange(r, dtype=np.int64),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
        episode_rows=np.zeros(0, np.int64),
    )


def _on_device(f: Fragment) -> DeviceFragment:
    """``f``'s arrays as tensors (on the CPU): a device loop's fragment of the same steps."""
    names = ("obs", "actions", "log_probs", "values", "rewards", "terminated", "truncated")
    return DeviceFragment(
        **{name: torch.from_numpy(getattr(f, name).copy()) for name in names},
        final_values=torch.from_numpy(f.final_values.copy()),
        last_obs=torch.from_numpy(f.last_obs.copy()),
        last_values=torch.from_numpy(f.last_values.copy()),
        policy_version=f.policy_version.copy(),
        episode_returns=f.episode_returns.copy(),
        episode_lengths=f.episode_lengths.copy(),
        episode_rows=f.episode_rows.copy(),
    )


def test_reward_scaling_of_tensors_follows_numpys_and_shares_its_state() -> None:
    # One scaler, two kinds of rows: a host fragment's numpy arrays, a device fragment's
    # tensors (torch's batch sums: the same figures up to rounding, not bit for bit).
    rng = np.random.default_rng(0)
    t, r = 20, 6
    host, dev, moved = (RewardScaler(0.99, 10.0) for _ in range(3))
    for k in range(4):
        rewards = rng.normal(3.0, 2.0, size=(t, r))
        terminated = rng.random((t, r)) < 0.1
        frag = _host_fragment(rewards, terminated)
        want = host.scale(frag)
        assert isinstance(want, np.ndarray)
        got = dev.scale(_on_device(frag))
        assert isinstance(got, torch.Tensor)
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
        # A run that changes kind (a checkpoint resumed in the device loop, or back)
        # carries its returns and statistics over.
        either = moved.scale(_on_device(frag) if k % 2 else frag)
        np.testing.assert_allclose(np.asarray(either), want, rtol=1e-12, atol=1e-12)
    assert isinstance(dev.returns, torch.Tensor)
    assert isinstance(dev.mean, torch.Tensor)
    a, b = host.get_state(), dev.get_state()
    assert set(a) == set(b)
    assert all(type(s[k]) is float for s in (a, b) for k in ("mean", "var", "count"))
    assert b["returns"].dtype == np.float64
    np.testing.assert_allclose([a["mean"], a["var"], a["count"]], [b["mean"], b["var"], b["count"]])
    np.testing.assert_allclose(a["returns"], b["returns"], rtol=1e-12)
    back = RewardScaler(0.99, 10.0)
    back.set_state(b)  # the one format: a device run's state resumes on the host
    assert back.count == b["count"]
    assert isinstance(back.returns, np.ndarray)


def test_only_batch_envs_with_device_steps_run_the_device_loop() -> None:
    assert device_loop_support("simkit/BatchCartPole-v0") is None
    assert device_loop_support("simkit/BatchPendulum-v0") is None
    assert "is a single env" in str(device_loop_support("simkit/CartPole-v0"))
    # BatchCheetah declares time_limit_only: resets scheduled on the host (on MJWarp).
    assert device_loop_support("simkit/BatchCheetah-v0") is None
    assert "Gymnasium env" in str(device_loop_support("gym:CartPole-v1"))
    with pytest.raises(ValueError, match="the device loop cannot run simkit/CartPole-v0"):
        _source("simkit/CartPole-v0", 2, 4)
    # On MuJoCo's C backend a torch BatchCheetah computes on the host: refused.
    with pytest.raises(ValueError, match="its steps fall back to the host path"):
        _source("simkit/BatchCheetah-v0", 2, 4)


def test_a_device_fragment_is_the_keyed_noise_acting_on_the_batch_env() -> None:
    n, t, seed = 6, 30, 4
    source, model = _source("simkit/BatchCartPole-v0", n, t, seed)
    d0, d1 = source.rollout(), source.rollout()
    assert isinstance(d0, DeviceFragment)
    assert isinstance(d1, DeviceFragment)
    f0, f1 = d0.to_host(), d1.to_host()
    # Stepping a numpy BatchCartPole with the fragments' actions gives their steps (the
    # torch batch on the CPU has the numpy bits), and each action is the policy's
    # sample from the run's keyed noise of (seed, slot, step).
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=n)
    obs, _ = env.reset(seed=seed)
    noise = SlotNoise(seed, first_slot=0, num_slots=n, rows_per_slot=1, width=1, kind="uniform")
    for k, frag in enumerate((f0, f1)):
        for s in range(t):
            assert np.array_equal(frag.obs[s], obs)
            out = model.act(torch.from_numpy(obs), noise=torch.from_numpy(noise.draw(k * t + s)))
            assert np.array_equal(frag.actions[s], out.actions.numpy())
            assert np.array_equal(frag.log_probs[s], out.log_probs.numpy())
            step = env.step_batch(frag.actions[s])
            assert np.array_equal(frag.rewards[s], step.reward)
            assert np.array_equal(frag.terminated[s], step.terminated)
            assert np.array_equal(frag.truncated[s], step.truncated)
            obs = step.obs
        assert np.array_equal(frag.last_obs, obs)
    ended = int((f0.terminated | f0.truncated).sum() + (f1.terminated | f1.truncated).sum())
    assert ended > 0  # episodes ended, and each counted once
    assert len(f0.episode_returns) + len(f1.episode_returns) == ended
    # Each episode's own return and length, by slot then step, as a host rollout lists
    # them: CartPole's reward is 1 a step, and the first episodes started at the reset.
    ret, length = np.zeros(n), np.zeros(n, np.int64)
    for frag in (f0, f1):
        want_ret, want_len, want_rows = [], [], []
        steps = []
        for s in range(t):
            ret += frag.rewards[s]
            length += 1
            ends = frag.terminated[s] | frag.truncated[s]
            steps += [(int(r), s, ret[r], length[r]) for r in np.flatnonzero(ends)]
            ret[ends], length[ends] = 0.0, 0
        for row, _, r, k in sorted(steps):
            want_rows.append(row)
            want_ret.append(r)
            want_len.append(k)
        assert frag.episode_rows.tolist() == want_rows
        assert frag.episode_returns.tolist() == want_ret
        assert frag.episode_lengths.dtype == np.int64
        assert frag.episode_lengths.tolist() == want_len


def test_truncated_steps_bootstrap_from_the_final_observation() -> None:
    # BatchPendulum truncates every episode at 200 steps: a 210-step fragment holds them.
    n, t = 3, 210
    source, model = _source("simkit/BatchPendulum-v0", n, t)
    loop = source.loop
    for _ in range(t - 1):
        assert loop.step() is None
    assert loop._buf is not None
    final_obs = loop._buf.final_obs[199].clone()
    f = loop.step()
    assert isinstance(f, DeviceFragment)
    assert bool(f.truncated[199].all())
    assert not bool(f.terminated.any())
    want = model.value(final_obs).detach()  # batched over all T x N rows there: float32 rounding
    torch.testing.assert_close(f.final_values[199], want.reshape(-1), rtol=1e-5, atol=1e-6)
    assert bool((f.final_values[199] != 0).all())
    assert bool((f.final_values[:199] == 0).all())
    assert np.array_equal(f.episode_lengths, np.full(n, 200))


def test_a_rollout_never_reads_a_tensor_back_between_its_host_points() -> None:
    n, t = 16, 24
    for env_id in ("simkit/BatchCartPole-v0", "simkit/BatchPendulum-v0"):
        source, _ = _source(env_id, n, t)
        loop, env = source.loop, source.envs.env
        env.prepare_device_steps(t)  # the fragment's one host read of the counters
        env.prepare_device_steps = lambda steps: True
        with no_host_reads(torch):
            for _ in range(t - 1):
                assert loop.step() is None
        frag = loop.step()  # the fragment's end reads its episodes back, once
        assert isinstance(frag, DeviceFragment)
        assert frag.rewards.shape == (t, n)


def test_the_device_update_is_the_numpy_update_of_its_host_copy() -> None:
    kw: dict[str, Any] = {"num_minibatches": 4, "update_epochs": 2, "normalize_reward": False}
    source, _ = _source("simkit/BatchCartPole-v0", 16, 20, **kw)
    frag = source.rollout()
    assert isinstance(frag, DeviceFragment)
    host = frag.to_host()
    args = PPOArgs(env_id="simkit/BatchCartPole-v0", num_envs=16, num_steps=20, seed=3, **kw)
    a, b = PPO(args, build_model(args), 16), PPO(args, build_model(args), 16)
    sa, sb = a.update([frag]), b.update([host])
    for (name, pa), pb in zip(
        a.model.state_dict().items(), b.model.state_dict().values(), strict=True
    ):
        assert torch.equal(pa, pb), name
    assert (sa.policy_loss, sa.approx_kl, sa.explained_variance) == (
        sb.policy_loss,
        sb.approx_kl,
        sb.explained_variance,
    )
    with pytest.raises(TypeError, match="one DeviceFragment alone"):
        a.update([frag, host])


def test_which_runs_take_the_device_loop() -> None:
    def use(env_id: str = "simkit/BatchCartPole-v0", **kw: Any) -> bool:
        settings: dict[str, Any] = {
            "env_id": env_id,
            "choice": "auto",
            "device": torch.device("cuda"),  # a name: no CUDA device is needed to ask
            "mode": "sync",
            "servers": 0,
            "connect": False,
            "ray": False,
            "record": False,
        }
        return use_device_loop(**{**settings, **kw})

    assert use()
    assert not use(device=CPU)  # a CPU run keeps its host rollout unless it asks
    assert use(device=CPU, choice="on")
    assert not use(choice="off")
    assert not use("simkit/CartPole-v0")
    assert not use(servers=1)
    with pytest.raises(ValueError, match=r"^--device-loop on: it rolls out in the learner's"):
        use(choice="on", servers=1)
    with pytest.raises(ValueError, match="sync mode only, got --mode async"):
        use(choice="on", mode="async")
    with pytest.raises(ValueError, match="--record records host fragments"):
        use(choice="on", record=True)
    with pytest.raises(ValueError, match="is a single env"):
        use("simkit/CartPole-v0", choice="on")
    with pytest.raises(ValueError, match="--device-loop must be auto, on or off, got yes"):
        PPOArgs(device_loop="yes").check()


DL: dict[str, Any] = {
    "env_id": "simkit/BatchCartPole-v0",
    "num_envs": 16,
    "num_steps": 24,  # episodes cross fragment boundaries
    "num_minibatches": 4,
    "update_epochs": 2,
    "total_steps": 16 * 24 * 20,
    "seed": 5,
    "device_loop": "on",
}


def _run(tmp: Path, name: str, updates: int, **kw: Any) -> Any:
    import simkit

    args = PPOArgs(**{**DL, **kw})
    return simkit.train(args, logdir=tmp / name, max_rounds=updates, tensorboard=False, servers=0)


def test_a_device_loop_run_resumes_exactly(tmp_path: Path) -> None:
    import simkit
    from simkit.clients.learners._checkpoint import load_checkpoint

    full = _run(tmp_path, "full", 4)
    part = _run(tmp_path, "part", 2)
    state = load_checkpoint(part.checkpoint).state
    assert state["source_kind"] == "device"
    assert state["source"]["loop"]["envs"] is not None  # the envs resume mid-episode
    rest = simkit.train(
        PPOArgs(**DL),
        logdir=tmp_path / "part",
        resume=tmp_path / "part",
        max_rounds=2,
        tensorboard=False,
        servers=0,
    )
    assert rest.updates == full.updates == 4
    a, b = load_checkpoint(full.checkpoint), load_checkpoint(rest.checkpoint)
    for k in a.model:
        assert torch.equal(a.model[k], b.model[k]), k
    for i in a.optimizer["state"]:
        for key in a.optimizer["state"][i]:
            assert torch.equal(a.optimizer["state"][i][key], b.optimizer["state"][i][key])
    sa, sb = a.state["scaler"], b.state["scaler"]
    assert (sa["mean"], sa["var"], sa["count"]) == (sb["mean"], sb["var"], sb["count"])
    assert np.array_equal(sa["returns"], sb["returns"])
    assert np.isfinite(full.mean_return)  # episodes were reported
    assert full.mean_return == rest.mean_return  # over the same episodes


def test_a_cpu_run_keeps_the_host_rollout_unless_it_asks(tmp_path: Path) -> None:
    from simkit.clients.learners._checkpoint import load_checkpoint

    host = _run(tmp_path, "host", 1, device_loop="auto")
    dev = _run(tmp_path, "dev", 1)
    assert load_checkpoint(host.checkpoint).state["source_kind"] == "local"
    assert load_checkpoint(dev.checkpoint).state["source_kind"] == "device"
    assert (host.rollout, dev.rollout) == ("in process (host)", "device loop on cpu")


def test_a_continuous_control_batch_trains_in_the_device_loop(tmp_path: Path) -> None:
    # BatchPendulum: a Gaussian head (the keyed normal noise computed on the device),
    # Box actions clamped on the device.
    run = _run(tmp_path, "pendulum", 2, env_id="simkit/BatchPendulum-v0", num_steps=16)
    assert run.rollout == "device loop on cpu"
    assert run.global_step == 2 * 16 * 16
    assert run.updates == 2


def test_device_loop_on_where_it_cannot_run_is_one_line(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "simkit",
        "train",
        "simkit/BatchCartPole-v0",
        "--device-loop",
        "on",
        "--servers",
        "1",
        "--logdir",
        str(tmp_path / "r"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "simkit train: --device-loop on: it rolls out in the learner's process "
        "(--servers 0, no --connect or --ray)"
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_device_loop_on_cuda_never_syncs_in_its_steps_and_trains() -> None:
    cuda = torch.device("cuda")
    for env_id in ("simkit/BatchCartPole-v0", "simkit/BatchPendulum-v0"):
        args = PPOArgs(env_id=env_id, num_envs=512, num_steps=32, num_minibatches=4,
                       update_epochs=2, device="cuda")  # fmt: skip
        model = build_model(args)
        source = LocalSource(
            env_id, model, num_envs=512, num_steps=32, seed=1, device=cuda, device_loop=True
        )
        learner = PPO(args, model, 512)
        source.push_weights(learner.model, version=0)
        learner.update([source.rollout()])  # warm: constants and tables uploaded once
        source.push_weights(learner.model, version=learner.version)
        loop, env = source.loop, source.envs.env
        env.prepare_device_steps(32)
        env.prepare_device_steps = lambda steps: True
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(31):
                assert loop.step() is None
        finally:
            torch.cuda.set_sync_debug_mode("default")
        fragment = loop.step()  # the fragment's end reads its episodes back, once
        assert isinstance(fragment, DeviceFragment)
        assert fragment.obs.device.type == "cuda"
        update = learner.update([fragment])
        assert update.version == 2
        assert np.isfinite(update.policy_loss)


def test_auto_keeps_the_host_rollout_where_a_mujoco_batch_would_compute_on_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--device cuda with --device-loop auto on BatchCheetah: the device loop needs MuJoCo
    Warp; without the gpu extra, or with a host backend asked for, the run keeps the host
    rollout (it did before BatchCheetah could run the device loop) and ``on`` says why."""
    import importlib.util

    cuda = torch.device("cuda")
    kw: dict[str, Any] = dict(mode="sync", servers=0, connect=False, ray=False, record=False)
    cheetah = "simkit/BatchCheetah-v0"
    native = {"backend": "native"}
    assert not use_device_loop(env_id=cheetah, choice="auto", device=cuda, env_kwargs=native, **kw)
    with pytest.raises(ValueError, match="computes on the host on backend 'native'"):
        use_device_loop(env_id=cheetah, choice="on", device=cuda, env_kwargs=native, **kw)
    with pytest.raises(ValueError, match=r"computes on the host on backend '(native|threads)'"):
        use_device_loop(
            env_id=cheetah, choice="on", device=torch.device("cpu"), env_kwargs={}, **kw
        )
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "mujoco_warp" else real(n, *a)
    )
    assert not use_device_loop(env_id=cheetah, choice="auto", device=cuda, env_kwargs={}, **kw)
    with pytest.raises(ValueError, match=r"needs MuJoCo Warp \(pip install 'simkit\[gpu\]'\)"):
        use_device_loop(env_id=cheetah, choice="on", device=cuda, env_kwargs={}, **kw)
    assert use_device_loop(
        env_id="simkit/BatchCartPole-v0", choice="auto", device=cuda, env_kwargs={}, **kw
    )


def test_a_device_loop_state_of_the_older_format_is_refused_clearly() -> None:
    # Before the device loop was the rollout loop over torch, its checkpoints held the
    # env's snapshot, the observations, the returns and the sequence at the top level.
    source, _ = _source("simkit/BatchCartPole-v0", 4, 8)
    old = {"envs": None, "obs": np.zeros((4, 4), np.float32), "episode_returns": np.zeros(4)}
    with pytest.raises(ValueError, match=r"must hold 'loop' and 'sequence'.*got \['envs'"):
        source.set_state({**old, "sequence": 3})
    assert source.sequence == 0  # unchanged
    state = source.get_state()
    source.rollout()
    source.set_state(state)
    assert source.sequence == 0
    source.close()


def test_a_device_loop_checkpoint_resumed_on_the_host_restarts_the_envs_with_a_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import simkit

    _run(tmp_path, "run", 1)
    capsys.readouterr()
    rest = simkit.train(
        PPOArgs(**{**DL, "device_loop": "off"}),
        logdir=tmp_path / "run",
        resume=tmp_path / "run",
        max_rounds=1,
        tensorboard=False,
        servers=0,
    )
    err = capsys.readouterr().err
    assert (
        "the checkpoint's rollout state is from 'device' and this run rolls out through "
        "'local': the learner resumes exactly, the envs start afresh"
    ) in err
    assert rest.updates == 2
