"""``simkit.BatchMujocoEnv``: N instances of one MJCF model as a :class:`BatchEnv`.

Every backend steps each instance with ``mj_step`` exactly as :class:`simkit.MujocoEnv`
steps its one instance, solver warm-start included, so a batch is bit for bit N single
instances whichever backend runs it:

- ``"native"`` (the default where ``mujoco.batch`` exists, MuJoCo >= 4.0): the
  instances' ``mjSTATE_INTEGRATION`` rows, which include ``qacc_warmstart``, stepped by
  ``mujoco.batch.Batch.step`` on MuJoCo's own threads in one GIL-free call per batch:
  no Python between instances, and :meth:`BatchEnv.send` runs that call on a
  background thread so the caller's Python overlaps the physics.
- ``"threads"``: a thread pool steps each instance's own ``MjData`` (``mj_step``
  releases the GIL); workers take instances from a shared counter, so a core slowed by
  other load takes fewer of them.
- ``"pooled"``: the same pool steps one scratch ``MjData`` per worker, loading and
  saving each instance's state row around ``mj_step`` as ``mujoco.rollout`` does.
- ``"loop"``: one thread, each instance's own ``MjData``.
- ``"mjwarp"`` (what ``"auto"`` picks with a CUDA ``device``): all N worlds in MuJoCo
  Warp on the batch's torch device (:mod:`simkit._batch_mjwarp`), observations, rewards
  and flags as torch tensors there; float32, so not bit-equal to the others (measured
  in docs/batch_device.md). Needs the ``simkit[gpu]`` extra.

``mujoco.rollout`` itself cannot hand back the warm-start, so it could not be
bit-identical to ``mj_step`` stepped an env step at a time (see docs/batch.md).
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from simkit._batch import BatchEnv, PendingStep
from simkit._batch_mjwarp import MjWarpPhysics
from simkit._batch_queue import RefusedRows
from simkit._mujoco import (  # first: says what MUJOCO_GL lacks if MuJoCo will not load
    PHYSICS_STATE,
    ModelField,
    _load_model,
    _resolve,
    mujoco,
    write_model_fields,
)
from simkit.errors import InvalidState
from simkit.randomization import Params

try:
    from mujoco.batch import Batch as _NativeBatch
except ImportError:  # MuJoCo < 4.0
    _NativeBatch = None

__all__ = ["BatchMujocoEnv"]

Backend = Literal["auto", "native", "threads", "pooled", "loop", "mjwarp"]
_BACKENDS = ("auto", "native", "threads", "pooled", "loop", "mjwarp")
StepResult = tuple[Any, Any, Any, list[dict[str, Any]] | None]


class BatchMujocoEnv(BatchEnv):
    """N instances of one MJCF model, each stepped ``frame_skip`` times per env step.

    Authors declare ``randomization``/``model_fields`` as for :class:`simkit.MujocoEnv`
    and implement :meth:`reset_instances`: for each ``i`` in ``ids``, ``self.datas[i]``
    has just been reset with ``mj_resetData``; set its ``qpos``/``qvel`` from ``rngs[k]``
    (in the order the single-instance env draws) and call :meth:`forward` ``(ids)``.
    The step is written either way:

    - split hooks (preferred): :meth:`before_physics` and :meth:`after_physics` over
      any sorted subset ``ids``, reading :attr:`batch` rows. The base class then runs
      the physics between them, steps any subset (:meth:`BatchEnv.send` with
      ``env_ids``, ``batch_size < num_envs``) and, on the native backend, runs the
      physics in the background between :meth:`BatchEnv.send` and :meth:`BatchEnv.recv`;
    - ``step_instances``: call :meth:`do_simulation` ``(ctrl)`` then compute all N
      observations and rewards from :attr:`batch` (whole batches only).

    :attr:`batch` holds ``(N, ...)`` arrays of the ``MjData`` fields named in
    ``batch_fields``, refreshed after every step and :meth:`forward`. Derived fields
    (not part of the state, e.g. ``xpos``) are, as after ``mj_step``, those of the
    last substep's start, and must be ones ``mj_step`` computes.

    Args:
        model: path to an MJCF file, an MJCF XML string, or an ``MjModel``.
        num_envs: N.
        frame_skip: physics steps per env step.
        backend: ``"auto"`` (the default: ``"mjwarp"`` with a CUDA ``device``, else
            ``"native"`` where ``mujoco.batch`` exists, else ``"threads"``),
            ``"native"``, ``"threads"``, ``"pooled"``, ``"loop"`` or ``"mjwarp"``; see
            the module docstring. The first four give bit-identical results. With
            ``"native"`` and ``"pooled"`` the physics lives in state rows and
            ``self.datas[i]`` is only current inside ``reset_instances``; with
            ``"mjwarp"`` (a torch batch, on ``device`` or the CPU) it lives in MuJoCo
            Warp, there are no ``self.datas`` and resets set the start state with
            :meth:`set_qpos_qvel`.
        nthread: physics threads; defaults to the CPU count (at most N).
        **kwargs: passed to :class:`simkit.BatchEnv` (spaces, params, batch_size, ...).
    """

    model_fields: ClassVar[Mapping[str, ModelField]] = {}
    state_attributes: ClassVar[tuple[str, ...] | None] = ()
    batch_fields: ClassVar[tuple[str, ...]] = ("qpos", "qvel")
    """``MjData`` arrays copied into :attr:`batch` after every step and forward."""

    def __init__(
        self,
        model: str | Path | mujoco.MjModel,
        num_envs: int,
        *,
        frame_skip: int = 1,
        backend: Backend = "auto",
        nthread: int | None = None,
        **kwargs: Any,
    ) -> None:
        backend = resolve_backend(backend, kwargs.get("device"))
        if backend == "mjwarp" and kwargs.get("device") is None:
            kwargs["device"] = "cpu"  # MJWarp on Warp's CPU backend, torch tensors
        super().__init__(num_envs, **kwargs)
        if isinstance(frame_skip, bool) or not isinstance(frame_skip, int) or frame_skip < 1:
            raise ValueError(f"frame_skip must be a positive int, got {frame_skip!r}")
        if backend not in _BACKENDS:
            raise ValueError(
                "backend must be 'auto', 'native', 'threads', 'pooled', 'loop' or 'mjwarp', "
                f"got {backend!r}"
            )
        if backend == "native" and _NativeBatch is None:
            raise ValueError(
                "backend='native' needs mujoco.batch (MuJoCo >= 4.0), "
                f"got mujoco {mujoco.__version__}"
            )
        if nthread is not None and (
            isinstance(nthread, bool) or not isinstance(nthread, int) or nthread < 1
        ):
            raise ValueError(f"nthread must be a positive int or None, got {nthread!r}")
        unknown = set(self.model_fields) - set(self.randomization)
        if unknown:
            raise ValueError(
                f"model_fields {sorted(unknown)} have no distribution in randomization"
            )
        self.model = _load_model(model)
        self.frame_skip = frame_skip
        self.backend = backend
        n = self.num_envs
        self._nominal = {
            f.attribute: np.array(_resolve(self.model, f.attribute), copy=True)
            for f in self.model_fields.values()
        }
        self._state_size = mujoco.mj_stateSize(self.model, PHYSICS_STATE)
        self.models: list[mujoco.MjModel]
        self.datas: Sequence[mujoco.MjData]
        self.batch: dict[str, Any]
        """``batch_fields`` as ``(N, ...)`` arrays: float64 numpy copies, or with
        ``"mjwarp"`` torch views of MuJoCo Warp's float32 arrays."""
        self._warp: MjWarpPhysics | None = None
        if backend == "mjwarp":
            if type(self).apply_params is not BatchMujocoEnv.apply_params:
                raise ValueError(
                    f"{type(self).__name__} overrides apply_params(); backend='mjwarp' writes "
                    "model_fields into MuJoCo Warp's per-world arrays and cannot run it"
                )
            self._warp = MjWarpPhysics(
                self.model, n, self.device, self.model_fields, self._nominal, frame_skip
            )
            self.models = [self.model] * n  # the per-world fields live in MuJoCo Warp
            self.datas = _NoDatas(n)
            self.batch = {name: self._warp.view(name) for name in self.batch_fields}
            self._derived = bool(set(self.batch_fields) - {"qpos", "qvel", "act", "ctrl"})
        else:
            self.models = (
                [copy.deepcopy(self.model) for _ in range(n)]
                if self.model_fields
                else [self.model] * n
            )
            self.datas = [mujoco.MjData(m) for m in self.models]
            self.batch = {
                name: np.zeros((n, *np.shape(getattr(self.datas[0], name))), dtype=np.float64)
                for name in self.batch_fields
            }
        self._slices = _state_slices(self.model)
        workers = 1 if backend in ("loop", "mjwarp") else min(nthread or os.cpu_count() or 1, n)
        self._workers = workers
        self._rows = backend in ("native", "pooled")  # the state rows hold the physics
        self._native: Any = None
        self._outputs: dict[str, np.ndarray] = {}
        if backend == "native":
            assert _NativeBatch is not None
            self._native = _NativeBatch(self.model, n, nthread=workers)
            self._native.set_models(self.models if self.model_fields else self.model)
            self._states: np.ndarray = self._native.state  # the live rows MuJoCo steps
            # Bound once here: binding registers an output, a Batch call of its own.
            self._outputs = {
                f: self._native.bind(f) for f in self.batch_fields if f not in self._slices
            }
        else:
            self._states = np.zeros((n, self._state_size), dtype=np.float64)
        self._models_dirty = False
        self._scratch = (
            [mujoco.MjData(self.model) for _ in range(workers)] if backend == "pooled" else []
        )
        # Fields the pool copies out of an MjData per instance (the rest come from rows).
        self._row_fields = [f for f in self.batch_fields if not (self._rows and f in self._slices)]
        self._pool = (
            ThreadPoolExecutor(workers - 1, thread_name_prefix="simkit-physics")
            if workers > 1 and self._native is None
            else None
        )
        self._stepper: ThreadPoolExecutor | None = None  # native send(): one FIFO thread
        self._split = type(self).after_physics is not BatchMujocoEnv.after_physics

    @property
    def dt(self) -> float:
        """Simulated seconds per env step."""
        return float(self.model.opt.timestep) * self.frame_skip

    def apply_params(self, model: mujoco.MjModel, params: Params) -> None:
        """Writes one instance's parameters into its model; override for custom fields."""
        write_model_fields(model, self.model_fields, self._nominal, params)

    def _restore_model(self, i: int) -> None:
        if not self.model_fields or self._warp is not None:
            return
        model = self.models[i]
        for attribute, nominal in self._nominal.items():
            _resolve(model, attribute)[...] = nominal
        self.apply_params(model, self._param_row(i))
        self._models_dirty = True

    # ------------------------------------------------------------ split step hooks

    def before_physics(self, ids: np.ndarray, actions: Any) -> Any:
        """Runs before the physics of instances ``ids`` (sorted int64).

        Returns:
            What :meth:`after_physics` needs from before the step, e.g. a copy of
            ``self.batch["qpos"][ids, 0]``; ``None`` by default.
        """
        del ids, actions

    def after_physics(
        self, ids: np.ndarray, actions: Any, before: Any, rngs: Sequence[np.random.Generator]
    ) -> StepResult:
        """Results of instances ``ids`` (sorted int64) after their physics step.

        Implementing it (with :meth:`before_physics`) replaces ``step_instances``.
        ``actions`` has one row per id, ``rngs[k]`` belongs to ``ids[k]``, and the
        new physics is in ``self.batch[name][ids]``.

        Returns:
            ``(obs, reward, terminated, infos)`` with ``len(ids)`` rows.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement after_physics()")

    def step_instances(self, actions: Any, rngs: Sequence[np.random.Generator]) -> StepResult:
        """All N instances through the split hooks, when the author wrote those."""
        if not self._split:
            return super().step_instances(actions, rngs)
        return self.step_subset(np.arange(self.num_envs, dtype=np.int64), actions, rngs)

    def step_subset(
        self, ids: np.ndarray, actions: Any, rngs: Sequence[np.random.Generator]
    ) -> StepResult:
        """``before_physics``, :meth:`do_simulation` and ``after_physics`` on ``ids``."""
        if not self._split:
            return super().step_subset(ids, actions, rngs)
        before = self.before_physics(ids, actions)
        self.do_simulation(actions, ids)
        return self.after_physics(ids, actions, before, rngs)

    def _host_known_resets(self) -> bool:
        """Only ``"mjwarp"``: the other backends compute on the host anyway."""
        return self._warp is not None and super()._host_known_resets()

    def _supports_subset(self) -> bool:
        if self._warp is not None:
            return False  # MuJoCo Warp steps every world at once
        return self._split or type(self).step_subset is not BatchMujocoEnv.step_subset

    def _start_subset(self, ids: np.ndarray, actions: Any) -> PendingStep:
        if not (self._split and self._native is not None):
            return super()._start_subset(ids, actions)  # runs whole in recv()
        rngs = self._streams.rows(ids)
        before = self.before_physics(ids, actions)
        sub = self._write_ctrl(np.asarray(actions), ids)
        if self._stepper is None:
            self._stepper = ThreadPoolExecutor(1, thread_name_prefix="simkit-batch")
        # The task holds the Batch, not the env, so a dropped env is still collected.
        fut: Future[None] = self._stepper.submit(
            _native_step, self._native, sub, self.frame_skip, self._take_models()
        )

        def finish() -> StepResult:
            fut.result()
            self._rows_from_states(sub)
            return self.after_physics(ids, actions, before, rngs)

        return PendingStep(finish=finish, drain=fut.exception)

    # ------------------------------------------------------------------- physics

    def _prepare_instances(self, ids: np.ndarray) -> None:
        if self._warp is not None:
            self._warp.reset(ids)
            if self.model_fields:
                rows = [self._param_row(i) for i in ids.tolist()]
                values = {
                    name: np.array([row[name] for row in rows], dtype=np.float64)
                    for name in self.model_fields
                }
                self._warp.write_fields(ids, self.model_fields, self._nominal, values)
            return
        for i in ids.tolist():
            mujoco.mj_resetData(self.models[i], self.datas[i])
            self._restore_model(i)

    def set_qpos_qvel(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        """Sets the start state of instances ``ids`` (in ``reset_instances``, rows per
        id) and runs :meth:`forward`: on every backend, the way to write a reset that
        also runs on ``"mjwarp"`` (which has no ``self.datas``)."""
        if self._warp is not None:
            self._warp.set_qpos_qvel(ids, qpos, qvel)
            self.forward(ids)
            return
        for k, i in enumerate(np.asarray(ids).tolist()):
            self.datas[i].qpos[:] = qpos[k]
            self.datas[i].qvel[:] = qvel[k]
        self.forward(ids)

    def forward(self, ids: np.ndarray) -> None:
        """``mj_forward`` on instances ``ids`` (after setting qpos/qvel); refreshes
        :attr:`batch` (``"mjwarp"``: only when ``batch_fields`` hold derived fields, and
        then of every world, whose state it does not change)."""
        if self._warp is not None:
            if self._derived:
                self._warp.forward()
            return
        for i in np.asarray(ids).tolist():
            d = self.datas[i]
            mujoco.mj_forward(self.models[i], d)
            for name, buf in self.batch.items():
                buf[i] = getattr(d, name)
            if self._rows:
                mujoco.mj_getState(self.models[i], d, self._states[i], PHYSICS_STATE)

    def do_simulation(self, ctrl: np.ndarray, ids: np.ndarray | None = None) -> None:
        """Sets the instances' ``ctrl`` and advances them ``frame_skip`` physics steps.

        Args:
            ctrl: ``(len(ids), nu)`` controls, row ``k`` for instance ``ids[k]``.
            ids: the instances to step, sorted (default all N; ``ctrl`` then has N rows).
        """
        if self._warp is not None:
            if ids is not None and len(ids) != self.num_envs:
                raise NotImplementedError("backend='mjwarp' steps every world at once")
            self._warp.set_ctrl(ctrl)
            self._warp.step()
            return
        ctrl = np.asarray(ctrl)
        if self._native is not None:
            sub = self._write_ctrl(ctrl, ids)
            _native_step(self._native, sub, self.frame_skip, self._take_models())
            self._rows_from_states(sub)
            return
        order = list(range(self.num_envs)) if ids is None else np.asarray(ids).tolist()
        if self._rows:
            self._write_ctrl(ctrl, ids)
        run = self._run_pooled if self._rows else self._run_worker
        counter = itertools.count()
        futures: list[Future[None]] = []
        if self._pool is not None:
            futures = [
                self._pool.submit(run, w, counter, order, ctrl)
                for w in range(1, min(self._workers, len(order)))
            ]
        try:
            run(0, counter, order, ctrl)
        finally:
            for fut in futures:
                fut.result()
        if self._rows:
            self._rows_from_states(None if ids is None else np.asarray(ids))

    def _write_ctrl(self, ctrl: np.ndarray, ids: np.ndarray | None) -> np.ndarray | None:
        """Writes ``ctrl`` into the state rows; returns ``ids`` or ``None`` for all."""
        if ids is None or len(ids) == self.num_envs:
            self._states[:, self._slices["ctrl"]] = ctrl
            return None
        sub = np.asarray(ids, dtype=np.int64)
        self._states[sub, self._slices["ctrl"]] = ctrl
        return sub

    def _take_models(self) -> list[mujoco.MjModel] | None:
        """The models to hand the native Batch again if a reset edited them
        (``mujoco.batch`` asks for ``set_models`` after an edit), else ``None``."""
        if not self._models_dirty:
            return None
        self._models_dirty = False
        return self.models

    def _run_pooled(
        self, worker: int, counter: Iterator[int], order: list[int], ctrl: np.ndarray
    ) -> None:
        del ctrl  # already in the state rows
        models, states, nstep, count = self.models, self._states, self.frame_skip, len(order)
        d = self._scratch[worker]
        bufs = [(name, self.batch[name]) for name in self._row_fields]
        for k in counter:  # next() on itertools.count is atomic under the GIL
            if k >= count:
                return
            i = order[k]
            m = models[i]
            mujoco.mj_setState(m, d, states[i], PHYSICS_STATE)  # ctrl is in the row
            mujoco.mj_step(m, d, nstep=nstep)
            mujoco.mj_getState(m, d, states[i], PHYSICS_STATE)
            for name, buf in bufs:
                buf[i] = getattr(d, name)

    def _run_worker(
        self, worker: int, counter: Iterator[int], order: list[int], ctrl: np.ndarray
    ) -> None:
        del worker
        models, datas, nstep, count = self.models, self.datas, self.frame_skip, len(order)
        bufs = list(self.batch.items())
        step = mujoco.mj_step
        for k in counter:
            if k >= count:
                return
            i = order[k]
            d = datas[i]
            d.ctrl[:] = ctrl[k]
            step(models[i], d, nstep=nstep)
            for name, buf in bufs:
                buf[i] = getattr(d, name)

    def _rows_from_states(self, ids: np.ndarray | None) -> None:
        """Copies ``batch_fields`` of ``ids`` (all if ``None``) out of the state rows and,
        for ``"native"``, MuJoCo's bound derived fields, vectorised."""
        for name, buf in self.batch.items():
            sl = self._slices.get(name)
            if sl is not None:
                src = self._states[:, sl].reshape(buf.shape)
            elif name in self._outputs:
                src = self._outputs[name]
            else:
                continue  # copied per instance by the pool
            if ids is None:
                buf[...] = src
            else:
                buf[ids] = src[ids]

    # ------------------------------------------------------------------ snapshots

    def get_env_state(self) -> dict[str, Any]:
        if self._warp is not None:
            return {"mjwarp": self._warp.get_state(), "extra": super().get_env_state()}
        if self._rows:
            return {"physics": self._states.copy(), "extra": super().get_env_state()}
        physics = np.empty((self.num_envs, self._state_size), dtype=np.float64)
        for i, d in enumerate(self.datas):
            mujoco.mj_getState(self.models[i], d, physics[i], PHYSICS_STATE)
        return {"physics": physics, "extra": super().get_env_state()}

    def set_env_state(self, state: Mapping[str, Any]) -> None:
        if self._warp is not None:
            arrays = state.get("mjwarp") if isinstance(state, Mapping) else None
            problem = self._warp.check_state(arrays)
            if problem is not None:
                raise InvalidState(f"backend='mjwarp' physics state must be {problem}")
            assert arrays is not None
            ids = np.arange(self.num_envs, dtype=np.int64)
            self._prepare_instances(ids)  # every world's randomized fields from its params
            self._warp.set_state(arrays)
            self.forward(ids)
            super().set_env_state(state.get("extra", {}))
            return
        physics = state.get("physics") if isinstance(state, Mapping) else None
        shape = (self.num_envs, self._state_size)
        if not isinstance(physics, np.ndarray) or physics.shape != shape:
            got = getattr(physics, "shape", type(physics).__name__)
            raise InvalidState(
                f"MuJoCo batch physics state must be a float64 array of shape {shape}, got {got}"
            )
        physics = physics.astype(np.float64)
        for i, d in enumerate(self.datas):
            self._restore_model(i)
            mujoco.mj_setState(self.models[i], d, physics[i], PHYSICS_STATE)
        self.forward(np.arange(self.num_envs))
        super().set_env_state(state.get("extra", {}))

    def close_extras(self, **kwargs: Any) -> None:
        """Waits out background physics, then stops the physics threads."""
        if self._in_flight.any():
            self._abort_async()
        for pool in (self._stepper, self._pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._stepper = self._pool = None


class _NoDatas(RefusedRows[mujoco.MjData]):
    """``self.datas`` of the ``"mjwarp"`` backend: N instances, none with an ``MjData``
    (the worlds live in MuJoCo Warp); reading one says what to use instead."""

    error = TypeError
    message = (
        "backend='mjwarp' keeps the worlds in MuJoCo Warp, not in per-instance MjData: "
        "set the start state with set_qpos_qvel(ids, qpos, qvel) and read self.batch"
    )


def resolve_backend(backend: Backend, device: Any) -> Backend:
    """The backend ``backend="auto"`` means on ``device`` (a torch device, its name or
    None): MJWarp on a CUDA device, else ``mujoco.batch`` (``"native"``) where MuJoCo has
    it, else ``"threads"``; any other value as given."""
    if backend != "auto":
        return backend
    if _is_cuda(device):
        return "mjwarp"
    return "native" if _NativeBatch is not None else "threads"


def _is_cuda(device: Any) -> bool:
    """Whether ``device`` (a torch device or its name) is a CUDA device."""
    if device is None:
        return False
    return str(getattr(device, "type", device)).split(":")[0] == "cuda"


def _native_step(
    batch: Any, ids: np.ndarray | None, nstep: int, models: list[mujoco.MjModel] | None
) -> None:
    """One ``mujoco.batch`` step of ``ids`` (all if ``None``), re-setting edited models."""
    if models is not None:
        batch.set_models(models)
    batch.step(ids, nstep)


def _state_slices(model: mujoco.MjModel) -> dict[str, slice]:
    """Where ``qpos``, ``qvel`` and ``ctrl`` sit in an ``mjSTATE_INTEGRATION`` vector."""
    spec = int(PHYSICS_STATE)
    offset = 0
    out: dict[str, slice] = {}
    names = {2: "qpos", 4: "qvel", 64: "ctrl"}
    bit = 1
    while bit <= spec:
        if spec & bit:
            size = mujoco.mj_stateSize(model, bit)
            if bit in names:
                out[names[bit]] = slice(offset, offset + size)
            offset += size
        bit <<= 1
    return out
