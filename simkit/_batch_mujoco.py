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

Each backend is a :class:`~simkit._batch.Physics` kept in the batch's private state
(:class:`MujocoPhysics` for the first four, :class:`~simkit._batch_mjwarp.MjWarpPhysics`),
so an author's subclass has every name but the base class's reserved ones.
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

from simkit._batch import BatchEnv, PendingStep, Physics, StepResult
from simkit._batch_mjwarp import MjWarpPhysics
from simkit._mujoco import (  # first: says what MUJOCO_GL lacks if MuJoCo will not load
    PHYSICS_STATE,
    ModelField,
    _load_model,
    _resolve,
    mujoco,
    write_model_fields,
)
from simkit._seeding import KeyedStreams
from simkit.errors import InvalidState
from simkit.randomization import Params

try:
    from mujoco.batch import Batch as _NativeBatch
except ImportError:  # MuJoCo < 4.0
    _NativeBatch = None

__all__ = ["BatchMujocoEnv"]

Backend = Literal["auto", "native", "threads", "pooled", "loop", "mjwarp"]
_BACKENDS = ("auto", "native", "threads", "pooled", "loop", "mjwarp")


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
        nominal = {
            f.attribute: np.array(_resolve(self.model, f.attribute), copy=True)
            for f in self.model_fields.values()
        }
        self.__split = type(self).after_physics is not BatchMujocoEnv.after_physics
        physics: MujocoPhysics | MjWarpPhysics
        if backend == "mjwarp":
            if type(self).apply_params is not BatchMujocoEnv.apply_params:
                raise ValueError(
                    f"{type(self).__name__} overrides apply_params(); backend='mjwarp' writes "
                    "model_fields into MuJoCo Warp's per-world arrays and cannot run it"
                )
            fields = self.model_fields
            physics = MjWarpPhysics(
                self.model, num_envs, frame_skip, fields, nominal, self.batch_fields, self.device
            )
        else:
            physics = MujocoPhysics(self, nominal, backend, nthread, self.__split)
        self.models: list[mujoco.MjModel] = physics.models
        self.datas: Sequence[mujoco.MjData] = physics.datas
        self.batch: dict[str, Any] = physics.batch
        """``batch_fields`` as ``(N, ...)`` arrays: float64 numpy copies, or with
        ``"mjwarp"`` torch views of MuJoCo Warp's float32 arrays."""
        self.__physics = self._simkit.physics = physics

    @property
    def dt(self) -> float:
        """Simulated seconds per env step."""
        return float(self.model.opt.timestep) * self.frame_skip

    @property
    def subset_steps(self) -> bool:
        """Whether :meth:`step_batch` and :meth:`send` take a subset of the instances:
        the class has the split hooks or :meth:`step_subset`, and the backend is not
        ``"mjwarp"`` (which steps every world at once)."""
        overridden = type(self).step_subset is not BatchMujocoEnv.step_subset
        return self.__physics.subsets and (self.__split or overridden)

    def apply_params(self, model: mujoco.MjModel, params: Params) -> None:
        """Writes one instance's parameters into its model; override for custom fields."""
        write_model_fields(model, self.model_fields, self.__physics.nominal, params)

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
        if not self.__split:
            return super().step_instances(actions, rngs)
        return self.step_subset(np.arange(self.num_envs, dtype=np.int64), actions, rngs)

    def step_subset(
        self, ids: np.ndarray, actions: Any, rngs: Sequence[np.random.Generator]
    ) -> StepResult:
        """``before_physics``, :meth:`do_simulation` and ``after_physics`` on ``ids``."""
        if not self.__split:
            return super().step_subset(ids, actions, rngs)
        before = self.before_physics(ids, actions)
        self.do_simulation(actions, ids)
        return self.after_physics(ids, actions, before, rngs)

    # ------------------------------------------------------------------- physics

    def set_qpos_qvel(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        """Sets the start state of instances ``ids`` (in ``reset_instances``, rows per
        id) and runs :meth:`forward`: on every backend, the way to write a reset that
        also runs on ``"mjwarp"`` (which has no ``self.datas``)."""
        self.__physics.set_qpos_qvel(ids, qpos, qvel)

    def forward(self, ids: np.ndarray) -> None:
        """``mj_forward`` on instances ``ids`` (after setting qpos/qvel); refreshes
        :attr:`batch` (``"mjwarp"``: only when ``batch_fields`` hold derived fields, and
        then of every world, whose state it does not change)."""
        self.__physics.forward(ids)

    def do_simulation(self, ctrl: np.ndarray, ids: np.ndarray | None = None) -> None:
        """Sets the instances' ``ctrl`` and advances them ``frame_skip`` physics steps.

        Args:
            ctrl: ``(len(ids), nu)`` controls, row ``k`` for instance ``ids[k]``.
            ids: the instances to step, sorted (default all N; ``ctrl`` then has N rows).
        """
        self.__physics.do_simulation(ctrl, ids)

    # ------------------------------------------------------------------ snapshots

    def get_env_state(self) -> dict[str, Any]:
        return {**self.__physics.get_state(), "extra": super().get_env_state()}

    def set_env_state(self, state: Mapping[str, Any]) -> None:
        self.__physics.set_state(self, state)
        super().set_env_state(state.get("extra", {}))


class MujocoPhysics(Physics):
    """N instances of one ``MjModel`` in MuJoCo's C engine: the backends ``"native"``,
    ``"threads"``, ``"pooled"`` and ``"loop"`` (see the module docstring)."""

    on_host = True
    subsets = True

    def __init__(
        self,
        env: BatchMujocoEnv,
        nominal: dict[str, np.ndarray],
        backend: str,
        nthread: int | None,
        split: bool,
    ) -> None:
        model, n, model_fields = env.model, env.num_envs, env.model_fields
        batch_fields = env.batch_fields
        self.n, self.frame_skip, self.split = n, env.frame_skip, split
        self.model_fields, self.nominal = model_fields, nominal
        self.models = [copy.deepcopy(model) for _ in range(n)] if model_fields else [model] * n
        self.datas = [mujoco.MjData(m) for m in self.models]
        self.batch: dict[str, Any] = {
            name: np.zeros((n, *np.shape(getattr(self.datas[0], name))), dtype=np.float64)
            for name in batch_fields
        }
        self.state_size = mujoco.mj_stateSize(model, PHYSICS_STATE)
        self.slices: dict[str, slice] = {}  # qpos, qvel, ctrl in an mjSTATE_INTEGRATION vector
        for bit, name in ((2, "qpos"), (4, "qvel"), (64, "ctrl")):  # after every lower bit's
            start = mujoco.mj_stateSize(model, int(PHYSICS_STATE) & (bit - 1))
            self.slices[name] = slice(start, start + mujoco.mj_stateSize(model, bit))
        self.workers = workers = 1 if backend == "loop" else min(nthread or os.cpu_count() or 1, n)
        self.rows = backend in ("native", "pooled")  # the state rows hold the physics
        self.native: Any = None
        self.outputs: dict[str, np.ndarray] = {}
        if backend == "native":
            assert _NativeBatch is not None
            self.native = _NativeBatch(model, n, nthread=workers)
            self.native.set_models(self.models if model_fields else model)
            self.states: np.ndarray = self.native.state  # the live rows MuJoCo steps
            # Bound once here: binding registers an output, a Batch call of its own.
            self.outputs = {f: self.native.bind(f) for f in batch_fields if f not in self.slices}
        else:
            self.states = np.zeros((n, self.state_size), dtype=np.float64)
        self.models_dirty = False
        self.scratch = [mujoco.MjData(model) for _ in range(workers)] if backend == "pooled" else []
        # Fields the pool copies out of an MjData per instance (the rest come from rows).
        self.row_fields = [f for f in batch_fields if not (self.rows and f in self.slices)]
        self.pool: ThreadPoolExecutor | None = None
        if workers > 1 and self.native is None:
            self.pool = ThreadPoolExecutor(workers - 1, thread_name_prefix="simkit-physics")
        self.stepper: ThreadPoolExecutor | None = None  # native send(): one FIFO thread

    def prepare(self, env: BatchEnv, ids: np.ndarray, params: Sequence[Params]) -> None:
        assert isinstance(env, BatchMujocoEnv)
        for k, i in enumerate(ids.tolist()):
            mujoco.mj_resetData(self.models[i], self.datas[i])
            self.restore_model(env, i, params[k] if self.model_fields else {})

    def restore_model(self, env: BatchMujocoEnv, i: int, params: Params) -> None:
        """Instance ``i``'s model: the nominal fields, then its ``params`` applied."""
        if not self.model_fields:
            return
        model = self.models[i]
        for attribute, nominal in self.nominal.items():
            _resolve(model, attribute)[...] = nominal
        env.apply_params(model, params)
        self.models_dirty = True

    def start(
        self, env: BatchEnv, ids: np.ndarray, actions: Any, rngs: KeyedStreams
    ) -> PendingStep:
        """With the split hooks on ``"native"``: the physics starts at once on a
        background thread, ``after_physics`` runs in ``finish``."""
        if not (self.split and self.native is not None):
            return super().start(env, ids, actions, rngs)  # runs whole in finish()
        assert isinstance(env, BatchMujocoEnv)
        before = env.before_physics(ids, actions)
        sub = self.write_ctrl(np.asarray(actions), ids)
        if self.stepper is None:
            self.stepper = ThreadPoolExecutor(1, thread_name_prefix="simkit-batch")
        # The task holds the Batch, not the env, so a dropped env is still collected.
        fut: Future[None] = self.stepper.submit(
            _native_step, self.native, sub, self.frame_skip, self.take_models()
        )

        def finish() -> StepResult:
            fut.result()
            self.rows_from_states(sub)
            return env.after_physics(ids, actions, before, rngs)

        return PendingStep(finish=finish, drain=fut.exception)

    def set_qpos_qvel(self, ids: np.ndarray, qpos: Any, qvel: Any) -> None:
        for k, i in enumerate(np.asarray(ids).tolist()):
            self.datas[i].qpos[:] = qpos[k]
            self.datas[i].qvel[:] = qvel[k]
        self.forward(ids)

    def forward(self, ids: np.ndarray) -> None:
        for i in np.asarray(ids).tolist():
            d = self.datas[i]
            mujoco.mj_forward(self.models[i], d)
            for name, buf in self.batch.items():
                buf[i] = getattr(d, name)
            if self.rows:
                mujoco.mj_getState(self.models[i], d, self.states[i], PHYSICS_STATE)

    def do_simulation(self, ctrl: Any, ids: np.ndarray | None) -> None:
        ctrl = np.asarray(ctrl)
        if self.native is not None:
            sub = self.write_ctrl(ctrl, ids)
            _native_step(self.native, sub, self.frame_skip, self.take_models())
            self.rows_from_states(sub)
            return
        order = list(range(self.n)) if ids is None else np.asarray(ids).tolist()
        if self.rows:
            self.write_ctrl(ctrl, ids)
        run, counter = self.run, itertools.count()
        futures: list[Future[None]] = []
        if self.pool is not None:
            futures = [
                self.pool.submit(run, w, counter, order, ctrl)
                for w in range(1, min(self.workers, len(order)))
            ]
        try:
            run(0, counter, order, ctrl)
        finally:
            for fut in futures:
                fut.result()
        if self.rows:
            self.rows_from_states(None if ids is None else np.asarray(ids))

    def write_ctrl(self, ctrl: np.ndarray, ids: np.ndarray | None) -> np.ndarray | None:
        """Writes ``ctrl`` into the state rows; returns ``ids`` or ``None`` for all."""
        if ids is None or len(ids) == self.n:
            self.states[:, self.slices["ctrl"]] = ctrl
            return None
        sub = np.asarray(ids, dtype=np.int64)
        self.states[sub, self.slices["ctrl"]] = ctrl
        return sub

    def take_models(self) -> list[mujoco.MjModel] | None:
        """The models to hand the native Batch again if a reset edited them
        (``mujoco.batch`` asks for ``set_models`` after an edit), else ``None``."""
        if not self.models_dirty:
            return None
        self.models_dirty = False
        return self.models

    def run(self, worker: int, counter: Iterator[int], order: list[int], ctrl: np.ndarray) -> None:
        """Steps instances taken from ``counter`` until ``order`` runs out: each one's own
        ``MjData`` with its ``ctrl`` row, or (``"pooled"``) the worker's scratch
        ``MjData`` loaded from and saved to its state row, which holds its ``ctrl``."""
        models, states, nstep, count = self.models, self.states, self.frame_skip, len(order)
        scratch = self.scratch[worker] if self.rows else None
        bufs = [(name, self.batch[name]) for name in self.row_fields]
        for k in counter:  # next() on itertools.count is atomic under the GIL
            if k >= count:
                return
            i = order[k]
            m = models[i]
            if scratch is None:
                d = self.datas[i]
                d.ctrl[:] = ctrl[k]
                mujoco.mj_step(m, d, nstep=nstep)
            else:
                d = scratch
                mujoco.mj_setState(m, d, states[i], PHYSICS_STATE)
                mujoco.mj_step(m, d, nstep=nstep)
                mujoco.mj_getState(m, d, states[i], PHYSICS_STATE)
            for name, buf in bufs:
                buf[i] = getattr(d, name)

    def rows_from_states(self, ids: np.ndarray | None) -> None:
        """Copies ``batch_fields`` of ``ids`` (all if ``None``) out of the state rows and,
        for ``"native"``, MuJoCo's bound derived fields, vectorised."""
        for name, buf in self.batch.items():
            sl = self.slices.get(name)
            if sl is not None:
                src = self.states[:, sl].reshape(buf.shape)
            elif name in self.outputs:
                src = self.outputs[name]
            else:
                continue  # copied per instance by the pool
            if ids is None:
                buf[...] = src
            else:
                buf[ids] = src[ids]

    def get_state(self) -> dict[str, Any]:
        if self.rows:
            return {"physics": self.states.copy()}
        physics = np.empty((self.n, self.state_size), dtype=np.float64)
        for i, d in enumerate(self.datas):
            mujoco.mj_getState(self.models[i], d, physics[i], PHYSICS_STATE)
        return {"physics": physics}

    def set_state(self, env: BatchMujocoEnv, state: Mapping[str, Any]) -> None:
        physics = state.get("physics") if isinstance(state, Mapping) else None
        shape = (self.n, self.state_size)
        if not isinstance(physics, np.ndarray) or physics.shape != shape:
            got = getattr(physics, "shape", type(physics).__name__)
            raise InvalidState(
                f"MuJoCo batch physics state must be a float64 array of shape {shape}, got {got}"
            )
        physics = physics.astype(np.float64)
        params = env.params if self.model_fields else []
        for i, d in enumerate(self.datas):
            self.restore_model(env, i, params[i] if params else {})
            mujoco.mj_setState(self.models[i], d, physics[i], PHYSICS_STATE)
        self.forward(np.arange(self.n))

    def close(self) -> None:
        for pool in (self.stepper, self.pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self.stepper = self.pool = None


def resolve_backend(backend: Backend, device: Any) -> Backend:
    """The backend ``backend="auto"`` means on ``device`` (a torch device, its name or
    None): MJWarp on a CUDA device, else ``mujoco.batch`` (``"native"``) where MuJoCo has
    it, else ``"threads"``; any other value as given."""
    if backend != "auto":
        return backend
    if device is not None and str(getattr(device, "type", device)).split(":")[0] == "cuda":
        return "mjwarp"
    return "native" if _NativeBatch is not None else "threads"


def _native_step(
    batch: Any, ids: np.ndarray | None, nstep: int, models: list[mujoco.MjModel] | None
) -> None:
    """One ``mujoco.batch`` step of ``ids`` (all if ``None``), re-setting edited models."""
    if models is not None:
        batch.set_models(models)
    batch.step(ids, nstep)
