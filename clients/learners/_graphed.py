"""The learners' launch-free steps: PPO's minibatch step and SAC's gradient step over
static device buffers, replayed as CUDA graphs on CUDA.

A small MLP's step is hundreds of tiny kernels, so on a GPU the host's launches, not the
arithmetic, bound it. Here every tensor a step touches lives at a fixed address: the
update's batch in static buffers, the minibatch's rows chosen by a device counter from
a static table of indices (filled from the permutations the learner draws on the CPU),
the statistics written to a device buffer and read back once. Such a step can be
captured once (``torch.cuda.CUDAGraph``, after a warm-up on a side stream) and replayed
per minibatch: one launch instead of hundreds, no read back in between.

The learning rate a captured Adam step uses is a device tensor (fused Adam reads it
there), so annealing works inside the graph; ``capturable`` is set on the optimiser's
groups only while it steps, so checkpoints keep their groups as before (plain floats).
The warm-up and the capture leave no trace: parameters, Adam's state and the
generators are restored afterwards, so the first graphed update equals the eager one.
A graph follows the tensors it was captured on: a learner whose optimiser state was
replaced (``load_state_dict``) or whose batch changed shape captures again.

Where each runs: both learners run their one step (PPO's minibatch step, SAC's
gradient step) through :class:`PPOStep` and :class:`SACStep` on every device, captured
on CUDA with ``cuda_graph`` (the default) and called as they are elsewhere (the same
kernels, so the same bits; a CUDA test checks it), so the CPU runs, and the tests
check, the step a graph captures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

__all__ = ["PPOStep", "SACStep", "use_cuda_graph", "WARMUP_STEPS"]


class GraphedLearner(Protocol):
    """What both static steps use of their learner (this module imports neither
    learner: they import it)."""

    @property
    def device(self) -> torch.device: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...


class PPOLearner(GraphedLearner, Protocol):
    """What :class:`PPOStep` uses of :class:`~simkit.clients.learners.ppo.PPO` besides
    :class:`GraphedLearner`'s."""

    @property
    def model(self) -> nn.Module: ...

    def minibatch_step(self, batch: Sequence[torch.Tensor], rows: torch.Tensor) -> torch.Tensor: ...


class SACLearner(GraphedLearner, Protocol):
    """What :class:`SACStep` uses of :class:`~simkit.clients.learners.sac.SAC` besides
    :class:`GraphedLearner`'s."""

    @property
    def generator(self) -> torch.Generator: ...

    def tensors(self) -> dict[str, torch.Tensor]: ...

    def gradient_step(
        self, batch: Sequence[torch.Tensor], alpha: torch.Tensor, *, actor: bool, target: bool
    ) -> torch.Tensor: ...


WARMUP_STEPS = 3
"""Eager steps on a side stream before a capture (cuBLAS handles, workspaces, Adam's
state and any ``torch.compile`` are made then, outside the graph)."""


def use_cuda_graph(flag: bool, device: torch.device) -> bool:
    """Whether a learner on ``device`` captures its step: ``flag`` (the ``cuda_graph``
    setting) on a CUDA device; never elsewhere."""
    return bool(flag) and device.type == "cuda"


def _check_capture(capture: bool, device: torch.device) -> None:
    if capture and device.type != "cuda":
        raise ValueError(f"capture needs a CUDA device, got {device}")


class _Restore:
    """The tensors a warm-up changes, copied before it and put back after the capture
    (in place: the graph keeps their addresses), and the generators' states."""

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        optimizer: torch.optim.Optimizer,
        generators: Sequence[torch.Generator],
    ) -> None:
        self.tensors = [(t, t.detach().clone()) for t in tensors]
        self.optimizer = optimizer
        self.state = {
            p: {k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)}
            for p, s in optimizer.state.items()
        }
        self.generators = [(g, g.get_state()) for g in generators]

    @torch.no_grad()
    def restore(self) -> None:
        for t, saved in self.tensors:
            t.copy_(saved)
        for p, s in self.optimizer.state.items():
            before = self.state.get(p, {})
            for k, v in s.items():
                if isinstance(v, torch.Tensor) and k in before:
                    v.copy_(before[k])
                elif isinstance(v, torch.Tensor):  # made by the warm-up: Adam starts it at zeros
                    v.zero_()
        for g, state in self.generators:
            g.set_state(state)


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


class _Graphs:
    """Captured graphs by key, dropped when the optimiser's state tensors or the
    parameters were replaced since (a graph writes to the addresses it was captured on)."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.device = device
        self.graphs: dict[Any, torch.cuda.CUDAGraph] = {}
        self._state: dict[int, tuple[int, ...]] = {}
        self._params: tuple[int, ...] = ()

    def check(self) -> None:
        """Drops every graph if a tensor it may use moved."""
        params = tuple(p.data_ptr() for p in _params(self.optimizer))
        index = {id(p): i for i, p in enumerate(_params(self.optimizer))}
        state = {  # the addresses of each parameter's optimiser state, by its index
            index[id(p)]: tuple(v.data_ptr() for v in s.values() if isinstance(v, torch.Tensor))
            for p, s in self.optimizer.state.items()
        }
        moved = params != self._params or any(
            state.get(i) != ptrs for i, ptrs in self._state.items()
        )
        if moved:
            self.graphs.clear()
        self._params, self._state = params, state

    def get(
        self,
        key: Any,
        step: Callable[[], None],
        reset: Callable[[], object],
        tensors: Sequence[torch.Tensor],
        generators: Sequence[torch.Generator] = (),
    ) -> torch.cuda.CUDAGraph:
        """The graph of ``step`` under ``key``, captured now if there is none: a
        warm-up of :data:`WARMUP_STEPS` eager steps on a side stream (``reset()``
        before each), the capture, then ``tensors``, the optimiser's state and
        ``generators`` as they were before."""
        graph = self.graphs.get(key)
        if graph is not None:
            return graph
        saved = _Restore(tensors, self.optimizer, generators)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                reset()
                step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        saved.restore()  # the state tensors exist now (Adam made them), at their addresses
        graph = torch.cuda.CUDAGraph()
        for g in generators:
            graph.register_generator_state(g)
        reset()
        self.optimizer.zero_grad(set_to_none=True)
        # thread_local: other threads' CUDA calls (a rollout's) do not break the capture.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            step()
        saved.restore()
        self.graphs[key] = graph
        self.check()  # the addresses the graph was captured on
        return graph


@contextlib.contextmanager
def _stepping(
    optimizer: torch.optim.Optimizer, lr: Sequence[torch.Tensor] | None
) -> Iterator[None]:
    """The optimiser's groups as a captured step needs them, for one ``step()``:
    ``capturable`` and the learning rates as device tensors (None: the groups' own,
    unchanged)."""
    if lr is None:  # the CPU: nothing is captured there
        yield
        return
    groups = optimizer.param_groups
    saved = [(g["lr"], g["capturable"]) for g in groups]
    # capturable only while capturing: torch warns when a capturable step runs eagerly.
    capturing = torch.cuda.is_current_stream_capturing()
    try:
        for i, g in enumerate(groups):
            g["capturable"] = capturing
            g["lr"] = lr[i]
        yield
    finally:
        for g, (rate, capturable) in zip(groups, saved, strict=True):
            g["lr"], g["capturable"] = rate, capturable


def _device_lr(optimizer: torch.optim.Optimizer, device: torch.device) -> list[torch.Tensor] | None:
    """Per group, the learning rate as a float32 device tensor for fused Adam on CUDA
    (its kernel reads a tensor learning rate there); None on the CPU, where the groups'
    floats serve (no capture)."""
    if device.type != "cuda":
        return None
    return [
        torch.full((), float(g["lr"]), dtype=torch.float32, device=device)
        for g in optimizer.param_groups
    ]


# ------------------------------------------------------------------------------ PPO


class PPOStep:
    """Runs PPO's minibatch steps (:meth:`PPO.minibatch_step`) over static buffers.

    Step ``k`` takes the rows ``order[k]``, ``k`` a device counter the step advances,
    and writes its statistics to row ``k`` of ``stats``: every tensor it touches lives
    at a fixed address, so with ``capture`` the step is captured once as a CUDA graph
    and replayed per minibatch; without, the same step runs as it is (the CPU, and
    CUDA without ``cuda_graph``).

    Raises:
        ValueError: ``capture`` on a device that is not CUDA.
    """

    def __init__(self, learner: PPOLearner, capture: bool) -> None:
        _check_capture(capture, learner.device)
        self.learner = learner
        self.capture = capture
        self.device = learner.device
        self.lr = _device_lr(learner.optimizer, self.device)
        self.graphs = _Graphs(learner.optimizer, self.device)
        self._key: tuple[Any, ...] | None = None
        self.inputs: list[torch.Tensor] = []
        self.order = torch.zeros((1, 1), dtype=torch.int64, device=self.device)
        self.k = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.stats = torch.zeros((1, 5), device=self.device)

    def _step(self) -> None:
        """One minibatch step on the rows ``order[k]``; ``k += 1``."""
        rows = self.order.index_select(0, self.k).squeeze(0)
        with _stepping(self.learner.optimizer, self.lr):
            stats = self.learner.minibatch_step(self.inputs, rows)
        self.stats.index_copy_(0, self.k, stats.unsqueeze(0))
        self.k.add_(1)

    def run(self, batch: Sequence[torch.Tensor], order: torch.Tensor) -> torch.Tensor:
        """One step per row of ``order`` (``(steps, mb)`` row indices, on the CPU) over
        ``batch`` (:meth:`PPO.minibatch_step`'s tensors, on the device), at the
        optimiser's learning rate. Returns the ``(steps, 5)`` statistics (on the device)."""
        learner = self.learner
        key = (tuple(order.shape), *((t.dtype, tuple(t.shape)) for t in batch))
        if key != self._key:
            self.inputs = [torch.empty_like(t) for t in batch]
            self.order = torch.empty_like(order, device=self.device)
            self.stats = torch.zeros((len(order), 5), device=self.device)
            self.graphs.graphs.clear()
            self._key = key
        for buffer, t in zip(self.inputs, batch, strict=True):
            buffer.copy_(t)
        self.order.copy_(order)
        if self.lr is not None:
            for rate, group in zip(self.lr, learner.optimizer.param_groups, strict=True):
                rate.fill_(float(group["lr"]))
        step = self._step
        if self.capture:
            self.graphs.check()
            params = list(learner.model.parameters())
            step = self.graphs.get("step", self._step, self.k.zero_, params).replay
        self.k.zero_()
        for _ in range(len(order)):
            step()
        return self.stats


# ------------------------------------------------------------------------------ SAC


class SACStep:
    """Runs SAC's gradient steps (:meth:`SAC.gradient_step`) over static buffers.

    Each step copies its batch into the static ``inputs``, takes the entropy
    coefficient from the device tensor ``alpha`` (which the step updates in place) and
    writes its figures (critic loss, actor loss, alpha loss, mean Q; NaN where a step
    has none) to row ``k`` of ``stats``, read back by :meth:`flush` (at most every
    :data:`CHUNK` steps). Every tensor a step touches lives at a fixed address, so with
    ``capture`` each kind of step (with or without the actor, with or without the
    target update) is captured once as a CUDA graph and replayed; without, the same
    step runs as it is (the CPU, and CUDA without ``cuda_graph``). The noise comes from
    the learner's generator, registered with each graph, so replays draw what eager
    steps draw.

    Raises:
        ValueError: ``capture`` on a device that is not CUDA.
    """

    CHUNK = 1024
    """Steps whose figures the device buffer holds between read backs."""

    def __init__(self, learner: SACLearner, capture: bool) -> None:
        _check_capture(capture, learner.device)
        self.learner = learner
        self.capture = capture
        self.device = dev = learner.device
        self.lr = _device_lr(learner.optimizer, dev)
        self.graphs = _Graphs(learner.optimizer, dev)
        self.inputs: list[torch.Tensor] = []
        self._shapes: tuple[Any, ...] | None = None
        self._staging: list[torch.Tensor] = []
        """CUDA: pinned host copies of the batch, copied to ``inputs`` without blocking."""
        self._staged = torch.cuda.Event() if dev.type == "cuda" else None
        """Recorded after the copies out of ``_staging``: the next batch waits for it only."""
        self._learned: list[torch.Tensor] = []
        """What a warm-up changes besides Adam's state and the generator (:meth:`begin`)."""
        self.alpha = torch.zeros((), device=dev)
        self.k = torch.zeros(1, dtype=torch.int64, device=dev)
        self.stats = torch.zeros((self.CHUNK, 4), device=dev)
        self.done = 0
        """Steps written to ``stats`` since the last read back."""

    def _step(self, *, actor: bool, target: bool) -> None:
        """One gradient step on the static batch; ``k += 1``."""
        with _stepping(self.learner.optimizer, self.lr):
            figures = self.learner.gradient_step(
                self.inputs, self.alpha, actor=actor, target=target
            )
        self.stats.index_copy_(0, self.k, figures.unsqueeze(0))
        self.k.add_(1)

    def begin(self, alpha: float) -> None:
        """Starts a stretch of steps: ``alpha`` the learner's entropy coefficient and
        the learning rates the optimiser's (either may have been loaded since), the
        graphs checked against the optimiser's state."""
        self.alpha.fill_(alpha)
        if self.lr is not None:
            for rate, group in zip(self.lr, self.learner.optimizer.param_groups, strict=True):
                rate.fill_(float(group["lr"]))
        if self.capture:
            self.graphs.check()
            self._learned = [*self.learner.tensors().values(), self.alpha, self.k]

    def step(self, arrays: Sequence[np.ndarray], *, actor: bool, target: bool) -> None:
        """One gradient step on ``arrays`` (:meth:`SAC.gradient_step`'s batch, as numpy;
        copied into the static buffers), with the actor and entropy updates where
        ``actor``, the target update where ``target``; its figures stay on the device
        (:meth:`flush`)."""
        shapes = tuple(a.shape for a in arrays)
        if shapes != self._shapes:
            self.inputs = [
                torch.empty(a.shape, dtype=torch.float32, device=self.device) for a in arrays
            ]
            if self._staged is not None:
                self._staged.synchronize()
                self._staging = [
                    torch.empty(a.shape, dtype=torch.float32, pin_memory=True) for a in arrays
                ]
            self._shapes = shapes
            self.graphs.graphs.clear()
        self._copy_in(arrays)
        if self.done == self.CHUNK:
            raise RuntimeError(f"SACStep holds {self.CHUNK} steps' figures: flush() first")
        if self.capture:
            graph = self.graphs.get(
                (actor, target),
                lambda: self._step(actor=actor, target=target),
                lambda: self.k.fill_(self.done),
                self._learned,
                [self.learner.generator],
            )
            graph.replay()
        else:
            self._step(actor=actor, target=target)
        self.done += 1

    def _copy_in(self, arrays: Sequence[np.ndarray]) -> None:
        """The batch into the static buffers (as float32: the flags as 0.0 / 1.0). On
        CUDA through pinned memory, without blocking: the host waits only until the
        previous batch left the staging buffers (so it samples the next batch while
        the GPU runs this step), not for the steps queued before it."""
        if self._staged is None:
            for buffer, a in zip(self.inputs, arrays, strict=True):
                buffer.copy_(torch.from_numpy(a))
            return
        self._staged.synchronize()
        for stage, a in zip(self._staging, arrays, strict=True):
            np.copyto(stage.numpy(), a, casting="unsafe")
        for buffer, stage in zip(self.inputs, self._staging, strict=True):
            buffer.copy_(stage, non_blocking=True)
        self._staged.record()

    def flush(self) -> np.ndarray:
        """``(steps, 4)`` float32 figures of the steps since the last flush (one read
        back): critic loss (the sum of both critics'), actor loss, alpha loss, mean Q."""
        rows = self.stats[: self.done].cpu().numpy()
        self.done = 0
        self.k.zero_()
        return rows
