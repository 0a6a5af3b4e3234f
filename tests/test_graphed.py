"""The learners' static steps (clients/learners/_graphed.py): PPO's minibatch step and SAC's
gradient step over static buffers, replayed as CUDA graphs on CUDA.

Both learners run their one step through the static buffers on every device (uncaptured
off CUDA): these tests compare PPO's epochs with a plain eager loop (CleanRL's: a gather
per epoch, contiguous minibatches) and SAC's steps with a plain eager step (CleanRL's:
fresh tensors per batch, the entropy coefficient a float, every figure read back) bit
for bit. Neither static step reads a tensor back (a read back cannot be captured).
The CUDA tests (skipped without a device) compare the graphs with the same static step
run eagerly on the same device, and a resume from a checkpoint mid-run.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.utils._python_dispatch import TorchDispatchMode

from simkit._types import Fragment
from simkit.clients.learners._args import PPOArgs, SACArgs
from simkit.clients.learners._checkpoint import flatten_optimizer, unflatten_optimizer
from simkit.clients.learners._graphed import PPOStep, SACStep, use_cuda_graph
from simkit.clients.learners._replay import ReplayBatch, ReplayBuffer
from simkit.clients.learners._train_sac import sac_spec
from simkit.clients.learners.ppo import PPO
from simkit.clients.learners.sac import SAC
from simkit.models import ModelSpec, build_model

OBS, ACT = 5, 2
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (the GPU check runs it)")


def _fragment(rng: np.random.Generator, T: int, R: int) -> Fragment:
    term = rng.random((T, R)) < 0.03
    return Fragment(
        obs=rng.normal(size=(T, R, OBS)).astype(np.float32),
        actions=rng.normal(size=(T, R, ACT)).astype(np.float32),
        log_probs=rng.normal(-3.0, 1.0, size=(T, R)).astype(np.float32),
        values=rng.normal(size=(T, R)).astype(np.float32),
        rewards=rng.normal(size=(T, R)),
        terminated=term,
        truncated=(rng.random((T, R)) < 0.03) & ~term,
        final_values=rng.normal(size=(T, R)).astype(np.float32),
        agent_mask=np.ones((T, R), bool),
        policy_version=np.zeros(T, np.int64),
        last_obs=rng.normal(size=(R, OBS)).astype(np.float32),
        last_values=rng.normal(size=R).astype(np.float32),
        env_ids=np.arange(R),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
        episode_rows=np.zeros(0, np.int64),
        source="test",
        sequence=0,
    )


def _ppo(device: str, **kw: Any) -> PPO:
    args = PPOArgs(
        env_id="simkit/Cheetah-v0",
        num_envs=2,
        num_steps=48,
        num_minibatches=4,
        update_epochs=3,
        total_steps=2 * 48 * 5,  # lr annealing on: the lr changes every update
        device=device,
        **kw,
    )
    obs_space = spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    act_space = spaces.Box(-1.0, 1.0, (ACT,), np.float32)
    torch.manual_seed(0)
    model = build_model(ModelSpec("mlp", {"hidden_sizes": [16, 16]}), obs_space, act_space)
    return PPO(args, model.train(), 2)


def _sac(device: str, **kw: Any) -> SAC:
    args = SACArgs(env_id="simkit/Pendulum-v0", seed=2, batch_size=16, hidden=(16, 16), **kw)
    obs_space = spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    act_space = spaces.Box(-2.0, 2.0, (ACT,), np.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = build_model(sac_spec(args), obs_space, act_space)
    return SAC(args, model, torch.device(device))


def _buffer() -> ReplayBuffer:
    rng = np.random.default_rng(5)
    n = 400
    buf = ReplayBuffer(n, obs_shape=(OBS,), action_shape=(ACT,))
    buf.add(
        obs=rng.standard_normal((n, OBS), np.float32),
        actions=rng.uniform(-2, 2, (n, ACT)).astype(np.float32),
        rewards=rng.standard_normal(n).astype(np.float32),
        next_obs=rng.standard_normal((n, OBS), np.float32),
        terminated=rng.random(n) < 0.1,
        truncated=np.zeros(n, bool),
        versions=rng.integers(0, 3, n),
    )
    return buf


def _assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].cpu(), b[k].cpu()), k


def _opt_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    return flatten_optimizer(opt.state_dict())[0]


def _ppo_stats(stats: Any) -> tuple[float, ...]:
    return (
        stats.policy_loss,
        stats.value_loss,
        stats.entropy,
        stats.approx_kl,
        stats.clipfrac,
        stats.explained_variance,
        stats.learning_rate,
    )


# ------------------------------------------------------------------------ the option


def test_the_graph_is_used_on_cuda_devices_only() -> None:
    assert use_cuda_graph(True, torch.device("cpu")) is False
    assert use_cuda_graph(False, torch.device("cpu")) is False
    assert use_cuda_graph(False, torch.device("cuda", 0)) is False
    assert use_cuda_graph(True, torch.device("cuda", 0)) is True
    assert PPOArgs().cuda_graph is True
    assert SACArgs().cuda_graph is True


def test_off_cuda_both_learners_run_their_static_steps_uncaptured() -> None:
    for step in (_ppo("cpu")._static, _sac("cpu")._static):
        assert isinstance(step, PPOStep | SACStep)
        assert not step.capture
        assert step.lr is None  # the optimiser's own float learning rates


def test_capture_on_the_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match="capture needs a CUDA device, got cpu"):
        PPOStep(_ppo("cpu"), capture=True)
    with pytest.raises(ValueError, match="capture needs a CUDA device, got cpu"):
        SACStep(_sac("cpu"), capture=True)


# ------------------------------------------------------------------------ CPU: same bits


def _eager_epochs(ppo: PPO, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's epochs as a plain eager loop (CleanRL's): per epoch a permutation, one
    gather per tensor, contiguous minibatch slices, torch's own gradient clip."""
    args = ppo.args
    n = batch[0].shape[0]
    mb = max(1, n // args.num_minibatches)
    pieces = []
    for _ in range(args.update_epochs):
        perm = torch.randperm(n, generator=ppo.generator)
        shuffled = [t[perm] for t in batch]
        for begin in range(0, n - mb + 1, mb):
            loss, stats = ppo.minibatch_loss(*(t[begin : begin + mb] for t in shuffled))
            ppo.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ppo._params, args.max_grad_norm, foreach=True)
            ppo.optimizer.step()
            pieces.append(stats)
    return pieces[-1], torch.stack(pieces).mean(0)


def _eager(ppo: PPO) -> PPO:
    ppo._epochs = lambda batch: _eager_epochs(ppo, batch)  # type: ignore[method-assign]
    return ppo


def test_ppo_epochs_give_a_plain_eager_loops_bits() -> None:
    rng = np.random.default_rng(1)
    fragments = [_fragment(rng, 48, 2) for _ in range(3)]
    plain, ppo = _eager(_ppo("cpu")), _ppo("cpu")
    for f in fragments:
        a, b = plain.update([f]), ppo.update([f])
        assert _ppo_stats(a) == _ppo_stats(b)
    _assert_same_tensors(plain.model.state_dict(), ppo.model.state_dict())
    _assert_same_tensors(_opt_tensors(plain.optimizer), _opt_tensors(ppo.optimizer))
    # The optimiser's groups hold plain floats (checkpoints write them as they are).
    assert (
        plain.optimizer.state_dict()["param_groups"] == ppo.optimizer.state_dict()["param_groups"]
    )


def test_ppo_static_step_follows_a_batch_of_another_size() -> None:
    rng = np.random.default_rng(2)
    plain, ppo = _eager(_ppo("cpu")), _ppo("cpu")
    for rows in (2, 1, 2):  # async runs may update on fewer rows (a new shape)
        f = _fragment(rng, 48, rows)
        assert _ppo_stats(plain.update([f])) == _ppo_stats(ppo.update([f]))
    _assert_same_tensors(plain.model.state_dict(), ppo.model.state_dict())


def _eager_sac_step(sac: SAC, batch: ReplayBatch) -> tuple[float, float, float, float]:
    """SAC's gradient step as a plain eager function (CleanRL's): fresh tensors per
    batch, the entropy coefficient a Python float, every figure read back."""
    args, optimizer, qf = sac.args, sac.optimizer, sac.qf
    obs, actions, next_obs, rewards = (
        torch.from_numpy(a) for a in (batch.obs, batch.actions, batch.next_obs, batch.rewards)
    )
    not_done = 1.0 - torch.from_numpy(batch.terminated.astype(np.float32))
    with torch.no_grad():
        next_actions, next_log_pi = sac._actor(next_obs)
        q_next = sac.qf_target(next_obs, next_actions).min(0).values
        target = rewards + args.gamma * not_done * (q_next - sac.alpha * next_log_pi)
    q = qf(obs, actions)
    qf_loss = (q - target).square().mean(1).sum()
    optimizer.zero_grad(set_to_none=True)
    qf_loss.backward()
    optimizer.step()
    actor_loss = alpha_loss = float("nan")
    if sac.updates % args.policy_frequency == 0:
        qf.requires_grad_(False)
        for _ in range(args.policy_frequency):
            pi, log_pi = sac._actor(obs)
            loss = (sac.alpha * log_pi - qf(obs, pi).min(0).values).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            actor_loss = float(loss.detach())
            if args.autotune:
                a_loss = (-sac.log_alpha.exp() * (log_pi.detach() + sac.target_entropy)).mean()
                a_loss.backward()
                alpha_loss = float(a_loss.detach())
            optimizer.step()
            if args.autotune:
                sac.alpha = float(sac.log_alpha.detach().exp())
        qf.requires_grad_(True)
    if sac.updates % args.target_network_frequency == 0:
        torch._foreach_lerp_(list(sac.qf_target.parameters()), list(qf.parameters()), args.tau)
    sac.updates += 1
    return float(qf_loss.detach()) / 2.0, actor_loss, alpha_loss, float(q.detach().mean())


def _eager_sac_run(sac: SAC, buf: ReplayBuffer, n: int) -> dict[str, float]:
    """:meth:`SAC.run`'s figures over ``n`` :func:`_eager_sac_step` s."""
    out = buf.empty_batch(sac.args.batch_size)
    sums, counts = np.zeros(5), np.zeros(5)
    for _ in range(n):
        batch = buf.sample_into(out, sac.sampler)
        arr = np.asarray((*_eager_sac_step(sac, batch), sac.version - batch.versions.mean()))
        ok = ~np.isnan(arr)
        sums[ok] += arr[ok]
        counts[ok] += 1
    means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).tolist()
    names = ("qf_loss", "actor_loss", "alpha_loss", "q_mean", "sample_age")
    return {**dict(zip(names, means, strict=True)), "alpha": sac.alpha}


@pytest.mark.parametrize("autotune", [True, False])
def test_sac_steps_give_a_plain_eager_steps_bits(autotune: bool) -> None:
    buf = _buffer()
    plain, sac = _sac("cpu", autotune=autotune), _sac("cpu", autotune=autotune)
    for n in (3, 5, 1):  # rounds of several steps: actor every 2nd, targets every step
        a, b = _eager_sac_run(plain, buf, n), sac.run(buf, n)
        for field, value in a.items():
            assert np.array_equal(value, getattr(b, field), equal_nan=True), field
    out = buf.empty_batch(16)
    for _ in range(2):  # one step alone (SAC.step), with and without the actor
        want = _eager_sac_step(plain, buf.sample_into(out, plain.sampler))
        got = sac.step(buf.sample_into(out, sac.sampler))
        assert np.array_equal(want, got, equal_nan=True)
        assert plain.alpha == sac.alpha
    assert plain.updates == sac.updates == 11
    _assert_same_tensors(plain.tensors(), sac.tensors())
    _assert_same_tensors(_opt_tensors(plain.optimizer), _opt_tensors(sac.optimizer))
    assert torch.equal(plain.generator.get_state(), sac.generator.get_state())


class _ReadBacks(TorchDispatchMode):
    """Records the ops that read a tensor back to the host or make a tensor from host
    data: neither can be captured in a CUDA graph."""

    BAD = ("_local_scalar_dense", "nonzero", "lift_fresh", "masked_select", "item")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.__name__.split(".")[0]
        if name in self.BAD:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@contextmanager
def _read_backs() -> Iterator[_ReadBacks]:
    mode = _ReadBacks()
    with mode:
        yield mode


def test_the_static_steps_never_read_a_tensor_back() -> None:
    rng = np.random.default_rng(3)
    ppo = _ppo("cpu")
    step = ppo._static
    ppo.update([_fragment(rng, 48, 2)])  # builds the buffers
    step.k.zero_()
    with _read_backs() as mode:
        step._step()
    assert mode.seen == []
    sac = _sac("cpu")
    sstep = sac._static
    buf = _buffer()
    sac.run(buf, 2)
    for actor in (True, False):
        with _read_backs() as mode:
            sstep._step(actor=actor, target=True)
        assert mode.seen == [], actor


class _Event:
    """Stands in for ``torch.cuda.Event``: records the calls."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def synchronize(self) -> None:
        self.calls.append("wait")

    def record(self) -> None:
        self.calls.append("record")


def test_sac_batches_go_through_the_staging_buffers_waiting_only_for_the_last_copy() -> None:
    # The CUDA path of SACStep._copy_in, run on the CPU (plain memory for the pinned).
    sac = _sac("cpu")
    step = sac._static
    buf = _buffer()
    out = buf.empty_batch(16)
    batch = buf.sample_into(out, sac.sampler)
    arrays = (batch.obs, batch.actions, batch.next_obs, batch.rewards, batch.terminated)
    step.inputs = [torch.full(a.shape, -1.0) for a in arrays]
    step._staging = [torch.zeros(a.shape) for a in arrays]
    calls: list[str] = []
    step._staged = _Event(calls)  # type: ignore[assignment]
    step._copy_in(arrays)
    assert calls == ["wait", "record"]
    for got, a in zip(step.inputs, arrays, strict=True):
        assert torch.equal(got, torch.from_numpy(a).to(torch.float32))
    assert set(step.inputs[4].unique().tolist()) <= {0.0, 1.0}


# ------------------------------------------------------------------------ CUDA


def _ppo_run(learner: PPO, fragments: list[Fragment]) -> list[tuple[float, ...]]:
    return [_ppo_stats(learner.update([f])) for f in fragments]


@needs_cuda
def test_ppo_cuda_graph_gives_the_eager_bits_on_cuda() -> None:
    rng = np.random.default_rng(4)
    fragments = [_fragment(rng, 48, 2) for _ in range(4)]
    graphed, eager = _ppo("cuda", cuda_graph=True), _ppo("cuda", cuda_graph=False)
    assert isinstance(graphed._static, PPOStep)
    assert graphed._static.capture
    assert isinstance(eager._static, PPOStep)
    assert not eager._static.capture
    assert _ppo_run(graphed, fragments) == _ppo_run(eager, fragments)
    _assert_same_tensors(graphed.model.state_dict(), eager.model.state_dict())
    _assert_same_tensors(_opt_tensors(graphed.optimizer), _opt_tensors(eager.optimizer))


@needs_cuda
def test_ppo_cuda_graph_resumes_from_a_checkpoint_mid_run_with_the_same_bits() -> None:
    rng = np.random.default_rng(5)
    fragments = [_fragment(rng, 48, 2) for _ in range(4)]
    whole = _ppo("cuda")
    _ppo_run(whole, fragments)
    first = _ppo("cuda")
    _ppo_run(first, fragments[:2])
    tensors, groups = flatten_optimizer(first.optimizer.state_dict())  # as a checkpoint holds
    resumed = _ppo("cuda")
    resumed.model.load_state_dict({k: v.cpu() for k, v in first.model.state_dict().items()})
    resumed.optimizer.load_state_dict(unflatten_optimizer(tensors, copy.deepcopy(groups)))
    resumed.generator.set_state(first.generator.get_state())
    resumed.version, resumed.global_step = first.version, first.global_step
    resumed.scaler.set_state(first.scaler.get_state())
    assert _ppo_run(resumed, fragments[2:]) == _ppo_run(first, fragments[2:])
    _assert_same_tensors(whole.model.state_dict(), resumed.model.state_dict())
    _assert_same_tensors(_opt_tensors(whole.optimizer), _opt_tensors(resumed.optimizer))


@needs_cuda
def test_ppo_cuda_graph_follows_an_optimizer_state_loaded_after_capture() -> None:
    rng = np.random.default_rng(6)
    fragments = [_fragment(rng, 48, 2) for _ in range(3)]
    a, b = _ppo("cuda"), _ppo("cuda")
    _ppo_run(a, fragments[:1])
    _ppo_run(b, fragments[1:2])  # b captured its graph on other state
    b.model.load_state_dict(a.model.state_dict())
    b.optimizer.load_state_dict(a.optimizer.state_dict())  # new state tensors
    b.generator.set_state(a.generator.get_state())
    b.version, b.global_step = a.version, a.global_step
    b.scaler.set_state(a.scaler.get_state())
    assert _ppo_run(a, fragments[1:]) == _ppo_run(b, fragments[1:])
    _assert_same_tensors(a.model.state_dict(), b.model.state_dict())


@needs_cuda
@pytest.mark.parametrize("autotune", [True, False])
def test_sac_cuda_graph_gives_the_eager_bits_on_cuda(autotune: bool) -> None:
    buf = _buffer()
    graphed = _sac("cuda", cuda_graph=True, autotune=autotune)
    eager = _sac("cuda", cuda_graph=False, autotune=autotune)
    assert isinstance(graphed._static, SACStep)
    assert graphed._static.capture
    assert isinstance(eager._static, SACStep)
    assert not eager._static.capture
    for n in (3, 5, 4):
        a, b = graphed.run(buf, n), eager.run(buf, n)
        for field in ("qf_loss", "actor_loss", "alpha", "alpha_loss", "q_mean", "sample_age"):
            assert np.array_equal(getattr(a, field), getattr(b, field), equal_nan=True), field
    _assert_same_tensors(graphed.tensors(), eager.tensors())
    _assert_same_tensors(_opt_tensors(graphed.optimizer), _opt_tensors(eager.optimizer))
    assert torch.equal(graphed.generator.get_state(), eager.generator.get_state())


@needs_cuda
def test_sac_cuda_graph_resumes_from_a_checkpoint_mid_run_with_the_same_bits() -> None:
    buf = _buffer()
    whole = _sac("cuda")
    for n in (3, 4, 5):
        whole.run(buf, n)
    first = _sac("cuda")
    for n in (3, 4):
        first.run(buf, n)
    tensors, groups = flatten_optimizer(first.optimizer.state_dict())
    resumed = _sac("cuda")
    resumed.load_tensors({k: v.cpu() for k, v in first.tensors().items()})
    resumed.optimizer.load_state_dict(unflatten_optimizer(tensors, copy.deepcopy(groups)))
    resumed.load_counters(first.counters())  # generator and replay sampler too
    resumed.run(buf, 5)
    _assert_same_tensors(whole.tensors(), resumed.tensors())
    _assert_same_tensors(_opt_tensors(whole.optimizer), _opt_tensors(resumed.optimizer))


def _checkpoint_tensors(path: Any) -> dict[str, torch.Tensor]:
    from simkit.clients.learners._checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    return {
        **{f"model.{k}": v for k, v in ckpt.model.items()},
        **{f"adam.{k}": v for k, v in flatten_optimizer(ckpt.optimizer)[0].items()},
    }


@needs_cuda
def test_ppo_training_on_cuda_resumes_exactly_and_the_graph_gives_the_eager_run(
    tmp_path: Any,
) -> None:
    import simkit

    base = {
        "env_id": "simkit/CartPole-v0",
        "num_envs": 2,
        "num_steps": 37,
        "num_minibatches": 2,
        "update_epochs": 2,
        "total_steps": 2 * 37 * 4,
        "seed": 3,
        "device": "cuda",
        "device_loop": "off",
    }

    def train(name: str, updates: int, resume: bool = False, **kw: Any) -> Any:
        return simkit.train(
            PPOArgs(**{**base, **kw}),
            logdir=tmp_path / name,
            resume=tmp_path / name if resume else None,
            max_rounds=updates,
            tensorboard=False,
            servers=0,
        )

    full = train("full", 4)
    eager = train("eager", 4, cuda_graph=False)
    train("split", 2)
    rest = train("split", 2, resume=True)
    assert rest.updates == full.updates == 4
    want = _checkpoint_tensors(full.checkpoint)
    _assert_same_tensors(want, _checkpoint_tensors(eager.checkpoint))
    _assert_same_tensors(want, _checkpoint_tensors(rest.checkpoint))


@needs_cuda
def test_sac_training_on_cuda_resumes_exactly_and_the_graph_gives_the_eager_run(
    tmp_path: Any,
) -> None:
    import simkit

    args = SACArgs(
        env_id="simkit/Pendulum-v0",
        seed=7,
        total_steps=240,
        num_envs=2,
        num_steps=4,
        buffer_size=1000,
        batch_size=32,
        learning_starts=64,
        hidden=(32, 32),
        device="cuda",
    )

    def train(name: str, resume: bool = False, **kw: Any) -> Any:
        return simkit.train(
            dataclasses.replace(args, **kw),
            logdir=tmp_path / name,
            resume=tmp_path / name if resume else None,
            max_rounds=None if resume or name != "split" else 15,
            servers=0,
            tensorboard=False,
        )

    train("straight")
    train("eager", cuda_graph=False)
    train("split")
    train("split", resume=True)
    want = _checkpoint_tensors(tmp_path / "straight")
    _assert_same_tensors(want, _checkpoint_tensors(tmp_path / "eager"))
    _assert_same_tensors(want, _checkpoint_tensors(tmp_path / "split"))


def test_a_resume_may_switch_the_cuda_graph() -> None:
    from simkit.clients.learners._checkpoint import resumed_settings
    from simkit.clients.learners._train_sac import SAC_RESUME_FREE
    from simkit.clients.learners.ppo import resume_args

    assert resume_args(PPOArgs(), PPOArgs(cuda_graph=False)).cuda_graph is False
    sac = resumed_settings(SACArgs(), SACArgs(cuda_graph=False), SAC_RESUME_FREE, ["cuda_graph"])
    assert sac.cuda_graph is False
