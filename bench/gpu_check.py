"""GPU paths of simkit, each timed on the GPU and on the CPU in the same run.

Run it on a machine with a CUDA device; on a CPU-only machine it reports the CPU
figures alone and says that no CUDA device was found. Markdown on stdout::

    .venv/bin/python bench/gpu_check.py              # full run (a few minutes)
    .venv/bin/python bench/gpu_check.py --quick      # smoke run: small batches, few repeats
    .venv/bin/python bench/gpu_check.py --threads 0  # CPU rows on every core (torch's default)

What it measures (Cheetah-sized spaces: 17 float32 observations, 6 float32 actions):

1. Inference, rows/s at B = 1k, 4k, 16k, 64k rows:
   - ``model.act``: the built-in ``"mlp"`` policy (64x64) acting on an observation
     tensor already on the device, with a seeded ``torch.Generator`` of that device,
     under ``torch.inference_mode()``;
   - ``RowPolicy.act``: the rollout's act path (``simkit.rollout._policy``) on
     numpy observations, keyed noise drawn per step, actions back as numpy: host <->
     device copies included. On the CPU it runs the numpy ``LeanMLP``; on CUDA
     its default path, ``model.act`` with the noise as a CUDA graph over pinned buffers
     (the keyed normal noise computed on the device, ``simkit._noise.TorchSlotNoise``);
   - the same with a categorical head of 6 actions, whose uniform noise is computed on
     the device off the CPU too.
1b. ``RowPolicy.act``'s paths (``--only rowpolicy``), rows/s at B = 4k and 64k, with a
   Gaussian and a categorical head: on CUDA the default path (pinned host buffers,
   non-blocking copies, one event wait, the forward as a CUDA graph per batch shape:
   ``simkit.rollout._static_act``), the same buffers with an eager forward, the eager
   path (``graphs=False``: ``model.act`` per call) and ``model.act`` on device-resident
   rows (the column gives each path's share of it, and its rate over the CPU's
   ``LeanMLP``); then bit comparisons on the same device: graphed vs eager act (three
   steps, a weight swap in place before the last) and the device noise vs numpy's.
2. PPO update, samples/s and seconds per update: ``PPO.update`` on one synthetic
   fragment of 2048 (T=2048, R=1) and 16384 (T=2048, R=8) rows x steps, 32 minibatches,
   10 epochs. The GPU row needs ``PPOArgs.device`` (detected; without it only the CPU
   is timed). On CUDA two rows: the learner's default (the minibatch step as a CUDA
   graph, ``cuda_graph=True``: clients/learners/_graphed.py) and the same step eagerly
   (``--no-cuda-graph``); on the CPU a row with ``--threads`` and (full runs) one on
   every core; "vs best CPU" is a CUDA row's rate over the better CPU row's.
3. SAC gradient step, samples/s and ms per step (critic, actor, entropy coefficient,
   target update; 256x256 networks) on batches of 256 sampled from a replay buffer of
   20,000 random transitions, as bench/bench_sac_step.py times it on the CPU: the
   learner's static step (``SAC.gradient_step`` over static buffers, its figures read
   back every ``SACStep.CHUNK`` steps, as ``SAC.run`` runs it) on the CPU, and on CUDA
   as a CUDA graph (the default) and eagerly.
   After sections 2 and 3, "Bits": on CUDA two PPO updates and 20 SAC steps with the
   graphs vs eagerly, same device; on the CPU the same runs twice from the same seed.
4. ``simkit/BatchCartPole-v0``, instance-steps/s at N = 4k and 64k: the BatchEnv with
   ``device=`` (device-resident steps: observations, rewards and flags stay on the
   device, keyed resets under a mask, ``validate_actions=False`` as a learner on a GPU
   steps it; docs/batch_device.md), plus its physics kernel alone (``_advance``: no autoreset)
   and the default numpy BatchEnv.
5. PPO's whole loop on ``simkit/BatchCartPole-v0``, env steps/s at N = 1k, 4k and 64k
   envs (the CPU rows at 1k only) x 16 steps per update (8 minibatches x 4 epochs): the
   device loop (``--device-loop on``: ``LocalSource(device_loop=True)`` + ``PPO.update`` of its tensors, the env, noise,
   policy, fragments and update on the device) on each device, and the in-process host
   rollout (``LocalSource`` + ``PPO.update``) on the CPU for reference; one call is one
   fragment, its update and the weight push.

Every timed call on CUDA is bracketed by ``torch.cuda.synchronize()``. Each case is
warmed up, then timed in ``--repeats`` rounds (the cases of a section interleaved, so
machine load hits them alike); the tables give medians. "GPU/CPU" is the CUDA rate over
the CPU rate of the same path and batch (above 1: the GPU is faster). The CPU rows run
with ``--threads`` torch threads, 1 by default: what ``simkit train`` (``--torch-threads``)
and ``simkit serve`` use unless told otherwise; ``--threads 0`` keeps torch's default
(every physical core), the CPU's best case for large batches.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

import simkit
from simkit._types import Fragment
from simkit.clients.learners._args import SACArgs
from simkit.clients.learners._replay import ReplayBuffer
from simkit.clients.learners._train_sac import sac_spec
from simkit.clients.learners.ppo import PPO, PPOArgs
from simkit.clients.learners.sac import SAC
from simkit.models import ActorCritic, ModelSpec, build_model
from simkit.rollout._policy import RowPolicy

OBS_DIM, ACT_DIM = 17, 6
CATEGORICAL_PATH = "RowPolicy.act, categorical (6 actions)"
SEED = 0
K = 1024


@dataclass
class Case:
    """One timed thing: ``fn`` does ``batch`` rows (or instance-steps, or samples) of work."""

    path: str
    device: torch.device
    batch: int
    fn: Callable[[], None]
    calls: int = 1
    rates: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    error: str | None = None
    """Why the case could not be set up or run (the run goes on without it)."""

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")

    @property
    def seconds_per_call(self) -> float:
        return statistics.median(self.seconds)


def _nothing() -> None:
    pass


def guarded(
    path: str,
    device: torch.device,
    batch: int,
    build: Callable[..., Callable[[], None]],
    *args: Any,
) -> Case:
    """The case ``build(*args)`` makes; a failing set-up becomes a case with its ``error``."""
    try:
        return Case(path, device, batch, build(*args))
    except Exception as exc:  # a GPU check reports a broken path and goes on
        return Case(path, device, batch, _nothing, error=f"{type(exc).__name__}: {exc}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(case: Case, calls: int) -> float:
    _sync(case.device)
    start = time.perf_counter()
    for _ in range(calls):
        case.fn()
    _sync(case.device)
    return time.perf_counter() - start


def run_cases(cases: list[Case], repeats: int, min_time: float, warmup: int) -> None:
    """Warms up each case, sizes its round to about ``min_time`` s, then times
    ``repeats`` interleaved rounds."""
    for case in cases:
        if case.error is not None:
            continue
        try:
            _time(case, warmup)
            calls, elapsed = 1, _time(case, 1)
            while elapsed < min_time and calls < 1 << 20:
                calls = max(calls * 2, int(calls * min_time / max(elapsed, 1e-9)))
                elapsed = _time(case, calls)
            case.calls = calls
        except Exception as exc:
            case.error = f"{type(exc).__name__}: {exc}"
    for _ in range(repeats):
        for case in cases:
            if case.error is not None:
                continue
            try:
                elapsed = _time(case, case.calls)
            except Exception as exc:
                case.error = f"{type(exc).__name__}: {exc}"
                continue
            case.seconds.append(elapsed / case.calls)
            case.rates.append(case.batch * case.calls / elapsed)


# ------------------------------------------------------------------------ reporting


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    n = torch.get_num_threads()
    return f"cpu ({cpu_name()}, {n} torch thread{'' if n == 1 else 's'})"


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.3g}"


Column = tuple[str, Callable[[Case], str]]


def table(
    title: str,
    cases: list[Case],
    unit: str,
    extra: Column | list[Column] | None = None,
) -> None:
    """A markdown table: path | device | batch | rate | extra columns | GPU/CPU (same
    path and batch)."""
    cpu_rate = {
        (c.path, c.batch): c.rate for c in cases if c.device.type == "cpu" and c.error is None
    }
    extras = [] if extra is None else [extra] if isinstance(extra, tuple) else extra
    head = ["path", "device", "batch", unit]
    head += [name for name, _ in extras]
    head.append("GPU/CPU")
    print(f"\n### {title}\n")
    print("| " + " | ".join(head) + " |")
    print("|---|---|" + "---:|" * (len(head) - 2))
    failed: list[Case] = []
    for c in cases:
        if c.error is not None:
            failed.append(c)
            cells = [c.path, str(c.device), f"{c.batch:,}", f"FAILED ({len(failed)})"]
            cells += ["—"] * (len(head) - len(cells))
            print("| " + " | ".join(cells) + " |")
            continue
        ratio = "—"
        base = cpu_rate.get((c.path, c.batch))
        if c.device.type == "cuda" and base:
            ratio = f"{c.rate / base:.2f}x"
        cells = [c.path, str(c.device), f"{c.batch:,}", _fmt(c.rate)]
        cells += [cell(c) for _, cell in extras]
        cells.append(ratio)
        print("| " + " | ".join(cells) + " |")
    for k, c in enumerate(failed, 1):
        print(f"\n({k}) {c.path} on {c.device}, batch {c.batch:,}: {c.error}")
    sys.stdout.flush()


# ------------------------------------------------------------------------ 1. inference


def make_model(
    act_space: spaces.Box | spaces.Discrete | None = None,
) -> tuple[ActorCritic, spaces.Box, spaces.Box | spaces.Discrete]:
    """The 64x64 ``"mlp"`` on Cheetah-sized observations (Cheetah's actions by default)."""
    obs_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    if act_space is None:
        act_space = spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
    model = build_model(ModelSpec("mlp", {"hidden_sizes": [64, 64]}), obs_space, act_space)
    rms = model.obs_rms
    if rms is not None:  # statistics as after some training
        with torch.no_grad():
            rms.mean.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(SEED))
            rms.var.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(SEED + 1))
    model.eval()
    return model, obs_space, act_space


def _model_act(model: ActorCritic, dev: torch.device, obs_np: np.ndarray) -> Callable[[], None]:
    """``model.act`` on observations already on ``dev``, with a seeded generator of ``dev``."""
    model = model.to(dev)
    obs = torch.from_numpy(obs_np).to(dev)
    gen = torch.Generator(device=dev).manual_seed(SEED)

    def act() -> None:
        with torch.inference_mode():
            model.act(obs, generator=gen)

    return act


def _row_act(
    base: ActorCritic,
    dev: torch.device,
    obs: np.ndarray,
    act_space: spaces.Box | spaces.Discrete,
) -> Callable[[], None]:
    """``RowPolicy.act`` on numpy observations, a new step (one noise draw) each call."""
    policy = RowPolicy(
        copy.deepcopy(base),
        dev,
        seed=SEED,
        first_slot=0,
        num_slots=len(obs),
        rows_per_slot=1,
        action_space=act_space,
        lean=True,
    )
    steps = itertools.count()

    def act() -> None:
        policy.act(obs, next(steps))

    return act


def inference_cases(
    devices: list[torch.device], batches: list[int]
) -> tuple[list[Case], list[Case]]:
    base, _, act_space = make_model()
    discrete_space = spaces.Discrete(ACT_DIM)
    discrete, _, _ = make_model(discrete_space)
    rng = np.random.default_rng(SEED)
    obs = {b: rng.normal(size=(b, OBS_DIM)).astype(np.float32) for b in batches}
    act_cases: list[Case] = []
    row_cases: list[Case] = []
    for dev in devices:
        model = copy.deepcopy(base)
        for b in batches:
            act_cases.append(guarded("model.act", dev, b, _model_act, model, dev, obs[b]))
            # On the CPU this is LeanMLP, on CUDA model.act: one label pairs them.
            row_cases.append(
                guarded("RowPolicy.act", dev, b, _row_act, base, dev, obs[b], act_space)
            )
    for dev in devices:
        for b in batches:
            # Uniform noise: computed on the device off the CPU (TorchSlotNoise).
            row_cases.append(
                guarded(CATEGORICAL_PATH, dev, b, _row_act, discrete, dev, obs[b], discrete_space)
            )
    return act_cases, row_cases


# ------------------------------------------------------------------------ 1b. RowPolicy paths

ROW_CPU = "RowPolicy.act (CPU: LeanMLP)"
ROW_GRAPH = "RowPolicy.act, pinned + CUDA graph (default)"
ROW_STATIC = "RowPolicy.act, pinned + eager forward"
ROW_EAGER = "RowPolicy.act, eager (graphs=False)"
ROW_MODEL = "model.act, device-resident"
ROW_HEADS: dict[str, spaces.Box | spaces.Discrete] = {
    "Gaussian": spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32),
    "categorical": spaces.Discrete(ACT_DIM),
}


def _row_policy(
    base: ActorCritic,
    dev: torch.device,
    n: int,
    act_space: spaces.Space[Any],
    path: str,
) -> RowPolicy:
    """A ``RowPolicy`` of ``n`` one-row slots on ``dev`` acting through ``path``."""
    from simkit.rollout._static_act import eager_capture

    return RowPolicy(
        copy.deepcopy(base),
        dev,
        seed=SEED,
        first_slot=0,
        num_slots=n,
        rows_per_slot=1,
        action_space=act_space,
        lean=path == ROW_CPU,
        graphs=path == ROW_GRAPH,
        capture=eager_capture if path == ROW_STATIC else None,
    )


def _row_path(
    base: ActorCritic, dev: torch.device, obs: np.ndarray, act_space: spaces.Space[Any], path: str
) -> Callable[[], None]:
    """``RowPolicy.act`` through ``path``, a new step (one noise draw) each call."""
    if path == ROW_MODEL:
        return _model_act(copy.deepcopy(base), dev, obs)
    policy = _row_policy(base, dev, len(obs), act_space, path)
    steps = itertools.count()

    def act() -> None:
        policy.act(obs, next(steps))

    return act


def row_policy_cases(devices: list[torch.device], batches: list[int]) -> dict[str, list[Case]]:
    """Per head: the CPU's LeanMLP path and model.act, and on each CUDA device the
    graphed, pinned-eager and eager paths and device-resident ``model.act``."""
    rng = np.random.default_rng(SEED)
    obs = {b: rng.normal(size=(b, OBS_DIM)).astype(np.float32) for b in batches}
    out: dict[str, list[Case]] = {}
    for head, space in ROW_HEADS.items():
        base, _, _ = make_model(space)
        cases: list[Case] = []
        for b in batches:
            for dev in devices:
                paths = (
                    [ROW_CPU, ROW_MODEL]
                    if dev.type == "cpu"
                    else [ROW_GRAPH, ROW_STATIC, ROW_EAGER, ROW_MODEL]
                )
                for path in paths:
                    cases.append(guarded(path, dev, b, _row_path, base, dev, obs[b], space, path))
        out[head] = cases
    return out


def row_policy_bits(devices: list[torch.device], batches: list[int], steps: int = 3) -> list[str]:
    """Bit comparisons, one line each: on CUDA the graphed act against the eager act
    (actions, log-probs, values over ``steps`` steps and a weight swap) and the device
    noise against the host's; on the CPU the static path (``eager_capture``) against
    ``model.act``, the structure the CUDA path uses."""
    from simkit._noise import SlotNoise, TorchSlotNoise
    from simkit.models import get_weights

    lines: list[str] = []
    rng = np.random.default_rng(SEED + 1)
    for dev in devices:
        fast, slow = (ROW_GRAPH, ROW_EAGER) if dev.type == "cuda" else (ROW_STATIC, ROW_EAGER)
        for head, space in ROW_HEADS.items():
            base, _, _ = make_model(space)
            for b in batches:
                try:
                    obs = rng.normal(size=(b, OBS_DIM)).astype(np.float32)
                    a = _row_policy(base, dev, b, space, fast)
                    e = _row_policy(base, dev, b, space, slow)
                    same = True
                    for step in range(steps):
                        if step == steps - 1:  # new weights, copied in place
                            with torch.no_grad():
                                moved = copy.deepcopy(base)
                                for p in moved.parameters():
                                    p.mul_(1.01)
                            weights = get_weights(moved, 1)
                            a.set_weights(weights)
                            e.set_weights(weights)
                        x, y = a.act(obs, step), e.act(obs, step)
                        same &= all(
                            np.asarray(getattr(x, k)).tobytes()
                            == np.asarray(getattr(y, k)).tobytes()
                            for k in ("actions", "log_probs", "values")
                        )
                    verdict = "identical" if same else "DIFFERENT"
                except Exception as exc:  # a GPU check reports a broken path and goes on
                    verdict = f"FAILED ({type(exc).__name__}: {exc})"
                name = fast if dev.type == "cuda" else "static buffers (CPU: unpinned, no graph)"
                lines.append(f"- {dev}, {head}, {b:,} rows: {name} vs {slow}: {verdict}")
        if dev.type == "cuda":
            try:
                host = SlotNoise(
                    SEED,
                    first_slot=3,
                    num_slots=max(batches),
                    rows_per_slot=1,
                    width=3,
                    kind="uniform",
                )
                on_dev = TorchSlotNoise(host, dev)
                same = all(
                    np.array_equal(on_dev.draw(t).cpu().numpy(), host.draw(t))
                    for t in (0, 7, 2**40)
                )
                verdict = "identical" if same else "DIFFERENT"
            except Exception as exc:
                verdict = f"FAILED ({type(exc).__name__}: {exc})"
            lines.append(f"- {dev}: uniform noise computed there vs numpy's: {verdict}")
    if not any(d.type == "cuda" for d in devices):
        lines.append("- CUDA bit comparisons: not measured (no CUDA device)")
    return lines


# ------------------------------------------------------------------------ 2. PPO update


def synthetic_fragment(rng: np.random.Generator, T: int, R: int) -> Fragment:
    """A fragment shaped as a Cheetah rollout's (as tests/test_ppo.py's ``_fragment``)."""
    term = rng.random((T, R)) < 0.02
    return Fragment(
        obs=rng.normal(size=(T, R, OBS_DIM)).astype(np.float32),
        actions=rng.normal(size=(T, R, ACT_DIM)).astype(np.float32),
        log_probs=rng.normal(-6.0, 1.0, size=(T, R)).astype(np.float32),
        values=rng.normal(size=(T, R)).astype(np.float32),
        rewards=rng.normal(size=(T, R)) * 5,
        terminated=term,
        truncated=(rng.random((T, R)) < 0.02) & ~term,
        final_values=rng.normal(size=(T, R)).astype(np.float32),
        agent_mask=np.ones((T, R), bool),
        policy_version=np.zeros(T, np.int64),
        last_obs=rng.normal(size=(R, OBS_DIM)).astype(np.float32),
        last_values=rng.normal(size=R).astype(np.float32),
        env_ids=np.arange(R),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
        episode_rows=np.zeros(0, np.int64),
        source="gpu_check",
        sequence=0,
    )


def ppo_has_device() -> bool:
    """Whether the learner takes a device (``PPOArgs.device``)."""
    return "device" in getattr(PPOArgs, "__dataclass_fields__", {})


PPO_PATH = "PPO.update"
SAC_PATH = "SAC.gradient_step"
EAGER = "CUDA eager (--no-cuda-graph)"
DEFAULT_THREADS = torch.get_num_threads()
"""torch's own thread count (every physical core), taken before ``--threads`` applies."""


def _with_threads(n: int, fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` on ``n`` torch threads (the CPU's all-core row beside the ``--threads`` one)."""

    def run() -> None:
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            fn()
        finally:
            torch.set_num_threads(before)

    return run


def _ppo_learner(dev: torch.device, fragment: Fragment, variant: str = "") -> PPO:
    """A fresh PPO learner on ``dev`` for ``fragment``; ``variant`` on CUDA: ``""`` (the
    default: the CUDA graph) or :data:`EAGER` (``cuda_graph=False``: the same step
    eagerly)."""
    kwargs: dict[str, Any] = {
        "env_id": "simkit/Cheetah-v0",
        "num_envs": fragment.num_rows,
        "num_steps": fragment.num_steps,
        "num_minibatches": 32,
        "update_epochs": 10,
        "total_steps": 0,  # no learning-rate annealing
    }
    if ppo_has_device():
        kwargs["device"] = str(dev)
    if variant == EAGER:
        kwargs["cuda_graph"] = False
    model, _, _ = make_model()
    return PPO(PPOArgs(**kwargs), model.train(), fragment.num_rows)


def _update(dev: torch.device, fragment: Fragment, variant: str = "") -> Callable[[], None]:
    """``PPO.update`` of a fresh learner on ``dev`` (:func:`_ppo_learner`)."""
    learner = _ppo_learner(dev, fragment, variant)

    def update() -> None:
        learner.update([fragment])

    return update


def ppo_cases(
    devices: list[torch.device], shapes: list[tuple[int, int]], all_threads: bool
) -> list[Case]:
    """``PPO.update`` per device and shape: on the CPU with ``--threads`` (and with every
    core where ``all_threads``), on CUDA as the learner runs by default (the CUDA graph)
    and eagerly."""
    rng = np.random.default_rng(SEED)
    fragments = [synthetic_fragment(rng, T, R) for T, R in shapes]
    cases: list[Case] = []
    for f in fragments:
        batch = f.num_steps * f.num_rows
        for dev in devices:
            cases.append(guarded(PPO_PATH, dev, batch, _update, dev, f))
            if dev.type == "cpu" and all_threads:
                path = f"{PPO_PATH}, all {DEFAULT_THREADS} threads"
                case = guarded(path, dev, batch, _update, dev, f)
                case.fn = _with_threads(DEFAULT_THREADS, case.fn)
                cases.append(case)
            if dev.type == "cuda":
                path = f"{PPO_PATH}, {EAGER}"
                cases.append(guarded(path, dev, batch, _update, dev, f, EAGER))
    return cases


def vs_best_cpu(cases: list[Case]) -> Column:
    """The column "vs best CPU": a CUDA row's rate over the best CPU row's (any thread
    count) of the same section and batch."""
    best: dict[int, float] = {}
    for c in cases:
        if c.device.type == "cpu" and c.error is None and c.rates:
            best[c.batch] = max(best.get(c.batch, 0.0), c.rate)

    def cell(c: Case) -> str:
        base = best.get(c.batch)
        return f"{c.rate / base:.2f}x" if base and c.device.type == "cuda" else "—"

    return ("vs best CPU", cell)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str:
    """ "identical" when every tensor has the same bits, else the largest difference."""
    if a.keys() != b.keys():
        return f"differ: names {sorted(set(a) ^ set(b))}"
    worst = 0.0
    for k in a:
        x, y = a[k].detach().cpu(), b[k].detach().cpu()
        if not torch.equal(x, y):
            worst = max(worst, float((x.double() - y.double()).abs().max()))
            worst = worst if worst > 0 else float("nan")  # same values, other dtype/shape
    return "identical" if worst == 0.0 else f"differ: max abs difference {worst:.3g}"


def _learner_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, state in optimizer.state_dict()["state"].items():
        out.update({f"adam.{i}.{k}": v for k, v in state.items() if isinstance(v, torch.Tensor)})
    return out


def ppo_bits(dev: torch.device, T: int, R: int, updates: int) -> tuple[str, str]:
    """``(what was compared, result)``: ``updates`` PPO updates on CUDA with the CUDA
    graph vs the same step eagerly; on the CPU the same updates twice from the same seed
    (tests/test_graphed.py compares the step with a plain eager loop)."""
    rng = np.random.default_rng(SEED + 1)
    fragments = [synthetic_fragment(rng, T, R) for _ in range(updates)]

    def learner(variant: str = "") -> PPO:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)  # the same initial weights
            return _ppo_learner(dev, fragments[0], variant)

    if dev.type == "cuda":
        a, b = learner(), learner(EAGER)
        what = f"{dev}: CUDA graph vs eager"
    else:
        a, b = learner(), learner()
        what = "the CPU, the same seed twice"
    stats_a = [a.update([f]) for f in fragments]
    stats_b = [b.update([f]) for f in fragments]
    result = _max_diff(_learner_state(a.model, a.optimizer), _learner_state(b.model, b.optimizer))
    if result == "identical" and [s.approx_kl for s in stats_a] != [s.approx_kl for s in stats_b]:
        result = "weights identical, statistics differ"
    return f"{PPO_PATH} x{updates}, {T * R:,} samples; {what}", result


# ------------------------------------------------------------------------ 3. SAC step

SAC_BATCH = 256
SAC_FILL = 20_000


def _sac_learner(dev: torch.device, variant: str = "") -> tuple[SAC, ReplayBuffer]:
    """A fresh SAC learner on ``dev`` (``variant`` as :func:`_ppo_learner`'s) and its
    replay buffer of :data:`SAC_FILL` random transitions."""
    args = SACArgs(
        env_id="gym:HalfCheetah-v5", seed=1, batch_size=SAC_BATCH, cuda_graph=variant != EAGER
    )
    obs_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    act_space = spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = build_model(sac_spec(args), obs_space, act_space)
    learner = SAC(args, model, dev)
    rng = np.random.default_rng(SEED)
    buf = ReplayBuffer(SAC_FILL, obs_shape=(OBS_DIM,), action_shape=(ACT_DIM,))
    buf.add(
        obs=rng.standard_normal((SAC_FILL, OBS_DIM), np.float32),
        actions=rng.uniform(-1, 1, (SAC_FILL, ACT_DIM)).astype(np.float32),
        rewards=rng.standard_normal(SAC_FILL).astype(np.float32),
        next_obs=rng.standard_normal((SAC_FILL, OBS_DIM), np.float32),
        terminated=np.zeros(SAC_FILL, bool),
        truncated=np.zeros(SAC_FILL, bool),
        versions=np.zeros(SAC_FILL, np.int64),
    )
    return learner, buf


def _sac_step(dev: torch.device, variant: str = "") -> Callable[[], None]:
    """One gradient step of a fresh learner on ``dev``, HalfCheetah-sized, batch 256:
    the learner's static step (graphed on CUDA, or eager with :data:`EAGER`), its
    figures kept on the device and read back every ``SACStep.CHUNK`` steps, as
    ``SAC.run`` does."""
    learner, buf = _sac_learner(dev, variant)
    out = buf.empty_batch(SAC_BATCH)
    static = learner._static
    static.begin(learner.alpha)

    def step() -> None:
        if static.done == static.CHUNK:
            static.flush()
        learner._step(buf.sample_into(out, learner.sampler))

    return step


def sac_cases(devices: list[torch.device], all_threads: bool) -> list[Case]:
    """The gradient step per device: the CPU with ``--threads`` (and every core where
    ``all_threads``), CUDA as the learner runs by default (the CUDA graph) and eagerly."""
    cases: list[Case] = []
    for dev in devices:
        cases.append(guarded(SAC_PATH, dev, SAC_BATCH, _sac_step, dev))
        if dev.type == "cpu" and all_threads:
            case = guarded(
                f"{SAC_PATH}, all {DEFAULT_THREADS} threads", dev, SAC_BATCH, _sac_step, dev
            )
            case.fn = _with_threads(DEFAULT_THREADS, case.fn)
            cases.append(case)
        if dev.type == "cuda":
            path = f"{SAC_PATH}, {EAGER}"
            cases.append(guarded(path, dev, SAC_BATCH, _sac_step, dev, EAGER))
    return cases


def sac_bits(dev: torch.device, steps: int) -> tuple[str, str]:
    """``(what was compared, result)``: ``steps`` gradient steps (``SAC.run``) on CUDA
    with the CUDA graphs vs the same steps eagerly; on the CPU the same steps twice from
    the same seed (tests/test_graphed.py compares the step with a plain eager one)."""
    if dev.type == "cuda":
        (a, buf), (b, _) = _sac_learner(dev), _sac_learner(dev, EAGER)
        what = f"{dev}: CUDA graph vs eager"
    else:
        (a, buf), (b, _) = _sac_learner(dev), _sac_learner(dev)
        what = "the CPU, the same seed twice"
    half = steps // 2
    stats_a = [a.run(buf, n) for n in (half, steps - half)]
    stats_b = [b.run(buf, n) for n in (half, steps - half)]
    state_a = {**a.tensors(), **_learner_state(torch.nn.Module(), a.optimizer)}
    state_b = {**b.tensors(), **_learner_state(torch.nn.Module(), b.optimizer)}
    result = _max_diff(state_a, state_b)
    if result == "identical" and [s.qf_loss for s in stats_a] != [s.qf_loss for s in stats_b]:
        result = "weights identical, statistics differ"
    return f"{SAC_PATH} x{steps} (SAC.run); {what}", result


def bits_table(rows: list[tuple[str, str]]) -> None:
    """The bit comparisons as a markdown table."""
    print("\n### Bits: the static steps against their reference, same device\n")
    print("| compared | result |")
    print("|---|---|")
    for what, result in rows:
        print(f"| {what} | {result} |")
    sys.stdout.flush()


# ------------------------------------------------------------------------ 4. BatchEnv

ENV_ID = "simkit/BatchCartPole-v0"
STEADY_EPISODES = 20
"""Episodes per instance a ``step_batch`` case steps before it is timed: by then the
instances' episode counts have spread apart as in a long run."""
NUMPY_PATH = "step_batch, numpy (device=None)"
TORCH_PATH = "step_batch, torch"
KERNEL_PATH = "physics kernel only (_advance)"


def _stepper(n: int, dev: torch.device | None) -> Callable[[], None]:
    """``step_batch`` of ``n`` instances (numpy where ``dev`` is None), cycling through
    pre-drawn random actions; stepped to a steady rate of autoresets first."""
    env = simkit.make(ENV_ID, num_envs=n, device=dev)
    if dev is not None:
        env.validate_actions = False  # value checks read a flag back every step
    env.reset(seed=SEED)
    actions: list[Any]
    if dev is None:
        rng = np.random.default_rng(SEED)
        actions = [rng.integers(0, 2, n) for _ in range(8)]
    else:
        gen = torch.Generator(device=dev).manual_seed(SEED)
        actions = [torch.randint(0, 2, (n,), device=dev, generator=gen) for _ in range(8)]
    k = itertools.count()

    def step() -> None:
        env.step_batch(actions[next(k) % len(actions)])

    # Random-action episodes last ~20 steps: until then nothing resets and a step is
    # several times cheaper than in a running rollout; then every instance resets at
    # once, and only after many episodes have their episode counts spread apart.
    for _ in range(100):
        if float(np.mean(env.episode_index)) >= STEADY_EPISODES:
            break
        for _ in range(50):
            step()
    return step


def _kernel(n: int, dev: torch.device) -> Callable[[], None]:
    """BatchCartPole's Euler step of every instance alone (the state is not written back)."""
    env: Any = simkit.make(ENV_ID, num_envs=n, device=dev)
    env.reset(seed=SEED)
    actions = torch.randint(
        0, 2, (n,), device=dev, generator=torch.Generator(device=dev).manual_seed(SEED)
    )

    def step() -> None:
        env._advance(env.state, actions, env._p)

    return step


def batch_env_cases(devices: list[torch.device], sizes: list[int]) -> list[Case]:
    cases: list[Case] = []
    cpu = torch.device("cpu")
    for n in sizes:
        # The default numpy BatchEnv, for reference.
        cases.append(guarded(NUMPY_PATH, cpu, n, _stepper, n, None))
        for dev in devices:
            cases.append(guarded(TORCH_PATH, dev, n, _stepper, n, dev))
            cases.append(guarded(KERNEL_PATH, dev, n, _kernel, n, dev))
    return cases


# ------------------------------------------------------------------------ 5. the whole loop

LOOP_STEPS = 16
LOOP_HOST = "in process, host (LocalSource + PPO.update)"
LOOP_DEVICE = "device loop (LocalSource device_loop + PPO.update)"


def _ppo_cycle(n: int, dev: torch.device, device_loop: bool) -> Callable[[], None]:
    """One PPO cycle of ``simkit train simkit/BatchCartPole-v0 --servers 0`` (a fragment of
    ``n`` envs x :data:`LOOP_STEPS` steps, the update, the weight push) without the
    run's logging: the device loop on ``dev``, or the host rollout with the update on
    ``dev``."""
    from simkit.clients.learners._sources import LocalSource
    from simkit.clients.learners.ppo import build_model as build_run_model

    args = PPOArgs(
        env_id=ENV_ID,
        num_envs=n,
        num_steps=LOOP_STEPS,
        total_steps=0,
        device=str(dev),
        learning_rate=5e-4,
        num_minibatches=8,
        update_epochs=4,
    )
    model = build_run_model(args)
    source = LocalSource(
        ENV_ID,
        model,
        num_envs=n,
        num_steps=LOOP_STEPS,
        seed=SEED,
        device=dev if device_loop else None,
        device_loop=device_loop,
    )
    learner = PPO(args, model, n)
    source.push_weights(model, version=0)
    fragments = source.fragments()

    def cycle() -> None:
        learner.update([next(fragments)])
        source.push_weights(learner.model, version=learner.version)

    return cycle


def loop_cases(devices: list[torch.device], sizes: list[int], cpu_max: int) -> list[Case]:
    """The loop's cases: the CPU rows up to ``cpu_max`` envs (a cycle of 64k envs takes
    the CPU half a minute), the other devices' at every size."""
    cases: list[Case] = []
    cpu = torch.device("cpu")
    for n in sizes:
        if n <= cpu_max:
            cases.append(guarded(LOOP_HOST, cpu, n * LOOP_STEPS, _ppo_cycle, n, cpu, False))
        for dev in devices:
            if dev.type != "cpu" or n <= cpu_max:
                cases.append(guarded(LOOP_DEVICE, dev, n * LOOP_STEPS, _ppo_cycle, n, dev, True))
    return cases


# ------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches, few repeats")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of the CPU rows (0: torch's default)"
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--only",
        choices=("inference", "rowpolicy", "ppo", "sac", "batchenv", "loop"),
        action="append",
        default=None,
    )
    ns = parser.parse_args()
    if ns.threads > 0:
        torch.set_num_threads(ns.threads)
    quick: bool = ns.quick
    repeats: int = ns.repeats or (3 if quick else 7)
    min_time = 0.05 if quick else 0.2
    sections: list[str] = ns.only or ["inference", "rowpolicy", "ppo", "sac", "batchenv", "loop"]

    has_cuda = torch.cuda.is_available()
    devices = [torch.device("cpu")]
    if has_cuda:
        devices.append(torch.device("cuda", torch.cuda.current_device()))

    print("## simkit GPU paths (bench/gpu_check.py" + (" --quick" if quick else "") + ")\n")
    cuda_version = torch.version.cuda or "none"
    print(f"torch {torch.__version__} (CUDA {cuda_version}), Python {platform.python_version()}")
    for dev in devices:
        print(f"- {device_name(dev)}")
    if not has_cuda:
        print(
            "- no CUDA device found (torch.cuda.is_available() is False): CPU figures only, "
            "the GPU rows are not measured"
        )
    load_before = os.getloadavg()
    print(f"- load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    print(f"- {repeats} timed rounds per case (median), rounds of >= {min_time} s")
    t0 = time.perf_counter()
    # The CPU on every core too, beside --threads (full runs; --quick keeps one CPU row).
    all_threads = not quick and torch.get_num_threads() != DEFAULT_THREADS
    bits: list[tuple[str, str]] = []

    if "inference" in sections:
        batches = [K, 4 * K] if quick else [K, 4 * K, 16 * K, 64 * K]
        act_cases, row_cases = inference_cases(devices, batches)
        run_cases(act_cases + row_cases, repeats, min_time, warmup=3)
        note = "observations already on the device; no host copies"
        table(f"Inference: model.act ({note})", act_cases, "rows/s")
        table(
            "Inference: RowPolicy.act (numpy in and out, keyed noise; LeanMLP on the CPU)",
            row_cases,
            "rows/s",
        )

    if "rowpolicy" in sections:
        batches = [4 * K] if quick else [4 * K, 64 * K]
        by_head = row_policy_cases(devices, batches)
        # Half the rounds: the inference section times the default path already, and
        # the device check's few minutes are shared by every section.
        cases = [c for cs in by_head.values() for c in cs]
        run_cases(cases, max(3, repeats // 2), min_time / 2, warmup=3)
        for head, cases in by_head.items():
            resident = {(c.device, c.batch): c.rate for c in cases if c.path == ROW_MODEL}
            lean = {c.batch: c.rate for c in cases if c.path == ROW_CPU and c.error is None}

            def shares(
                c: Case, resident: dict[Any, float] = resident, lean: dict[int, float] = lean
            ) -> str:
                base, cpu = resident.get((c.device, c.batch)), lean.get(c.batch)
                of = f"{100 * c.rate / base:.0f}%" if base and c.path != ROW_MODEL else "—"
                vs = f"{c.rate / cpu:.2f}x" if cpu and c.device.type == "cuda" else "—"
                return f"{of} / {vs}"

            table(
                f"RowPolicy.act paths, {head} head (numpy in and out, keyed noise)",
                cases,
                "rows/s",
                ("of model.act (same device) / vs the CPU's LeanMLP", shares),
            )
        print("\nBit comparisons (same device):\n")
        print("\n".join(row_policy_bits(devices, batches)))

    if "ppo" in sections:
        shapes = [(2048, 1)] if quick else [(2048, 1), (2048, 8)]
        ppo_devices = devices if ppo_has_device() else devices[:1]
        cases = ppo_cases(ppo_devices, shapes, all_threads)
        run_cases(cases, max(2, repeats // 2), 0.0, warmup=1)
        table(
            "PPO update (32 minibatches x 10 epochs; batch = rows x steps; on CUDA the "
            "learner's default is the CUDA graph)",
            cases,
            "samples/s",
            [("s/update", lambda c: f"{c.seconds_per_call:.3f}"), vs_best_cpu(cases)],
        )
        bits.append(ppo_bits(devices[-1], *shapes[0], updates=2))
        if not ppo_has_device():
            print(
                "\nPPOArgs has no `device` field: the learner has no device option yet (CPU only)."
            )
        elif not has_cuda:
            print("\n(PPOArgs.device exists; no CUDA device to time it on.)")

    if "sac" in sections:
        cases = sac_cases(devices, all_threads)
        run_cases(cases, repeats, min_time, warmup=10)
        table(
            f"SAC gradient step (batch {SAC_BATCH}, 256x256 networks; on CUDA the learner's "
            "default is the CUDA graph)",
            cases,
            "samples/s",
            [("ms/step", lambda c: f"{c.seconds_per_call * 1e3:.2f}"), vs_best_cpu(cases)],
        )
        bits.append(sac_bits(devices[-1], steps=20))

    if bits:
        bits_table(bits)

    if "batchenv" in sections:
        sizes = [4 * K] if quick else [4 * K, 64 * K]
        cases = batch_env_cases(devices, sizes)
        run_cases(cases, repeats, min_time, warmup=5)
        numpy_rate = {c.batch: c.rate for c in cases if c.path == NUMPY_PATH}

        def vs_numpy(c: Case) -> str:
            if c.device.type != "cuda" or c.path != TORCH_PATH or not numpy_rate.get(c.batch):
                return "—"
            return f"{c.rate / numpy_rate[c.batch]:.2f}x"

        table(
            "simkit/BatchCartPole-v0 (torch BatchEnv; random actions, same-step autoreset)",
            cases,
            "instance-steps/s",
            ("GPU/numpy", vs_numpy),
        )

    if "loop" in sections:
        sizes = [K // 4] if quick else [K, 4 * K, 64 * K]
        cases = loop_cases(devices, sizes, cpu_max=K)
        run_cases(cases, max(2, repeats // 2), 0.0, warmup=1)
        host_rate = {c.batch: c.rate for c in cases if c.path == LOOP_HOST}

        def vs_host(c: Case) -> str:
            base = host_rate.get(c.batch)
            return f"{c.rate / base:.2f}x" if base and c.path == LOOP_DEVICE else "—"

        table(
            f"PPO's whole loop on simkit/BatchCartPole-v0 (fragment of N x {LOOP_STEPS} steps "
            "+ update, 8 minibatches x 4 epochs; batch = env steps per cycle)",
            cases,
            "env steps/s",
            ("vs host path", vs_host),
        )

    load_after = os.getloadavg()
    print(
        f"\nload average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
        f"total {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
