"""Placement-independent sampling: the rollout's env steps/s, keyed noise vs a seeded generator.

Usage: ``python bench/bench_sampling.py [--rounds 5] [--seconds 1.5] [--fragment-length 128]
[--configs simkit/CartPole-v0:8 ...]``

The rollout loop is the servers' own (:class:`simkit.rollout._loop.RolloutLoop`
over :func:`simkit.rollout._rows.make_env_rows`, the loop the learner's
in-process source runs too), with the built-in ``"mlp"`` policy (64x64 tanh,
observation normalisation on, one torch thread) acting through its numpy path
(:class:`simkit.models._lean.LeanMLP`). Two policies act in it:

- new: :class:`simkit.rollout._policy.RowPolicy` as it is: each step draws the
  noise of every env slot from :class:`simkit._noise.SlotNoise` (a PCG64 stream
  advanced to the window of (step, block)) and ``LeanMLP`` computes the rows in
  zero-padded blocks of 16 aligned to their global index (one ``(m, 16, K) @ (K, N)``
  stacked product per layer), so a row's bits do not depend on its batch;
- old: :class:`OldPolicy`, a re-implementation of the act path this replaced
  (``GroupedPolicy`` with one sampling group, the default, and the ``LeanMLP`` of
  then): one ``torch.Generator`` seeded once, ``torch.randn((n, dim))`` (Gaussian
  head) or ``torch.rand((n, 1))`` (categorical head) per step, and one ``x @ W + b``
  (one BLAS gemm) per layer; the sampling arithmetic given the noise is the same as
  ``LeanMLP.act``'s. ``value`` evaluates the whole group when any row of it is asked
  for, as the old group did.

Each configuration (env id, N envs) keeps one loop per policy alive. A round runs, for
every configuration, each loop for ``--seconds`` of loop steps, alternating which goes
first; env steps/s = loop steps x N / wall seconds. Figures are medians over rounds;
"ratio" is the median of the per-round ratios new/old (the two runs of a round are
adjacent in time, so machine load hits them alike). CPU time (``time.process_time``)
is reported beside the wall clock: on a shared machine it is much less noisy.

Then the cost split per loop step (``RolloutLoop.take_times``: ``inference`` is act +
value, ``env`` the env step, the rest fragment assembly) and, out of the loop, the two
parts of an act timed alone (medians of interleaved rounds): the noise draw
(``SlotNoise.draw`` vs ``torch.randn``/``torch.rand`` with the generator) and the
forward + sampling given the noise (aligned-block vs plain gemm trunks). The load average is
printed before and after.

numpy's OpenBLAS runs a large enough gemm on every core unless told otherwise
(``torch.set_num_threads`` does not reach it); nothing in simkit sets it, so the
default run is what a rollout process does. ``OPENBLAS_NUM_THREADS=1 python
bench/bench_sampling.py`` measures both ways on one core, as on a server whose cores
are all busy. The header says which.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simkit.models import ActorCritic, ModelSpec, build_model, get_weights
from simkit.models._lean import LeanMLP
from simkit.rollout._loop import RolloutLoop
from simkit.rollout._policy import PolicyOutput, RowPolicy
from simkit.rollout._rows import make_env_rows

SPEC = ModelSpec("mlp", {"hidden_sizes": [64, 64]})
CONFIGS = (
    "simkit/CartPole-v0:8",
    "simkit/CartPole-v0:64",
    "simkit/BatchCheetah-v0:64",
    "simkit/BatchCartPole-v0:1024",
)
SEED = 1

Layers = list[tuple[np.ndarray, np.ndarray, str | None]]


def _normalised(lean: LeanMLP, obs: np.ndarray) -> np.ndarray:
    """The policy's float32, normalised inputs (unpadded, as the old forward took them)."""
    x, at = lean._input(obs, 0)
    return x[at]


def _gemm_trunk(x: np.ndarray, layers: Layers) -> np.ndarray:
    """The old ``LeanMLP._trunk``: one ``x @ w + b`` per layer."""
    for w, b, act in layers:
        x = x @ w + b
        if act == "tanh":
            x = np.tanh(x)
        elif act == "relu":
            x = np.maximum(x, np.float32(0.0))
    return x


def _old_sample(
    lean: LeanMLP, x: np.ndarray, noise: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The old ``LeanMLP.act`` given its noise: gemm trunks, then ``LeanMLP.act``'s
    sampling arithmetic (``noise`` ``(n, dim)`` normals or ``(n, 1)`` uniforms)."""
    values = _gemm_trunk(x, lean.critic).reshape(-1)
    params = _gemm_trunk(x, lean.actor) @ lean.head_w + lean.head_b
    n = x.shape[0]
    if lean.gaussian:
        actions = (params + lean.std * noise).astype(lean.action_dtype, copy=False)
        log_probs = np.square(noise).sum(-1) * np.float32(-0.5) - lean.norm
        return actions, log_probs.astype(np.float32, copy=False), values
    top = params.max(-1, keepdims=True)
    logp = params - top
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    cdf = np.exp(logp).cumsum(-1)
    idx = np.minimum((cdf <= noise * cdf[:, -1:]).sum(-1), lean.dim - 1)
    log_probs = logp[np.arange(n), idx]
    return idx.astype(np.int64) + lean.start, log_probs.astype(np.float32), values


class OldPolicy(RowPolicy):
    """The act path before keyed noise: one seeded ``torch.Generator`` for every row
    (one sampling group) and gemm trunks (see the module docstring)."""

    def __init__(self, model: ActorCritic, **kwargs: Any) -> None:
        super().__init__(model, torch.device("cpu"), **kwargs)
        if self.lean is None:
            raise ValueError("the old path is the LeanMLP one: a plain MLP on the CPU")
        self.generator = torch.Generator().manual_seed(kwargs["seed"])

    def draw(self, n: int) -> np.ndarray:
        """The old per-step draw: ``(n, dim)`` normals or ``(n, 1)`` uniforms."""
        lean = self.lean
        assert lean is not None
        if lean.gaussian:
            return torch.randn((n, lean.dim), generator=self.generator, dtype=torch.float32).numpy()
        return torch.rand((n, 1), generator=self.generator, dtype=torch.float32).numpy()

    @torch.inference_mode()
    def act(self, obs: np.ndarray, step: int, part: slice | None = None) -> PolicyOutput:
        """Samples every row of ``obs`` from the generator (``step``, ``part`` unused:
        the old loop had one group and acted on every row at once)."""
        start = time.perf_counter()
        lean = self.lean
        assert lean is not None
        x = _normalised(lean, obs)
        actions, log_probs, values = _old_sample(lean, x, self.draw(x.shape[0]))
        return PolicyOutput(
            # the old path concatenated its groups' outputs (one group: one copy)
            actions=np.concatenate([actions]).astype(self.action_dtype, copy=False),
            log_probs=np.concatenate([log_probs]),
            values=np.concatenate([values]),
            seconds=time.perf_counter() - start,
        )

    @torch.inference_mode()
    def value(
        self, obs: np.ndarray, rows: np.ndarray | None = None, part: slice | None = None
    ) -> np.ndarray:
        """Values of every row, or zeros where no row is asked for (one group; ``part``
        unused, as in :meth:`act`)."""
        if rows is not None and not rows.any():
            return np.zeros(len(obs), dtype=np.float32)
        lean = self.lean
        assert lean is not None
        out: np.ndarray = _gemm_trunk(_normalised(lean, obs), lean.critic).reshape(-1)
        return out


@dataclass
class Way:
    """One policy's loop over one configuration, and its per-round figures."""

    loop: RolloutLoop
    rates: list[float] = field(default_factory=list)
    """env steps/s, wall clock."""
    cpu_rates: list[float] = field(default_factory=list)
    """env steps per CPU second."""
    step_us: list[float] = field(default_factory=list)
    act_us: list[float] = field(default_factory=list)
    env_us: list[float] = field(default_factory=list)
    share: list[float] = field(default_factory=list)
    """inference seconds / wall seconds."""

    def run(self, seconds: float, n: int, record: bool = True) -> float:
        """Steps the loop for ``seconds``; returns env steps/s (recorded unless warm-up)."""
        loop = self.loop
        loop.take_times()
        steps = 0
        cpu = time.process_time()
        start = time.perf_counter()
        while True:
            for _ in range(8):
                loop.step()
            steps += 8
            wall = time.perf_counter() - start
            if wall >= seconds:
                break
        cpu = time.process_time() - cpu
        times = loop.take_times()
        rate = steps * n / wall
        if record:
            self.rates.append(rate)
            self.cpu_rates.append(steps * n / cpu)
            self.step_us.append(wall / steps * 1e6)
            self.act_us.append(times.inference / steps * 1e6)
            self.env_us.append(times.env / steps * 1e6)
            self.share.append(times.inference / wall)
        return rate


def _model(env_id: str) -> ActorCritic:
    probe = make_env_rows(env_id, 1)
    torch.manual_seed(0)
    model = build_model(SPEC, probe.observation_space, probe.action_space)
    probe.close()
    # Observation statistics as after some training, so the normalisation runs as in a job.
    rms = model.obs_rms
    if rms is not None:
        with torch.no_grad():
            rms.mean.normal_(0.0, 0.1)
            rms.var.uniform_(0.5, 2.0)
    return model


def _loop(env_id: str, n: int, model: ActorCritic, old: bool, fragment_length: int) -> Way:
    envs = make_env_rows(env_id, n)
    kwargs: dict[str, Any] = {
        "seed": SEED,
        "first_slot": 0,
        "num_slots": n,
        "rows_per_slot": envs.agents_per_env,
        "action_space": envs.action_space,
    }
    policy: RowPolicy = (
        OldPolicy(model, **kwargs) if old else RowPolicy(model, torch.device("cpu"), **kwargs)
    )
    policy.set_weights(get_weights(model, 0))
    loop = RolloutLoop(envs, policy, fragment_length=fragment_length)
    loop.reset(SEED, 0)
    return Way(loop)


def _check_peer(old: Way, new: Way) -> None:
    """The peer samples as ``LeanMLP.act`` does, given the same noise (up to the trunks'
    float32 rounding): a guard that the re-implementation measures the same work."""
    new_policy, old_policy = new.loop.policy, old.loop.policy
    assert isinstance(old_policy, OldPolicy)
    assert new_policy.lean is not None
    obs = np.asarray(new.loop._obs[0])
    n = len(obs)
    lean = new_policy.lean
    noise = old_policy.draw(n)
    a_old, lp_old, v_old = _old_sample(lean, _normalised(lean, obs), noise)
    width = new_policy.noise.width
    a_new, lp_new, v_new = lean.act(obs, np.ascontiguousarray(noise[:, :width]))
    np.testing.assert_allclose(v_old, v_new, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lp_old, lp_new, rtol=1e-4, atol=1e-5)
    if lean.gaussian:
        np.testing.assert_allclose(a_old, a_new, rtol=1e-4, atol=1e-5)
    else:
        assert (a_old == a_new).mean() > 0.99


def _parts(old: Way, new: Way, rounds: int, reps: int) -> dict[str, tuple[float, float]]:
    """Median µs ``(old, new)`` of one noise draw and one forward + sampling (all rows)."""
    old_policy, new_policy = old.loop.policy, new.loop.policy
    assert isinstance(old_policy, OldPolicy)
    lean = new_policy.lean
    assert lean is not None
    obs = np.asarray(new.loop._obs[0])
    n = len(obs)
    x = _normalised(lean, obs)
    old_noise = old_policy.draw(n)
    new_noise = new_policy.noise.draw(0)
    counter = iter(range(1 << 62))
    ways: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "noise draw": (
            lambda: old_policy.draw(n),
            lambda: new_policy.noise.draw(next(counter)),
        ),
        "forward + sampling, given the noise": (
            lambda: _old_sample(lean, x, old_noise),
            lambda: lean.act(obs, new_noise),
        ),
    }
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in ways}
    for r in range(rounds):
        for name, fns in ways.items():
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for i in order:
                fn = fns[i]
                start = time.perf_counter()
                for _ in range(reps):
                    fn()
                times[name][i].append((time.perf_counter() - start) / reps * 1e6)
    return {k: (statistics.median(o), statistics.median(w)) for k, (o, w) in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--fragment-length", type=int, default=128)
    parser.add_argument(
        "--configs", nargs="+", default=list(CONFIGS), help="ENV_ID:N (default: the four rows)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    configs = [(c.rsplit(":", 1)[0], int(c.rsplit(":", 1)[1])) for c in args.configs]
    ways: dict[tuple[str, int], tuple[Way, Way]] = {}
    for env_id, n in configs:
        model = _model(env_id)
        old = _loop(env_id, n, model, True, args.fragment_length)
        new = _loop(env_id, n, model, False, args.fragment_length)
        _check_peer(old, new)
        old.run(0.3, n, record=False)  # warm-up
        new.run(0.3, n, record=False)
        ways[env_id, n] = (old, new)
    ratios: dict[tuple[str, int], list[float]] = {k: [] for k in ways}
    cpu_ratios: dict[tuple[str, int], list[float]] = {k: [] for k in ways}
    try:
        for r in range(args.rounds):
            for (env_id, n), (old, new) in ways.items():
                first, second = (old, new) if r % 2 == 0 else (new, old)
                first.run(args.seconds, n)
                second.run(args.seconds, n)
                ratios[env_id, n].append(new.rates[-1] / old.rates[-1])
                cpu_ratios[env_id, n].append(new.cpu_rates[-1] / old.cpu_rates[-1])
        parts = {k: _parts(old, new, args.rounds, 200) for k, (old, new) in ways.items()}
    finally:
        for old, new in ways.values():
            old.loop.envs.close()
            new.loop.envs.close()
    load_after = os.getloadavg()

    med = statistics.median
    print(
        f"MLP 64x64 (tanh, obs normalisation), T={args.fragment_length}, {args.rounds} rounds "
        f"of {args.seconds:g} s per way, torch threads {torch.get_num_threads()}, "
        f"OPENBLAS_NUM_THREADS {os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
        f"{os.cpu_count()} CPUs, load average before {load_before[0]:.2f} / "
        f"{load_before[1]:.2f} / {load_before[2]:.2f}, after {load_after[0]:.2f} / "
        f"{load_after[1]:.2f} / {load_after[2]:.2f}"
    )
    print()
    print(
        "| config | old steps/s (median) | new steps/s (median) | ratio new/old "
        "(median of rounds) | ratio, CPU time | inference share old / new | rounds new/old |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for (env_id, n), (old, new) in ways.items():
        rounds = ", ".join(f"{x:.3f}" for x in ratios[env_id, n])
        print(
            f"| {env_id}, N={n} | {med(old.rates):,.0f} | {med(new.rates):,.0f} | "
            f"{med(ratios[env_id, n]):.3f} | {med(cpu_ratios[env_id, n]):.3f} | "
            f"{med(old.share):.1%} / {med(new.share):.1%} | {rounds} |"
        )
    print()
    print("Per loop step, µs (medians of rounds): whole step, act + value (inference), env step")
    print()
    print("| config | way | step | inference | env | rest |")
    print("|---|---|---:|---:|---:|---:|")
    for (env_id, n), pair in ways.items():
        for label, way in zip(("old", "new"), pair, strict=True):
            step, act, env = med(way.step_us), med(way.act_us), med(way.env_us)
            print(
                f"| {env_id}, N={n} | {label} | {step:.0f} | {act:.0f} | {env:.0f} | "
                f"{step - act - env:.0f} |"
            )
    print()
    print("One act's parts alone, µs (medians of interleaved rounds of 200 calls), old / new")
    print()
    print("| config | noise draw | forward + sampling, given the noise |")
    print("|---|---:|---:|")
    for (env_id, n), p in parts.items():
        (d_old, d_new), (f_old, f_new) = p["noise draw"], p["forward + sampling, given the noise"]
        print(f"| {env_id}, N={n} | {d_old:.1f} / {d_new:.1f} | {f_old:.1f} / {f_new:.1f} |")


if __name__ == "__main__":
    main()
