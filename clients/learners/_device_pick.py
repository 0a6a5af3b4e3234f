"""Where a run computes: the learner's device (``--device auto``: the learner's own update
step timed on each candidate device, the CPU and CUDA where there is one, the faster one
kept), and whether the rollout runs there too (``--device-loop``:
:func:`use_device_loop`, :func:`device_loop_support`).

The GPU pays for an update only from some batch and model size on: below it, kernel
launches and transfers cost more than the arithmetic they save, and a small model's
PPO update runs slower on a GPU than on the CPU (docs/benchmarks.md). Where that size
lies depends on the machine, so ``auto`` measures it instead of guessing: before training,
:func:`pick_device` times the step on COPIES of the model and optimizer (the run's model,
sizes and ``cuda_graph`` setting; synthetic data from a private seeded generator; a
warm-up, then a few timed repeats, their median), bounded to about a second a device.
The run's model, optimizer and generators are not touched, so an ``auto`` run has the
bits of the explicit ``--device`` it picked. Without CUDA, ``auto`` is the CPU, with no
probe. The pick and its figures are one stderr line and the run summary's ``device``.
"""

from __future__ import annotations

import gc
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from simkit._batch import BatchEnv
from simkit.clients.learners._args import resolve_device
from simkit.registry import EnvKind, spec

__all__ = [
    "device_loop_support",
    "use_device_loop",
    "DevicePick",
    "candidates",
    "pick_device",
    "median_seconds",
    "PROBE_SEED",
]

PROBE_SEED = 0x5EED
"""The seed of the probe's private generators (its synthetic data and its learners')."""

BUDGET_S = 0.5
"""Timed repeats on one device stop once they took this long (at least one is timed); a
warm-up call longer than this is the figure itself (no repeat)."""

LARGE_MINIBATCH = 4096
"""PPO's probe times one minibatch step per call above this size (else up to four), so
that a large model's CPU step stays bounded."""

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

    def timed() -> float:
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    warm = timed()
    if warm > BUDGET_S:
        return warm / per_call
    times: list[float] = []
    spent = 0.0
    while len(times) < 5 and (not times or spent < BUDGET_S):
        times.append(timed())
        spent += times[-1]
    return statistics.median(times) / per_call


def device_loop_support(
    env_id: str, env_kwargs: Mapping[str, Any] | None = None, device: Any = None
) -> str | None:
    """Why ``env_id`` cannot run the device loop, or ``None`` where it can: a batch env
    whose class has the masked reset hook (:meth:`simkit.BatchEnv.reset_masked`) or
    declares :attr:`~simkit.BatchEnv.time_limit_only` (resets scheduled on the host),
    so its whole-batch steps stay on the device. A MuJoCo batch (built with
    ``env_kwargs`` on ``device``; None: the class alone is judged) computes on the device
    only on MuJoCo Warp, which needs the ``gpu`` extra."""
    if env_id.startswith("gym:"):
        return f"{env_id} is a Gymnasium env (the device loop needs a simkit batch env)"
    env_spec = spec(env_id)
    if env_spec.kind is not EnvKind.BATCH:
        return f"{env_id} is a {env_spec.kind.value} env (the device loop needs a batch env)"
    factory = env_spec.load()
    hook = getattr(factory, "reset_masked", None)
    if not isinstance(factory, type) or (
        (hook is BatchEnv.reset_masked or hook is None)
        and not getattr(factory, "time_limit_only", False)
    ):
        return (
            f"{env_id} has no device-resident steps (its class does not implement "
            "BatchEnv.reset_masked)"
        )
    mujoco = sys.modules.get("simkit._batch_mujoco")  # imported only if the env's module did
    if device is not None and mujoco is not None and issubclass(factory, mujoco.BatchMujocoEnv):
        from simkit._batch_mujoco import resolve_backend

        backend = resolve_backend((env_kwargs or {}).get("backend", "auto"), device)
        if backend != "mjwarp":
            return (
                f"{env_id} computes on the host on backend {backend!r} (the device loop "
                "needs --env-kwarg backend=mjwarp, or a CUDA --device)"
            )
        if importlib.util.find_spec("mujoco_warp") is None:
            return f"{env_id} on the device needs MuJoCo Warp (pip install 'simkit[gpu]')"
    return None


def use_device_loop(
    *,
    env_id: str,
    choice: str,
    device: torch.device,
    mode: str,
    servers: int,
    connect: bool,
    ray: bool,
    record: bool,
    env_kwargs: Mapping[str, Any] | None = None,
) -> bool:
    """Whether a PPO run rolls out in the device loop (``--device-loop``, ``choice``):
    ``on`` where the run can (else a ``ValueError`` saying why), ``off`` never, ``auto``
    where it can and ``device`` is not the CPU (a CPU run keeps the host rollout, and its
    bits, unless it asks).

    Raises:
        ValueError: ``choice`` is ``on`` and the run cannot (one line, naming why).
    """
    if choice == "off":
        return False
    why: str | None
    if servers or connect or ray:
        why = "it rolls out in the learner's process (--servers 0, no --connect or --ray)"
    elif mode != "sync":
        why = f"it runs in sync mode only, got --mode {mode}"
    elif record:
        why = "--record records host fragments (the device loop's never leave the device)"
    else:
        why = device_loop_support(env_id, env_kwargs, device)
    if choice == "on":
        if why is not None:
            raise ValueError(f"--device-loop on: {why}")
        return True
    return why is None and device.type != "cpu"
