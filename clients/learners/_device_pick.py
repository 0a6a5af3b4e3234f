"""``--device auto``: the learner's own update step timed on each candidate device (the
CPU, and CUDA where there is one), the faster one kept.

The GPU pays for an update only from some batch and model size on: below it, kernel
launches and transfers cost more than the arithmetic they save (issue 26 measured the
PPO update on an H200 at half the CPU's speed at small sizes). Where that size lies
depends on the machine, so ``auto`` measures it instead of guessing: before training,
:func:`pick_device` times the step on COPIES of the model and optimizer (the run's model,
sizes and ``cuda_graph`` setting; synthetic data from a private seeded generator; a
warm-up, then a few timed repeats, their median), bounded to about a second a device.
The run's model, optimizer and generators are not touched, so an ``auto`` run has the
bits of the explicit ``--device`` it picked. Without CUDA, ``auto`` is the CPU, with no
probe. The pick and its figures are one stderr line and the run summary's ``device``.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from simkit.clients.learners._args import PPOArgs, SACArgs, resolve_device
from simkit.clients.learners._replay import ReplayBuffer
from simkit.clients.learners.ppo import PPO
from simkit.clients.learners.sac import SAC
from simkit.models import ActorCritic

__all__ = [
    "DevicePick",
    "PicksDevice",
    "candidates",
    "pick_device",
    "ppo_probe",
    "sac_probe",
    "PROBE_SEED",
]

PROBE_SEED = 0x5EED
"""The seed of the probe's private generators (its synthetic data and its learners')."""

BUDGET_S = 0.5
"""Timed repeats on one device stop once they took this long (at least one is timed); a
warm-up call longer than this is the figure itself (no repeat)."""

LARGE_MINIBATCH = 4096
"""PPO's probe times one minibatch step per call above this size (else up to four), so
that a large model's CPU step (near a second at 32,768 samples of 256x256) stays bounded."""

Probe = Callable[[torch.device], float]
"""Seconds per update step on a device (:func:`ppo_probe`, :func:`sac_probe`)."""


@dataclass(frozen=True)
class DevicePick:
    """The device a run's learner updates on, and why.

    Attributes:
        device: the device picked.
        asked: the ``--device`` value (``auto``, or the device itself).
        seconds: each probed candidate's median seconds per update step (empty: no probe).
        samples: the rows one timed step takes (PPO: a minibatch; SAC: a batch).
        failed: why a candidate could not be timed (it is not picked).
    """

    device: torch.device
    asked: str
    seconds: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    failed: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """``cuda (update 1.9 ms vs cpu 4.2 ms at 2,048 samples)``: the device and, for
        ``auto``, the figures it was picked by."""
        name = str(self.device)
        if self.asked != "auto":
            return name
        if not self.seconds and not self.failed:
            return f"{name} (no CUDA device: nothing to probe)"
        others = [f"{d} {1e3 * s:.1f} ms" for d, s in self.seconds.items() if d != name]
        others += [f"{d} failed: {why}" for d, why in self.failed.items()]
        versus = f" vs {', '.join(others)}" if others else ""
        mine = 1e3 * self.seconds[name]
        return f"{name} (update {mine:.1f} ms{versus} at {self.samples:,} samples)"


class PicksDevice:
    """A run part whose ``build`` picks its learner's device (:func:`pick_device`) and
    keeps the pick in ``_pick`` (a dataclass field of the part)."""

    _pick: DevicePick | None

    def picked_device(self) -> DevicePick:
        """The learner's device and why (once ``build`` has run)."""
        if self._pick is None:
            raise RuntimeError("picked_device() is known once build() has run")
        return self._pick


def candidates() -> list[torch.device]:
    """The devices ``auto`` chooses between: the CPU first (kept on a tie), then CUDA
    where there is one."""
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found.append(torch.device("cuda"))
    return found


def pick_device(asked: str, prober: Callable[[], tuple[Probe, int]]) -> DevicePick:
    """The device of ``--device asked``: itself, or for ``auto`` the candidate
    (:func:`candidates`) whose update step the probe timed fastest; a single candidate
    (no CUDA) is taken without a probe. ``prober()`` makes the probe and says how many
    samples one timed step takes (:func:`ppo_probe`, :func:`sac_probe`); it is called
    only to probe. The probe runs under a forked torch RNG (every device's), so the
    global generators come out as they went in; a candidate whose probe fails (CUDA
    out of memory) is not picked, and its error is reported.

    Raises:
        ValueError: ``asked`` is not a device (:func:`resolve_device`).
    """
    if asked != "auto":
        return DevicePick(resolve_device(asked), asked)
    found = candidates()
    if len(found) == 1:
        return DevicePick(found[0], asked)
    probe, samples = prober()
    seconds: dict[str, float] = {}
    failed: dict[str, str] = {}
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        for device in found:
            try:
                seconds[str(device)] = probe(device)
            except (RuntimeError, MemoryError) as exc:  # e.g. CUDA out of memory
                failed[str(device)] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    gc.collect()  # the probes' learners (a CUDA graph's memory pool among them) go now
    if cuda:
        torch.cuda.empty_cache()
    if not seconds:
        raise RuntimeError(f"--device auto: no device could run the update ({failed})")
    best = min(seconds, key=lambda d: seconds[d])  # dicts keep order: the CPU wins a tie
    return DevicePick(torch.device(best), asked, seconds, samples, failed)


def median_seconds(call: Callable[[], object], device: torch.device, per_call: int) -> float:
    """Median seconds of ``call`` (``per_call`` update steps) on ``device``, per step:
    one warm-up call (allocations, cuBLAS, a CUDA graph's capture), then up to five
    timed ones, fewer once they took :data:`BUDGET_S`; a warm-up longer than that is
    taken as the figure (so a device costs at most about two budgets and a call)."""

    def done() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    start = time.perf_counter()
    call()
    done()
    warm = time.perf_counter() - start
    if warm > BUDGET_S:
        return warm / per_call
    times: list[float] = []
    spent = 0.0
    while len(times) < 5 and (not times or spent < BUDGET_S):
        start = time.perf_counter()
        call()
        done()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return statistics.median(times) / per_call


def ppo_probe(args: PPOArgs, model: ActorCritic, rows_per_update: int) -> tuple[Probe, int]:
    """The PPO update's probe and its minibatch size: a learner on a copy of ``model``
    (``args``' loss, optimizer and ``cuda_graph``; eager, not ``compile`` d: a compile
    takes far longer than the probe may) runs one epoch of up to four minibatches of
    the run's minibatch size (one above :data:`LARGE_MINIBATCH`), on synthetic rollout
    data drawn from ``model``'s copy."""
    minibatch = max(2, args.num_steps * rows_per_update // args.num_minibatches)
    steps = 1 if minibatch > LARGE_MINIBATCH else min(args.num_minibatches, 4)
    n = minibatch * steps

    def probe(device: torch.device) -> float:
        gen = torch.Generator().manual_seed(PROBE_SEED)
        twin = copy.deepcopy(model).cpu()
        obs = torch.randn((n, *twin.obs_shape), generator=gen)
        out = twin.act(obs, generator=gen)
        adv, ret = torch.randn((2, n), generator=gen)
        setting = dataclasses.replace(
            args,
            device=str(device),
            num_steps=n,
            num_minibatches=steps,
            update_epochs=1,
            compile=False,
            total_steps=0,
            seed=PROBE_SEED,
        )
        learner = PPO(setting, twin, 1, device=device)
        batch = [t.to(device) for t in (obs, out.actions, out.log_probs, adv, ret, out.values)]

        def call() -> None:
            learner._optimize(
                *batch,
                n_rows=n,
                lag=np.zeros(1, dtype=np.int64),
                episodes=(np.zeros(0), np.zeros(0)),
                t_start=0.0,
            )

        return median_seconds(call, device, steps)

    return probe, minibatch


def sac_probe(args: SACArgs, model: ActorCritic) -> tuple[Probe, int]:
    """SAC's gradient step's probe and its batch size: a learner on a copy of the actor
    (``args``' critics, optimizer and ``cuda_graph``) takes ``2 x policy_frequency``
    steps (so the actor's updates are in the mean) on a replay buffer of one batch of
    synthetic transitions."""
    per_call = 2 * args.policy_frequency

    def probe(device: torch.device) -> float:
        setting = dataclasses.replace(args, device=str(device), seed=PROBE_SEED)
        learner = SAC(setting, copy.deepcopy(model).cpu(), device)
        rng = np.random.default_rng(PROBE_SEED)
        n, obs_shape, dim = args.batch_size, tuple(model.obs_shape), learner.head.dim
        buffer = ReplayBuffer(n, obs_shape=obs_shape, action_shape=(dim,))
        buffer.add(
            rng.standard_normal((n, *obs_shape), dtype=np.float32),
            rng.uniform(-1.0, 1.0, (n, dim)).astype(np.float32),
            rng.standard_normal(n, dtype=np.float32),
            rng.standard_normal((n, *obs_shape), dtype=np.float32),
            rng.random(n) < 0.01,
            np.zeros(n, dtype=bool),
            np.zeros(n, dtype=np.int64),
        )
        return median_seconds(lambda: learner.run(buffer, per_call), device, per_call)

    return probe, args.batch_size
