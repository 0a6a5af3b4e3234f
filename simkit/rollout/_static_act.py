"""The act path of a rollout policy on a CUDA device: static buffers, one graph per batch shape.

:class:`StaticActs` runs :class:`~simkit.rollout._policy.RowPolicy`'s batched act
without host stalls. Per batch shape (rows, observation dtype) it keeps one
:class:`StaticAct`: page-locked (pinned) host buffers for the observations and the
packed outputs, device buffers for them and the noise, and the forward pass (act,
then the outputs packed into one float64 tensor as
:func:`~simkit.rollout._policy.pack_output` packs them) captured once as a CUDA
graph on those buffers. A step is: the observations copied into the pinned buffer,
copied to the device without blocking, the noise put in place, the graph replayed, the
packed outputs copied back without blocking, and one event waited on: one
synchronisation per step. The graph replays the eager forward's kernels on the same
buffers, so it should give the eager forward's bits; the CUDA tests in
``tests/test_static_act.py`` check that (they have not run on a GPU yet).

A model whose forward cannot be captured (it reads a value back from the device, as
a data-dependent branch does) keeps the buffers and runs its forward eagerly
(:attr:`StaticAct.fallback` says why), so no model fails for being on a GPU.

Weights are copied into the model's own tensors in place (the policy's
``set_weights`` and ``load_state_dict``), so the graphs read the new weights without
being captured again; :meth:`StaticActs.check_weights` drops the graphs if a
parameter's storage was replaced after all. Observation normalisation recomputes its
shift and scale inside the graph (:meth:`~simkit.models._normalize.RunningMeanStd.drop_cache`
before the capture), so new statistics reach the graph the same way.

The structure does not depend on CUDA: ``capture`` turns the function that fills the
static outputs into its replay (:func:`cuda_graph_capture` on a CUDA device,
:func:`eager_capture`, the function itself, where tests exercise the buffers and the
cache on the CPU), and host buffers are pinned only where the device is CUDA (torch's
CPU wheel cannot pin memory).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simkit.models import ActorCritic
from simkit.models._actor_critic import ActOutput

__all__ = [
    "Capture",
    "StaticAct",
    "StaticActs",
    "cuda_graph_capture",
    "eager_capture",
]

Capture = Callable[[Callable[[], None], torch.device], Callable[[], None]]
"""``capture(fill, device)``: the replay of ``fill`` (a function writing static outputs
from static inputs); called once per batch shape."""

WARMUP = 3
"""Eager runs of a forward on a side stream before it is captured (CUDA's lazy
initialisation and cuBLAS workspaces happen outside the graph)."""

_CAPTURE_LOCK = threading.Lock()
"""One capture at a time in this process (stream sessions capture from their threads)."""


def eager_capture(fill: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """No graph: the replay is ``fill`` itself (the static path without CUDA)."""
    return fill


def cuda_graph_capture(fill: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """``fill`` captured as a ``torch.cuda.CUDAGraph`` on ``device``: warmed up
    :data:`WARMUP` times on a side stream of ``device``, then captured on that stream
    (its own memory pool; errors only for this thread's unsafe calls, so other sessions'
    threads go on); the replay runs on the current stream."""
    with _CAPTURE_LOCK, torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                fill()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            fill()
    return graph.replay


def _float_obs(dtype: np.dtype[Any]) -> bool:
    return bool(np.issubdtype(dtype, np.floating))


class StaticAct:
    """The buffers and captured forward of one batch shape.

    Args:
        model: the policy, on ``device``.
        device: where the forward runs.
        rows: the batch size.
        obs: an observation batch of this shape (its shape and dtype size the buffers;
            floating observations are acted on as float32, as the eager path does).
        noise_width: values of noise per row.
        pack: ``pack(out, into)`` writes an :class:`ActOutput` into the packed buffer
            ``into`` (``None``: returns a new one).
        capture: see :data:`Capture`.
    """

    def __init__(
        self,
        model: ActorCritic,
        device: torch.device,
        rows: int,
        obs: np.ndarray,
        noise_width: int,
        pack: Callable[[ActOutput, torch.Tensor | None], torch.Tensor],
        capture: Capture,
    ) -> None:
        pin = device.type == "cuda"
        obs_dtype = (
            torch.float32
            if _float_obs(obs.dtype)
            else torch.from_numpy(np.empty(0, obs.dtype)).dtype
        )
        shape = (rows, *obs.shape[1:])
        self.rows = rows
        self.host_obs = torch.zeros(shape, dtype=obs_dtype, pin_memory=pin)
        self.obs = torch.zeros(shape, dtype=obs_dtype, device=device)
        self.noise = torch.zeros((rows, noise_width), dtype=torch.float32, device=device)
        probe = model.act(self.obs, noise=self.noise)
        self.actions_shape = tuple(probe.actions.shape[1:])
        self.actions_dtype = probe.actions.dtype
        self.out = pack(probe, None)
        self.host_out = torch.zeros(self.out.shape, dtype=self.out.dtype, pin_memory=pin)
        self.done = torch.cuda.Event() if device.type == "cuda" else None
        self._host_obs = self.host_obs.numpy()
        self._host_out = self.host_out.numpy()
        rms = model.obs_rms

        def fill() -> None:
            if rms is not None:
                rms.drop_cache()  # captured: the graph computes shift and scale itself
            pack(model.act(self.obs, noise=self.noise), self.out)

        self.fallback: str | None = None
        """Why the forward could not be captured (it then runs eagerly), else None."""
        try:
            self.replay = capture(fill, device)
        except RuntimeError as exc:  # a forward that reads the device (``bool(tensor)``)
            self.replay, self.fallback = fill, f"{type(exc).__name__}: {exc}"
        if rms is not None:
            rms.drop_cache()  # the eager forwards' cache is not the graph's memory

    def run(self, obs: np.ndarray, noise: torch.Tensor) -> np.ndarray:
        """The packed outputs of acting on ``obs`` with ``noise`` (a tensor on the
        device): a view of the pinned host buffer, valid until the next run (copy what
        is kept)."""
        np.copyto(self._host_obs, obs, casting="same_kind")
        if self.done is None:
            self._launch(noise)
        else:
            with torch.cuda.device(self.obs.device):  # the graph's device (cuda:k)
                self._launch(noise)
                self.done.record()
                self.done.synchronize()  # the step's one wait for the device
        return self._host_out

    def _launch(self, noise: torch.Tensor) -> None:
        """Queues the step on the current stream: inputs in, replay, outputs out."""
        self.obs.copy_(self.host_obs, non_blocking=True)
        self.noise.copy_(noise)
        self.replay()
        self.host_out.copy_(self.out, non_blocking=True)


@dataclass(eq=False)
class StaticActs:
    """One :class:`StaticAct` per batch shape of a policy, made on first use.

    Args:
        model: the policy, on ``device``.
        device: where it runs.
        noise_width: the head's noise values per row.
        pack: see :class:`StaticAct`.
        capture: see :data:`Capture`.
    """

    model: ActorCritic
    device: torch.device
    noise_width: int
    pack: Callable[[ActOutput, torch.Tensor | None], torch.Tensor]
    capture: Capture
    plans: dict[tuple[tuple[int, ...], np.dtype[Any]], StaticAct] = field(
        default_factory=dict, init=False
    )
    _storage: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self._storage = self._pointers()

    def _pointers(self) -> tuple[int, ...]:
        """Where every parameter and buffer of the model lives (the graphs read there)."""
        return tuple(t.data_ptr() for t in self.model.state_dict().values())

    def check_weights(self) -> bool:
        """After a weight load: True if the model's tensors are where the graphs read
        them; else drops every plan (they are made again on next use) and returns False."""
        pointers = self._pointers()
        if pointers == self._storage:
            return True
        self.plans.clear()
        self._storage = pointers
        return False

    def plan(self, obs: np.ndarray) -> StaticAct:
        """The plan of ``obs``'s batch shape (made, and its forward captured, on first use)."""
        key = (obs.shape, obs.dtype)
        found = self.plans.get(key)
        if found is None:
            found = self.plans[key] = StaticAct(
                self.model,
                self.device,
                obs.shape[0],
                obs,
                self.noise_width,
                self.pack,
                self.capture,
            )
        return found
