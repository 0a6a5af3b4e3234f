"""``BatchMujocoEnv(backend="mjwarp")``: MuJoCo Warp worlds, here on Warp's CPU backend.

The tests that step MJWarp need the ``simkit[gpu]`` extra (``mujoco-warp``), which
``./run`` installs; they are marked ``mjwarp`` and skip with the reason when it is not
installed, except under ``SIMKIT_REQUIRE_MJWARP=1`` (``.ci/run``), where they run and fail
without it. The first one compiles MJWarp's CPU kernels once per kernel cache (~25 s on
2 cores; ``./run test`` keeps the cache in build/warp-cache); then the whole file takes
~13 s.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simkit
from simkit._batch_mjwarp import MjWarpPhysics
from simkit.errors import InvalidState, MissingDependency

HAVE_MJWARP = importlib.util.find_spec("mujoco_warp") is not None
REQUIRE_MJWARP = os.environ.get("SIMKIT_REQUIRE_MJWARP") == "1"
"""CI sets it: a missing extra fails the tests there instead of skipping them."""
needs_mjwarp = [
    pytest.mark.mjwarp,
    pytest.mark.skipif(
        not (HAVE_MJWARP or REQUIRE_MJWARP),
        reason="mujoco_warp is not installed (pip install 'simkit[gpu]')",
    ),
]

ENV = "simkit/BatchCheetah-v0"
AGREEMENT_TOLERANCE = 5e-3
"""Largest |MJWarp - MuJoCo C| of any observation entry after one env step from the
same state, over 1,000 Cheetah steps (measured: 1.3e-3 at most, 2.5e-4 at the 99th
percentile, 4e-6 median; docs/batch_device.md)."""


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture(
    params=[
        "cpu",
        pytest.param("cuda", marks=pytest.mark.skipif(not _has_cuda(), reason="no CUDA device")),
    ]
)
def device(request: pytest.FixtureRequest) -> str:
    """Warp's CPU backend everywhere; a CUDA device where torch.cuda.is_available()
    (the GPU check runs these with ``-k cuda``)."""
    return str(request.param)


def make(n: int, device: str = "cpu", **kwargs: object) -> simkit.BatchMujocoEnv:
    return simkit.make(ENV, num_envs=n, backend="mjwarp", device=device, **kwargs)


def actions(n: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (n, 6)).astype(np.float32) for _ in range(steps)]


def rollout(env: simkit.BatchMujocoEnv, acts: list[np.ndarray]) -> list[tuple[np.ndarray, ...]]:
    out = []
    for a in acts:
        res = env.step_batch(a)
        out.append(
            tuple(
                np.asarray(x.cpu().numpy()).copy()
                for x in (res.obs, res.final_obs, res.reward, res.terminated, res.truncated)
            )
        )
    return out


def assert_same(a: list[tuple[np.ndarray, ...]], b: list[tuple[np.ndarray, ...]]) -> None:
    assert len(a) == len(b)
    for t, (x, y) in enumerate(zip(a, b, strict=True)):
        for u, v in zip(x, y, strict=True):
            assert u.dtype == v.dtype, f"step {t}"
            assert np.array_equal(u, v), f"step {t} differs"


def test_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mujoco_warp", None)  # import fails as if absent
    with pytest.raises(MissingDependency, match=r"pip install 'simkit\[gpu\]'") as info:
        make(2)
    assert "\n" not in str(info.value)


def test_device_cpu_without_backend_keeps_the_c_engine() -> None:
    env = simkit.make(ENV, num_envs=2, device="cpu")
    assert env.backend in ("native", "threads")
    env.close()


def _mjwarp(fn: Callable[..., None]) -> Callable[..., None]:
    """Marks a test ``mjwarp`` and skips it, with the reason, without the extra."""
    for mark in needs_mjwarp:
        fn = mark(fn)
    return fn


@_mjwarp
def test_tensors_on_the_device_and_start_state_of_the_c_engine(device: str) -> None:
    """Reset draws and declared randomization are the C backends' (same keyed streams),
    stored per world in MJWarp's batched model arrays, rounded to float32."""
    import torch

    n = 3
    env, ref = make(n, device), simkit.make(ENV, num_envs=n)
    obs, _ = env.reset(seed=7)
    ref_obs, _ = ref.reset(seed=7)
    assert isinstance(obs, torch.Tensor)
    assert obs.dtype == torch.float64
    assert env.device == torch.device(device)
    assert obs.device.type == device
    assert env.backend == "mjwarp"
    np.testing.assert_array_equal(obs.cpu().numpy(), ref_obs.astype(np.float32).astype(np.float64))
    for got, want in zip(env.params, ref.params, strict=True):
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    assert isinstance(env._simkit.physics, MjWarpPhysics)
    fields = env._simkit.physics._fields
    for name in ("body_mass", "geom_friction", "dof_damping", "actuator_gainprm", "opt.gravity"):
        for i in range(n):
            model = ref.models[i]
            want = model.opt.gravity if name == "opt.gravity" else getattr(model, name)
            np.testing.assert_array_equal(fields[name][i].cpu().numpy(), want.astype(np.float32))
    res = env.step_batch(actions(n, 1)[0])
    assert all(isinstance(x, torch.Tensor) for x in (res.obs, res.reward, res.terminated))
    assert res.reward.dtype == torch.float64
    assert res.terminated.dtype == torch.bool
    env.close()
    ref.close()


@_mjwarp
def test_same_seed_same_trajectories_across_resets(device: str) -> None:
    acts = actions(2, 24)
    runs = []
    for _ in range(2):
        env = make(2, device, max_episode_steps=7)
        env.reset(seed=11)
        runs.append(rollout(env, acts))
        env.close()
    assert_same(runs[0], runs[1])
    assert runs[0][6][4].all()  # the time limit ended episodes inside the run
    other = make(2, device, max_episode_steps=7)
    other.reset(seed=12)
    assert not np.array_equal(rollout(other, acts[:1])[0][0], runs[0][0][0])
    other.close()


@_mjwarp
def test_reset_after_history_equals_a_fresh_reset(device: str) -> None:
    acts = actions(2, 10)
    used = make(2, device, max_episode_steps=5)
    used.reset(seed=1)
    rollout(used, actions(2, 13, seed=9))
    used.reset(seed=4)
    fresh = make(2, device, max_episode_steps=5)
    fresh.reset(seed=4)
    assert_same(rollout(used, acts), rollout(fresh, acts))


@_mjwarp
def test_snapshot_restores_bit_for_bit_into_a_new_batch(device: str) -> None:
    """qpos, qvel, act, time, warm-start and the rest of the Data's state rows: a new
    batch restored from the snapshot continues exactly, resets included."""
    acts = actions(3, 12)
    env = make(3, device, max_episode_steps=9)
    env.reset(seed=2)
    rollout(env, actions(3, 5, seed=3))
    snap = simkit.snapshot.loads(simkit.snapshot.dumps(env.get_state()))
    assert isinstance(env._simkit.physics, MjWarpPhysics)
    assert env._simkit.physics.views["qacc_warmstart"].abs().sum() > 0  # the solver state is in it
    after = rollout(env, acts)
    other = make(3, device, max_episode_steps=9)
    other.reset(seed=99)
    rollout(other, actions(3, 2, seed=5))
    other.set_state(snap)
    assert_same(rollout(other, acts), after)


@_mjwarp
def test_rejected_snapshot_changes_nothing() -> None:
    env = make(2)
    env.reset(seed=0)
    before = env.get_state()
    c_snap = simkit.make(ENV, num_envs=2)
    c_snap.reset(seed=0)
    with pytest.raises(InvalidState, match="backend='mjwarp' physics state must be"):
        env.set_state(c_snap.get_state())
    after = env.get_state()
    for name, arr in before["data"]["mjwarp"].items():
        np.testing.assert_array_equal(after["data"]["mjwarp"][name], arr)


@_mjwarp
def test_unsupported_uses_say_so() -> None:
    env = make(2)
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="step_subset"):
        env.step_batch(actions(1, 1)[0], env_ids=[1])
    with pytest.raises(ValueError, match="step_infos=True is not supported"):
        make(2, step_infos=True)
    assert len(env.datas) == 2
    with pytest.raises(TypeError, match=r"set_qpos_qvel\(ids, qpos, qvel\)"):
        env.datas[0]


@_mjwarp
def test_agrees_with_the_c_engine_over_1000_steps(device: str) -> None:
    """One episode (1,000 env steps = 5,000 physics steps) of random actions along
    MuJoCo C's trajectory: before each env step every MJWarp world is loaded with the C
    world's state (qpos, qvel, warm-start, time), and the step's observation stays within
    the stated tolerance of C's. Free-running, the two part after ~100 steps, as C does
    from a float32-rounded start (chaos, measured in docs/batch_device.md); this compares the
    physics, not the chaos."""
    import torch

    n = 4
    env, ref = make(n, device), simkit.make(ENV, num_envs=n, backend="loop")
    env.reset(seed=3)
    ref.reset(seed=3)
    assert isinstance(env._simkit.physics, MjWarpPhysics)
    views = env._simkit.physics.views
    worst = 0.0
    for a in actions(n, 1000, seed=1):
        for i, d in enumerate(ref.datas):
            for name in ("qpos", "qvel", "qacc_warmstart"):
                views[name][i] = torch.as_tensor(getattr(d, name))
            views["time"][i] = float(d.time)
        res, want = env.step_batch(a), ref.step_batch(a)
        np.testing.assert_array_equal(res.truncated.cpu().numpy(), want.truncated)
        if not want.truncated.any():
            worst = max(worst, float(np.abs(res.final_obs.cpu().numpy() - want.final_obs).max()))
    assert want.truncated.all()
    assert 0 < worst < AGREEMENT_TOLERANCE, worst


@_mjwarp
def test_the_rollout_server_hosts_an_mjwarp_batch(tmp_path: Path) -> None:
    """``simkit serve simkit/BatchCheetah-v0 --env-kwarg backend=mjwarp``: the server
    hosts the torch batch (its rows copied to the host once per step, for the wire), and
    a remote client gets the local MJWarp batch's rows bit for bit, and snapshots."""
    from simkit.clients import RemoteVectorEnv
    from simkit.servers import RolloutServer

    n = 3
    server = RolloutServer(
        ENV, n, f"ipc://{tmp_path}/mjwarp.sock", env_kwargs={"backend": "mjwarp"}
    ).start()
    remote = RemoteVectorEnv(server.endpoint, timeout=60)
    local = make(n)
    try:
        obs, _ = remote.reset(seed=4)
        local_obs, _ = local.reset(seed=4)
        assert isinstance(obs, np.ndarray)
        assert np.array_equal(obs, local_obs.cpu().numpy())
        for a in actions(n, 4, seed=2):
            got, want = remote.step_batch(a), local.step_batch(a)
            for name in ("obs", "reward", "terminated", "truncated", "final_obs"):
                x, y = getattr(got, name), getattr(want, name).cpu().numpy()
                assert isinstance(x, np.ndarray), name
                assert x.dtype == y.dtype, name
                assert np.array_equal(x, y), name
        saved = remote.get_state()  # snapshots travel too: a restore continues exactly
        act = actions(n, 1, seed=3)[0]
        first = remote.step_batch(act)
        remote.set_state(saved)
        again = remote.step_batch(act)
        for name in ("obs", "reward"):
            assert np.array_equal(getattr(first, name), getattr(again, name)), name
    finally:
        remote.close()
        server.stop()
        local.close()


@_mjwarp
def test_policy_serving_streams_fragments_of_an_mjwarp_batch() -> None:
    """``simkit serve simkit/BatchCheetah-v0 --env-kwarg backend=mjwarp --policy``: the
    server runs the learner's policy over the MJWarp worlds and streams fragments; the
    same seed streams the same fragments."""
    from stream_helpers import assert_same_fragment, weights_version

    from simkit.clients import PolicyStream
    from simkit.models import ModelSpec, build_model
    from simkit.servers import RolloutServer

    spec = ModelSpec("mlp", {"hidden_sizes": [8]})
    local = make(1)
    model = build_model(spec, local.single_observation_space, local.single_action_space)
    local.close()
    server = RolloutServer(
        ENV,
        3,
        "tcp://127.0.0.1:0",
        policy=True,
        device="cpu",
        fragment_length=4,
        env_kwargs={"backend": "mjwarp"},
    ).start()
    try:
        runs = []
        for _ in range(2):
            with PolicyStream([server.endpoint], spec, num_envs=3, seed=5, timeout=60) as stream:
                frags = []
                for version in range(2):
                    stream.push_weights(weights_version(model, version))
                    frags.append(stream.next_batch())
                runs.append(frags)
    finally:
        server.stop()
    first = runs[0][0]
    assert first.obs.shape == (4, 3, 17)
    assert np.isfinite(first.rewards).all()
    assert isinstance(first.obs, np.ndarray)
    for a, b in zip(*runs, strict=True):
        assert_same_fragment(a, b)


@_mjwarp
def test_time_limit_resets_run_on_the_host_and_the_steps_never_read_the_device() -> None:
    """BatchCheetah never terminates (``time_limit_only``): a whole-batch step knows
    from the host step counts which worlds reset, runs their exact host reset and reads
    nothing back; the bits are the host path's, reset parameters included."""
    import torch
    from device_helpers import no_host_reads

    n, limit = 3, 3
    acts = [torch.from_numpy(a) for a in actions(n, 7, seed=6)]
    kw: dict[str, Any] = {"max_episode_steps": limit, "validate_actions": False}
    known, host = make(n, **kw), make(n, **kw)
    host.time_limit_only = False  # type: ignore[misc]  # the host path, for its bits
    known.reset(seed=4)
    host.reset(seed=4)
    assert known.prepare_device_steps(7)
    assert not host.prepare_device_steps(7)
    with no_host_reads(torch):
        steps = [known.step_batch(a) for a in acts]
    for a, got in zip(acts, steps, strict=True):
        want = host.step_batch(a)
        for name in ("obs", "final_obs", "reward", "terminated", "truncated"):
            x, y = getattr(got, name), getattr(want, name)
            assert x.dtype == y.dtype, name
            assert torch.equal(x, y), name
        for k in np.flatnonzero(want.truncated.numpy()).tolist():
            np.testing.assert_equal(got.infos[k]["reset_info"], want.infos[k]["reset_info"])
    assert [bool(s.truncated.all()) for s in steps] == [t % limit == limit - 1 for t in range(7)]
    stats = known.read_episode_stats()
    assert np.array_equal(stats["episodes"], np.full(n, 2))
    assert np.array_equal(stats["length_sum"], np.full(n, 2 * limit))
    rewards = torch.stack([s.reward for s in steps[: 2 * limit]]).sum(0).numpy()
    np.testing.assert_allclose(stats["return_sum"], rewards, rtol=1e-12)
    known.close()
    host.close()


@_mjwarp
def test_batch_cheetah_on_mjwarp_trains_in_the_device_loop_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    """``simkit train simkit/BatchCheetah-v0 --env-kwarg backend=mjwarp --device-loop on
    --servers 0 --device cpu``, tiny: the env kwargs reach the device loop's env and
    the checkpoint, and a resume (which builds the same env from the checkpoint)
    continues bit for bit."""
    import torch

    import simkit
    from simkit.clients import PPOArgs
    from simkit.clients.learners._checkpoint import load_checkpoint

    args = PPOArgs(
        env_id=ENV,
        env_kwargs={"backend": "mjwarp", "max_episode_steps": 5},
        num_envs=3,
        num_steps=4,  # episodes of 5 steps cross fragment boundaries
        num_minibatches=2,
        update_epochs=1,
        hidden=(8,),
        seed=2,
        device_loop="on",
    )

    def run(name: str, updates: int, resume: bool = False) -> Any:
        return simkit.train(
            args,
            logdir=tmp_path / name,
            resume=tmp_path / name if resume else None,
            max_rounds=updates,
            tensorboard=False,
            servers=0,
        )

    full = run("full", 2)
    assert full.rollout == "device loop on cpu"
    part = run("part", 1)
    state = load_checkpoint(part.checkpoint).state
    assert state["args"]["env_kwargs"] == {"backend": "mjwarp", "max_episode_steps": 5}
    assert state["source_kind"] == "device"
    rest = run("part", 1, resume=True)
    a, b = load_checkpoint(full.checkpoint), load_checkpoint(rest.checkpoint)
    for k in a.model:
        assert torch.equal(a.model[k], b.model[k]), k
    assert full.mean_return == rest.mean_return
