"""The policy of a rollout: one batched forward pass per step, sampling from keyed noise.

:class:`RowPolicy` acts on every row of a rollout (a stream session's, or the learner's
in-process one) in one forward pass and samples each row's action from the noise of its
env slot at that step (:class:`simkit._noise.SlotNoise`): a function of the run's seed,
the global slot and the step, so where a slot is stepped (which server, beside which
other slots) changes nothing. On the CPU, the built-in MLP acts through
:class:`~simkit.models._lean.LeanMLP`, whose forward pass computes each row alone, so
the rollout's fragments are bit-identical for any split of the slots; other models and
devices act through ``model.act`` (the same noise; the forward's last bits may depend
on the batch shape). On a device other than the CPU, the noise is computed there
(:class:`simkit._noise.TorchSlotNoise`, the same bits, uniform or normal), so no noise
crosses from the host. On a CUDA device
the act runs through :class:`simkit.rollout._static_act.StaticActs`: pinned host
buffers, non-blocking copies, one synchronisation per act and the forward pass as a
CUDA graph per batch shape; values go through pinned copies too (the final values of
truncations in one batch per fragment or weight change: :meth:`RowPolicy.final_values`).

A *resident* policy acts on rows that stay on its device (the device loop,
:class:`~simkit.rollout._rows.DeviceRows`): ``model.act`` on the tensors, the noise of a
whole fragment computed there at once, and its outputs are tensors there.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from simkit._noise import NoiseKind, SlotNoise, TorchSlotNoise
from simkit.models import ActorCritic, PolicyWeights, set_weights
from simkit.models._actor_critic import ActOutput
from simkit.models._lean import LeanMLP
from simkit.rollout._static_act import Capture, StaticActs, cuda_graph_capture

__all__ = ["RowPolicy", "PolicyOutput", "host_output", "pack_output", "unpack_output"]

HOST_NOISE_VALUES = 4096
"""Noise values a host policy draws at once: steps ahead for few rows (one env: 4096 /
width steps), where the per-call cost of computing a step's few normals would exceed
the computation (:meth:`simkit._noise.SlotNoise.draw_steps`: the same bits)."""


def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """The numpy dtype of a torch dtype (int64, float32, float64, ...)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def pack_output(out: ActOutput, into: torch.Tensor | None = None) -> torch.Tensor:
    """``out``'s actions, log-probs and values side by side in one ``(R, width + 2)``
    float64 tensor (``into``, or a new one): float64 holds every int64 action below
    2**53 and every float32 or float64 value exactly, so one copy of it to the host
    brings the bits of three."""
    rows = out.actions.shape[0]
    parts = [
        out.actions.reshape(rows, -1).double(),
        out.log_probs.float().reshape(rows, 1).double(),
        out.values.float().reshape(rows, 1).double(),
    ]
    if into is None:
        return torch.cat(parts, 1)
    return torch.cat(parts, 1, out=into)


def unpack_output(
    host: np.ndarray, actions_shape: tuple[int, ...], actions_dtype: torch.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(actions, log_probs, values)`` from :func:`pack_output`'s array on the host, as
    new arrays (``host`` may be reused)."""
    width = host.shape[1] - 2
    actions = host[:, :width].astype(_numpy_dtype(actions_dtype))
    return (
        actions.reshape(host.shape[0], *actions_shape),
        host[:, width].astype(np.float32),
        host[:, width + 1].astype(np.float32),
    )


def host_output(out: ActOutput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(actions, log_probs, values)`` of ``out`` as numpy, moved to the host in one
    copy (:func:`pack_output`): the bits of three separate copies."""
    host = pack_output(out).cpu().numpy()
    return unpack_output(host, tuple(out.actions.shape[1:]), out.actions.dtype)


@dataclass
class PolicyOutput:
    """One batched act over every row (numpy; tensors on the device for a resident
    policy).

    Attributes:
        actions: ``(R, *action_shape)`` sampled actions.
        log_probs: ``(R,)`` float32.
        values: ``(R,)`` float32.
        seconds: time spent in forward passes and sampling.
    """

    actions: Any
    log_probs: Any
    values: Any
    seconds: float


class RowPolicy:
    """An :class:`~simkit.models.ActorCritic` acting on ``num_rows`` rows of env slots.

    Args:
        model: the policy (moved to ``device``).
        device: torch device.
        seed: the run's root seed (the noise's key).
        first_slot: global index of the first env slot.
        num_slots: env slots.
        rows_per_slot: rows of one slot (agents of a multi-agent env, else 1).
        action_space: the per-row action space (sets the actions' numpy dtype).
        lean: act through :class:`LeanMLP` where the device is the CPU and the model
            is the built-in MLP (else ``model.act``).
        graphs: on a CUDA device, act through static buffers with the forward as a
            CUDA graph per batch shape (:mod:`simkit.rollout._static_act`); False: the
            eager path (``model.act`` per call; the same bits).
        capture: act through static buffers on any device, each batch shape's forward
            made by this :data:`~simkit.rollout._static_act.Capture` (tests run the
            structure on the CPU with ``eager_capture``); None: as ``graphs`` says.
        resident: act on rows that stay on ``device`` (tensors in, tensors out).
        ahead: steps of noise drawn at once (a resident policy's fragment length).
    """

    def __init__(
        self,
        model: ActorCritic,
        device: torch.device,
        *,
        seed: int,
        first_slot: int,
        num_slots: int,
        rows_per_slot: int,
        action_space: spaces.Space[Any],
        lean: bool = True,
        graphs: bool = True,
        capture: Capture | None = None,
        resident: bool = False,
        ahead: int = 1,
    ) -> None:
        self.model = model.to(device)
        self.resident = resident
        self.ahead = ahead
        self.model.eval()
        self.device = device
        self.num_rows = num_slots * rows_per_slot
        self.first_row = first_slot * rows_per_slot
        """Global index of this policy's row 0 (the lean forward aligns on it)."""
        head = self.model.head
        kind: NoiseKind = "normal" if head.noise_kind == "normal" else "uniform"
        self.noise = SlotNoise(
            seed,
            first_slot=first_slot,
            num_slots=num_slots,
            rows_per_slot=rows_per_slot,
            width=head.noise_width,
            kind=kind,
        )
        self.action_dtype = (
            np.dtype(np.int64) if isinstance(action_space, spaces.Discrete) else action_space.dtype
        )
        self.version: int | None = None
        self._own: tuple[list[str], list[torch.Tensor]] | None = None
        self._drawn: tuple[int, np.ndarray] | None = None
        self.host_ahead = max(1, HOST_NOISE_VALUES // (self.num_rows * head.noise_width))
        """Steps of host noise drawn at once (:data:`HOST_NOISE_VALUES` values)."""
        self.lean = (
            LeanMLP.of(self.model) if lean and device.type == "cpu" and not resident else None
        )
        """The numpy act path, None on other devices and for other models."""
        if capture is None and graphs and device.type == "cuda" and not resident:
            capture = cuda_graph_capture
        self.device_noise = (
            TorchSlotNoise(self.noise, device)
            if device.type != "cpu" or resident or capture is not None
            else None
        )
        """The noise computed by torch on ``device`` (off the CPU, resident, or for the
        static buffers), else None."""
        self._drawn_on_device: tuple[int, torch.Tensor] | None = None
        self.static = (
            StaticActs(self.model, device, head.noise_width, pack_output, capture)
            if capture is not None
            else None
        )
        """The static-buffer act path (CUDA graphs on a CUDA device), else None."""

    def set_weights(self, weights: PolicyWeights) -> None:
        """Loads ``weights`` (validated by the model; unchanged on error)."""
        set_weights(self.model, weights)  # in place: the graphs read the new weights
        if self.lean is not None:
            self.lean.load()
        if self.static is not None:
            self.static.check_weights()
        self.version = weights.version

    def load_state_dict(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Loads a state dict the learner holds (in process: no wire form, no checks
        beyond the names: one fused copy into the model's own tensors)."""
        own = self._own
        if own is None or own[0] != list(tensors):
            mine = self.model.state_dict()  # views of the parameters and buffers
            if set(mine) != set(tensors):
                self.model.load_state_dict(tensors)  # raises, naming the difference
            own = self._own = (list(tensors), [mine[k] for k in tensors])
        with torch.no_grad():
            torch._foreach_copy_(own[1], list(tensors.values()))  # in place, as set_weights
        if self.lean is not None:
            self.lean.load()
        if self.static is not None:
            self.static.check_weights()
        self.version = version

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        if not (obs.flags.writeable and obs.flags.c_contiguous):
            obs = np.array(obs, order="C")
        t = torch.from_numpy(obs)
        if t.is_floating_point() and t.dtype != torch.float32:
            t = t.float()
        return t.to(self.device, non_blocking=True)

    def _first_row(self, part: slice | None) -> int:
        """The run's global index of the first row of ``part`` (of every row: None)."""
        return self.first_row + (0 if part is None else part.start or 0)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, step: int, part: slice | None = None) -> PolicyOutput:
        """Samples an action for every row of ``obs`` at ``step`` (the slots' step count).

        ``obs`` holds every row, or with ``part`` only the rows ``part``; each row samples
        from its own noise, so acting part by part gives the same actions.
        """
        start = time.perf_counter()
        if self.resident:
            out = self.model.act(obs, noise=self._device_noise(step, part))
            seconds = time.perf_counter() - start
            return PolicyOutput(out.actions, out.log_probs, out.values, seconds)
        if self.static is not None:
            return self._act_static(obs, step, part, start)
        if self.device_noise is not None:
            return self._act_device_noise(obs, step, part, start)
        noise = self._host_noise(step, part)
        first = self._first_row(part)
        lean = self.lean
        if lean is not None:
            actions, log_probs, values = lean.act(obs, noise, first)
            return PolicyOutput(
                actions=actions.astype(self.action_dtype, copy=False),
                log_probs=log_probs,
                values=values,
                seconds=time.perf_counter() - start,
            )
        out = self.model.act(
            self._tensor(obs), noise=torch.from_numpy(noise).to(self.device, non_blocking=True)
        )
        return self._output(out, start)

    def _host_noise(self, step: int, part: slice | None) -> np.ndarray:
        """The noise of ``part``'s rows (every row: None) at ``step``, drawn on the host
        (the parts of one step share one draw), :attr:`host_ahead` steps at once."""
        drawn = self._drawn
        if drawn is None or not 0 <= step - drawn[0] < len(drawn[1]):
            drawn = self._drawn = (step, self.noise.draw_steps(step, self.host_ahead))
        noise = drawn[1][step - drawn[0]]
        return noise if part is None else noise[part]

    def _device_noise(self, step: int, part: slice | None) -> torch.Tensor:
        """:meth:`_host_noise` computed on the policy's device, ``ahead`` steps at once."""
        assert self.device_noise is not None
        drawn = self._drawn_on_device
        if drawn is None or not 0 <= step - drawn[0] < len(drawn[1]):
            drawn = (step, self.device_noise.draw_steps(step, self.ahead))
            self._drawn_on_device = drawn
        noise = drawn[1][step - drawn[0]]
        return noise if part is None else noise[part]

    def _act_static(
        self, obs: np.ndarray, step: int, part: slice | None, start: float
    ) -> PolicyOutput:
        """:meth:`act` through the static buffers of ``obs``'s batch shape."""
        assert self.static is not None
        plan = self.static.plan(obs)
        actions, log_probs, values = unpack_output(
            plan.run(obs, self._device_noise(step, part)), plan.actions_shape, plan.actions_dtype
        )
        return PolicyOutput(
            actions=actions.astype(self.action_dtype, copy=False),
            log_probs=log_probs,
            values=values,
            seconds=time.perf_counter() - start,
        )

    def _output(self, out: ActOutput, start: float) -> PolicyOutput:
        """``out`` as numpy: on the CPU as is, on another device in one copy (one
        synchronisation per act, not one per array; the same bits)."""
        if self.device.type == "cpu":
            actions = out.actions.numpy()
            log_probs = out.log_probs.float().numpy().reshape(-1)
            values = out.values.float().numpy().reshape(-1)
        else:
            actions, log_probs, values = host_output(out)
        return PolicyOutput(
            actions=actions.astype(self.action_dtype, copy=False),
            log_probs=log_probs,
            values=values,
            seconds=time.perf_counter() - start,
        )

    def _act_device_noise(
        self, obs: np.ndarray, step: int, part: slice | None, start: float
    ) -> PolicyOutput:
        """:meth:`act` with the noise computed on the policy's device."""
        noise = self._device_noise(step, part)
        return self._output(self.model.act(self._tensor(obs), noise=noise), start)

    @torch.inference_mode()
    def value(self, obs: Any, rows: Any = None, part: slice | None = None) -> Any:
        """float32 values of ``obs`` ``(B, ...)`` (numpy; tensors for a resident policy); with ``rows`` (bool ``(B,)``), only the
        selected rows are evaluated (0 elsewhere). ``obs`` holds every row, or with
        ``part`` only the rows ``part`` (as :meth:`act`): a row's value has the same bits
        either way. On the static act path (CUDA) through pinned copies and one wait; a
        resident policy's are tensors on its device (every row evaluated)."""
        if self.resident:
            v = self.model.value(obs).float().reshape(-1)
            return v if rows is None else torch.where(torch.as_tensor(rows), v, 0.0)
        if self.static is not None:
            return self._value_static(obs, np.ones(len(obs), np.bool_) if rows is None else rows)
        lean = self.lean
        first = self._first_row(part)
        if rows is None:
            if lean is not None:
                return lean.value(obs, first)
            return self.model.value(self._tensor(obs)).float().cpu().numpy().reshape(-1)
        out = np.zeros(len(obs), dtype=np.float32)
        picked = np.flatnonzero(rows)
        if len(picked) and lean is not None:
            out[picked] = lean.value(obs, first, picked)
        elif len(picked):
            x = self._tensor(np.asarray(obs)[picked])
            out[picked] = self.model.value(x).float().cpu().numpy().reshape(-1)
        return out

    @torch.inference_mode()
    def final_values(self, obs: Any, rows: Any) -> Any:
        """``(K, R)`` float32 values of the final observations ``obs`` ``(K, R, ...)`` of
        ``K`` steps where ``rows`` (bool ``(K, R)``), 0 elsewhere: on the CPU step by
        step (:meth:`value`'s bits), on the static act path in one forward pass over the
        selected rows of every step (one wait), resident in one forward pass over every
        row (no wait)."""
        k, r = rows.shape
        if self.resident:
            v = self.model.value(obs.reshape(k * r, *obs.shape[2:])).float().reshape(k, r)
            return torch.where(rows, v, 0.0)
        if self.static is not None:
            flat = np.asarray(obs).reshape(k * r, *obs.shape[2:])
            return self._value_static(flat, rows.reshape(-1)).reshape(k, r)
        out = np.zeros(rows.shape, dtype=np.float32)
        for k in np.flatnonzero(rows.any(axis=1)):
            out[k] = self.value(obs[k], rows[k])
        return out

    def _value_static(self, obs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """:meth:`value` of the ``rows`` of ``obs`` on the static act path: the forward
        queued on the device, its result copied back through pinned memory, one wait."""
        out = np.zeros(len(obs), dtype=np.float32)
        picked = np.flatnonzero(rows)
        if not len(picked):
            return out
        cuda = self.device.type == "cuda"
        x = torch.from_numpy(np.ascontiguousarray(np.asarray(obs)[picked]))
        if x.is_floating_point() and x.dtype != torch.float32:
            x = x.float()
        with torch.cuda.device(self.device) if cuda else contextlib.nullcontext():
            if cuda:
                x = x.pin_memory()  # a pageable copy would wait for the device's queue
            v = self.model.value(x.to(self.device, non_blocking=True)).float().reshape(-1)
            host = torch.empty(v.shape, dtype=torch.float32, pin_memory=cuda)
            host.copy_(v, non_blocking=True)
            if cuda:
                torch.cuda.current_stream().synchronize()
        out[picked] = host.numpy()
        return out
