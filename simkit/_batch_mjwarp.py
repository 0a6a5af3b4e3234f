"""The ``"mjwarp"`` backend of :class:`simkit.BatchMujocoEnv`: N worlds on MuJoCo Warp.

MuJoCo Warp (``mujoco_warp``, over NVIDIA Warp) keeps all N worlds in one
:class:`mujoco_warp.Data` with ``nworld = N`` and steps them with one set of kernel
launches, on a CUDA device or on Warp's CPU backend. :class:`MjWarpPhysics` holds that
data and the model on the batch's torch device and exposes its arrays to torch without
copies (``wp.to_torch``), so observations, rewards and flags are computed by torch
where the physics lives.

- Randomized ``model_fields`` become per-world rows of MJWarp's batched model arrays
  (fields MJWarp indexes as ``field[world % rows]``): each is tiled to N rows at
  construction and a reset writes its worlds' rows from the nominal model and their
  parameters (the :class:`~simkit.ModelField` ops of :func:`simkit._mujoco.write_model_fields`).
- Snapshots are the worlds' rows of every ``Data`` array that an ``mj_step`` reads
  before writing (:data:`STATE_FIELDS`: ``mjSTATE_INTEGRATION``'s fields, solver
  warm-start included), as MJWarp stores them (float32): restoring them continues bit
  for bit (tests/test_batch_mjwarp.py).
- The ``frame_skip`` physics steps are captured once as a Warp graph and replayed (a
  CUDA graph on a GPU); on CUDA Warp runs on its own stream, ordered after and before
  the torch stream by stream waits (no host synchronisation).

MJWarp computes in float32, so it is not bit-equal to MuJoCo's C engine (float64):
docs/batch_device.md states the measured divergence over 1,000 Cheetah steps.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from simkit._batch import BatchEnv, Physics
from simkit._batch_rows import RefusedRows
from simkit._mujoco import ModelField, mujoco
from simkit._optional import require
from simkit.errors import InvalidState
from simkit.randomization import Params

__all__ = ["STATE_FIELDS", "MjWarpPhysics"]

STATE_FIELDS = (
    "time",
    "qpos",
    "qvel",
    "act",
    "qacc_warmstart",
    "ctrl",
    "qfrc_applied",
    "xfrc_applied",
    "eq_active",
    "mocap_pos",
    "mocap_quat",
    "userdata",
    "plastic",
    "history",
)
"""``mujoco_warp.Data`` arrays that make up a world's state (those present and non-empty
for the model): what ``mj_step`` reads before it writes, as in ``mjSTATE_INTEGRATION``."""


class MjWarpPhysics(Physics):
    """N worlds of one ``MjModel`` in MuJoCo Warp on a torch device: the ``"mjwarp"``
    backend of :class:`simkit.BatchMujocoEnv`, which steps every world at once.

    Args:
        model: the nominal ``MjModel``.
        num_worlds: N.
        frame_skip: physics steps per :meth:`step`.
        model_fields: the randomized fields, made per-world.
        nominal: each field's nominal value (``MjModel`` dtype and shape).
        batch_fields: the ``Data`` arrays :attr:`batch` views.
        device: the torch device (``cpu`` runs Warp's CPU backend).
    """

    subsets = False

    def __init__(
        self,
        model: mujoco.MjModel,
        num_worlds: int,
        frame_skip: int,
        model_fields: Mapping[str, ModelField],
        nominal: dict[str, np.ndarray],
        batch_fields: tuple[str, ...],
        device: Any,
    ) -> None:
        import torch

        wp = require("warp", extra="gpu", purpose="BatchMujocoEnv backend='mjwarp'")
        mjw = require("mujoco_warp", extra="gpu", purpose="BatchMujocoEnv backend='mjwarp'")
        self.wp, self.mjw, self.torch = wp, mjw, torch
        self.n = num_worlds
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        index = 0 if self.device.index is None else self.device.index
        self.wp_device = f"cuda:{index}" if self.cuda else "cpu"
        self.frame_skip = frame_skip
        self.model_fields, self.nominal = model_fields, nominal
        self.models = [model] * num_worlds  # the per-world fields live in MuJoCo Warp
        self.datas = _NoDatas(num_worlds)
        self._graph: Any = None
        self._graphs = True  # whether to capture the step as a graph
        self._stepped = False
        self._streams: dict[int, Any] = {}  # torch stream handle -> its Warp stream
        with wp.ScopedDevice(self.wp_device):
            self.m = mjw.put_model(model)
            self.d = mjw.make_data(model, nworld=num_worlds)
            self._fields: dict[str, Any] = {}  # attribute -> (N, *MjModel shape) view
            for field in model_fields.values():
                if field.attribute in self._fields:
                    continue
                *path, name = field.attribute.split(".")  # "body_mass", "opt.gravity"
                owner = functools.reduce(getattr, path, self.m)
                arr = getattr(owner, name)
                base = np.asarray(nominal[field.attribute])
                rows = np.repeat(arr.numpy()[:1], num_worlds, axis=0)
                tiled = wp.array(rows, dtype=arr.dtype)
                tiled._is_batched = True  # what mujoco_warp.put_model marks batched fields
                setattr(owner, name, tiled)
                view = wp.to_torch(tiled)
                if view[0].numel() != base.size:
                    raise ValueError(
                        f"model field {field.attribute!r} has {base.size} values in MuJoCo "
                        f"and {view[0].numel()} per world in MuJoCo Warp"
                    )
                self._fields[field.attribute] = view.view(num_worlds, *base.shape)
            present = [(name, getattr(self.d, name, None)) for name in STATE_FIELDS]
            self.views: dict[str, Any] = {
                name: wp.to_torch(arr) for name, arr in present if arr is not None and arr.size
            }
        self._mask = torch.zeros(num_worlds, dtype=torch.bool, device=self.device)
        self._mask_wp = wp.from_torch(self._mask, dtype=wp.bool)
        self.batch = {name: self.view(name) for name in batch_fields}
        self.derived = bool(set(batch_fields) - {"qpos", "qvel", "act", "ctrl"})
        """Whether :attr:`batch` views derived fields, which only a forward refreshes."""

    # ------------------------------------------------------------------ data views

    def view(self, name: str) -> Any:
        """``(N, ...)`` torch view of the ``Data`` array ``name`` (no copy, float32)."""
        view = self.views.get(name)
        if view is None:
            arr = getattr(self.d, name, None)
            if arr is None or not hasattr(arr, "shape"):
                raise ValueError(f"mujoco_warp.Data has no array {name!r}")
            view = self.views[name] = self.wp.to_torch(arr)
        return view

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        with self.wp.ScopedDevice(self.wp_device):
            if not self.cuda:
                yield
                return
            # Warp's stream waits for torch's work and torch's for Warp's: ordered, no sync.
            wp, torch = self.wp, self.torch
            current = torch.cuda.current_stream(self.device)
            theirs = self._streams.get(current.cuda_stream)
            if theirs is None:
                theirs = self._streams[current.cuda_stream] = wp.stream_from_torch(current)
            ours = wp.get_stream(self.wp_device)
            ours.wait_stream(theirs)
            yield
            theirs.wait_stream(ours)

    # --------------------------------------------------------------------- physics

    def do_simulation(self, ctrl: Any, ids: np.ndarray | None) -> None:
        """Writes every world's controls (as float32) and steps them ``frame_skip`` times."""
        if ids is not None and len(ids) != self.n:
            raise NotImplementedError("backend='mjwarp' steps every world at once")
        view = self.views["ctrl"]
        view.copy_(self.torch.as_tensor(ctrl, device=self.device).to(view.dtype))
        self.step()

    def step(self) -> None:
        """``frame_skip`` MJWarp steps of every world: the first launched one by one
        (it compiles the kernels), the next captured once as a Warp graph and the graph
        replayed from then on (a CUDA graph on a GPU; on the CPU Warp replays the
        recorded launches in C++ instead of launching each kernel from Python, with the
        same bits)."""
        wp, mjw = self.wp, self.mjw
        with self._on_device():
            if self._stepped and self._graph is None and self._graphs:
                try:
                    with wp.ScopedCapture(self.wp_device) as capture:
                        for _ in range(self.frame_skip):
                            mjw.step(self.m, self.d)
                    self._graph = capture.graph
                except Exception:
                    if self.cuda:
                        raise
                    self._graphs = False  # a Warp without CPU graphs: launch each step
            if self._graph is not None:
                wp.capture_launch(self._graph)
            else:
                for _ in range(self.frame_skip):
                    mjw.step(self.m, self.d)
        self._stepped = True

    def forward(self, ids: np.ndarray) -> None:
        """``mj_forward`` of every world, when :attr:`batch` views derived fields (the
        state does not change)."""
        if self.derived:
            with self._on_device():
                self.mjw.forward(self.m, self.d)

    def prepare(self, env: BatchEnv, ids: np.ndarray, params: Sequence[Params]) -> None:
        """``mj_resetData`` of the worlds ``ids`` (the others keep their state), then
        their rows of every randomized field: the nominal value and each
        :class:`~simkit.ModelField` op with the world's parameter, in float64, stored as
        MJWarp's float32."""
        torch = self.torch
        idx = torch.as_tensor(ids, device=self.device)
        self._mask.zero_()
        self._mask[idx] = True
        with self._on_device():
            self.mjw.reset_data(self.m, self.d, reset=self._mask_wp)
        if not self.model_fields:
            return
        nominal, rows = self.nominal, [params[k] for k in range(len(ids))]
        rows_of = {
            attr: np.broadcast_to(nominal[attr], (len(ids), *nominal[attr].shape)).copy()
            for attr in self._fields
        }
        for name, field in self.model_fields.items():
            target = rows_of[field.attribute]
            sub = field.index if isinstance(field.index, tuple) else (field.index,)
            index = (slice(None), *sub)
            base = np.asarray(nominal[field.attribute])[index[1:]]
            value = np.array([row[name] for row in rows], dtype=np.float64)
            extra = np.ndim(base) - (value.ndim - 1)  # broadcast against (rows, *shape)
            if extra > 0:
                value = value.reshape(value.shape[0], *value.shape[1:], *([1] * extra))
            if field.op == "scale":
                target[index] = base * value
            elif field.op == "add":
                target[index] = base + value
            else:
                target[index] = value
        for attr, view in self._fields.items():
            view[idx] = torch.as_tensor(rows_of[attr], device=self.device).to(view.dtype)

    def set_qpos_qvel(self, ids: np.ndarray, qpos: Any, qvel: Any) -> None:
        """Sets the worlds ``ids``' ``qpos`` and ``qvel`` (rows per id), then :meth:`forward`."""
        idx = self.torch.as_tensor(ids, device=self.device)
        for name, rows in (("qpos", qpos), ("qvel", qvel)):
            view = self.views[name]
            view[idx] = self.torch.as_tensor(rows, device=self.device).to(view.dtype)
        self.forward(ids)

    # ------------------------------------------------------------------- snapshots

    def get_state(self) -> dict[str, Any]:
        """Every world's state arrays (:data:`STATE_FIELDS`), host copies."""
        return {"mjwarp": {name: view.cpu().numpy().copy() for name, view in self.views.items()}}

    def set_state(self, env: BatchEnv, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state`'s arrays into worlds whose randomized fields are
        those of ``env``'s parameters.

        Raises:
            InvalidState: not the arrays :meth:`get_state` gives, by name, shape and dtype.
        """
        arrays = state.get("mjwarp") if isinstance(state, Mapping) else None
        problem = _state_problem(arrays, self.views)
        if problem is not None:
            raise InvalidState(f"backend='mjwarp' physics state must be {problem}")
        assert arrays is not None
        ids = np.arange(self.n, dtype=np.int64)
        self.prepare(env, ids, env.params if self.model_fields else [])
        for name, view in self.views.items():
            view.copy_(self.torch.as_tensor(arrays[name], device=self.device))
        self.forward(ids)


def _state_problem(state: Any, views: Mapping[str, Any]) -> str | None:
    """Why ``state`` cannot be restored into ``views`` (``None`` if it can)."""
    if not isinstance(state, Mapping):
        return f"a mapping of MuJoCo Warp arrays, got {type(state).__name__}"
    for name, view in views.items():
        arr = state.get(name)
        want = (tuple(view.shape), str(view.dtype).removeprefix("torch."))
        if not isinstance(arr, np.ndarray) or (arr.shape, str(arr.dtype)) != want:
            got = (arr.shape, str(arr.dtype)) if isinstance(arr, np.ndarray) else type(arr).__name__
            return f"{name!r} as an array of shape and dtype {want}, got {got}"
    extra = set(state) - set(views)
    if extra:
        return f"only the arrays {sorted(views)}, got also {sorted(extra)}"
    return None


class _NoDatas(RefusedRows[mujoco.MjData]):
    """``self.datas`` of the ``"mjwarp"`` backend: N instances, none with an ``MjData``
    (the worlds live in MuJoCo Warp); reading one says what to use instead."""

    error = TypeError
    message = (
        "backend='mjwarp' keeps the worlds in MuJoCo Warp, not in per-instance MjData: "
        "set the start state with set_qpos_qvel(ids, qpos, qvel) and read self.batch"
    )
