"""``simkit.BatchMujocoEnv``: N instances of one MJCF model as a :class:`BatchEnv`.

Each instance has its own ``MjData`` (and its own ``MjModel`` copy when model
parameters are randomized) and is stepped with ``mj_step`` exactly as
:class:`simkit.MujocoEnv` steps its one instance, so a batch is bit-identical to N
single instances, solver warm-start included. ``mj_step`` releases the GIL, so
instances step in parallel on a persistent thread pool (workers take instances from a
shared counter, balancing load on a shared machine); each worker also copies its instances' ``MjData`` fields into batched arrays
(:attr:`BatchMujocoEnv.batch`), overlapping that Python work with the other workers'
native stepping. Observations and rewards are then computed vectorised from those arrays.

``mujoco.rollout`` was measured as the alternative (see docs/benchmarks.md): stepped an
env step at a time it is not faster than this pool on our machine, and it cannot hand
back the solver warm-start (``qacc_warmstart``), so it could not be bit-identical to
``mj_step`` either. The ``"pooled"`` backend borrows its layout instead (one scratch
``MjData`` per worker, per-instance state rows) while keeping the warm-start.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Literal

import mujoco
import numpy as np

from simkit._batch import BatchEnv
from simkit._mujoco import PHYSICS_STATE, ModelField, _load_model, _resolve
from simkit.errors import InvalidState
from simkit.randomization import Params

__all__ = ["BatchMujocoEnv"]


class BatchMujocoEnv(BatchEnv):
    """N instances of one MJCF model, each stepped ``frame_skip`` times per env step.

    Authors declare ``randomization``/``model_fields`` as for :class:`simkit.MujocoEnv`
    and implement the :class:`simkit.BatchEnv` hooks:

    - ``reset_instances``: for each ``i`` in ``ids``, ``self.datas[i]`` has just been
      reset with ``mj_resetData``; set its ``qpos``/``qvel`` from ``rngs[k]`` (in the
      order the single-instance env draws) and call :meth:`forward` ``(ids)``.
    - ``step_instances``: call :meth:`do_simulation` ``(ctrl)`` then compute
      observations and rewards from :attr:`batch` (``(N, ...)`` arrays of the
      ``MjData`` fields named in ``batch_fields``).

    Args:
        model: path to an MJCF file, an MJCF XML string, or an ``MjModel``.
        num_envs: N.
        frame_skip: physics steps per env step.
        backend: ``"threads"`` (the pool steps each instance's own ``MjData``),
            ``"pooled"`` (the pool steps one scratch ``MjData`` per worker, loading and
            saving each instance's ``mjSTATE_INTEGRATION`` row around ``mj_step``, as
            ``mujoco.rollout`` does: far less memory traffic at large N; ``self.datas[i]``
            is then only current inside ``reset_instances``) or ``"loop"`` (one thread,
            own ``MjData``). All give bit-identical results.
        nthread: worker threads for ``"threads"``; defaults to the CPU count.
        **kwargs: passed to :class:`simkit.BatchEnv` (spaces, params, ...).
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
        backend: Literal["threads", "pooled", "loop"] = "threads",
        nthread: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_envs, **kwargs)
        if isinstance(frame_skip, bool) or not isinstance(frame_skip, int) or frame_skip < 1:
            raise ValueError(f"frame_skip must be a positive int, got {frame_skip!r}")
        if backend not in ("threads", "pooled", "loop"):
            raise ValueError(f"backend must be 'threads', 'pooled' or 'loop', got {backend!r}")
        if nthread is not None and (isinstance(nthread, bool) or nthread < 1):
            raise ValueError(f"nthread must be a positive int or None, got {nthread!r}")
        unknown = set(self.model_fields) - set(self.randomization)
        if unknown:
            raise ValueError(
                f"model_fields {sorted(unknown)} have no distribution in randomization"
            )
        self.model = _load_model(model)
        self.frame_skip = frame_skip
        n = self.num_envs
        self.models: list[mujoco.MjModel] = (
            [copy.deepcopy(self.model) for _ in range(n)] if self.model_fields else [self.model] * n
        )
        self.datas: list[mujoco.MjData] = [mujoco.MjData(m) for m in self.models]
        self._nominal = {
            f.attribute: np.array(_resolve(self.model, f.attribute), copy=True)
            for f in self.model_fields.values()
        }
        self._state_size = mujoco.mj_stateSize(self.model, PHYSICS_STATE)
        self.batch: dict[str, np.ndarray] = {
            name: np.zeros((n, *np.shape(getattr(self.datas[0], name))), dtype=np.float64)
            for name in self.batch_fields
        }
        workers = min(nthread or os.cpu_count() or 1, n) if backend != "loop" else 1
        self._workers = workers
        self._pooled = backend == "pooled"
        self._states = np.zeros((n, self._state_size), dtype=np.float64)
        self._scratch = [mujoco.MjData(self.model) for _ in range(workers)] if self._pooled else []
        self._slices = _state_slices(self.model)
        # In pooled mode qpos/qvel come straight out of the state rows, vectorised.
        self._row_fields = [
            f for f in self.batch_fields if not (self._pooled and f in self._slices)
        ]
        self._pool = ThreadPoolExecutor(workers - 1) if workers > 1 else None
        self.backend = backend

    @property
    def dt(self) -> float:
        """Simulated seconds per env step."""
        return float(self.model.opt.timestep) * self.frame_skip

    def apply_params(self, model: mujoco.MjModel, params: Params) -> None:
        """Writes one instance's parameters into its model; override for custom fields."""
        for name, field in self.model_fields.items():
            target = _resolve(model, field.attribute)
            nominal = self._nominal[field.attribute][field.index]
            value = np.asarray(params[name], dtype=np.float64)
            if field.op == "scale":
                target[field.index] = nominal * value
            elif field.op == "add":
                target[field.index] = nominal + value
            else:
                target[field.index] = value

    def _restore_model(self, i: int) -> None:
        if not self.model_fields:
            return
        model = self.models[i]
        for attribute, nominal in self._nominal.items():
            _resolve(model, attribute)[...] = nominal
        self.apply_params(model, self._params[i])

    def _prepare_instances(self, ids: np.ndarray) -> None:
        for i in ids.tolist():
            mujoco.mj_resetData(self.models[i], self.datas[i])
            self._restore_model(i)

    def forward(self, ids: np.ndarray) -> None:
        """``mj_forward`` on instances ``ids`` (after setting qpos/qvel); refreshes :attr:`batch`."""
        for i in np.asarray(ids).tolist():
            d = self.datas[i]
            mujoco.mj_forward(self.models[i], d)
            for name, buf in self.batch.items():
                buf[i] = getattr(d, name)
            if self._pooled:
                mujoco.mj_getState(self.models[i], d, self._states[i], PHYSICS_STATE)

    def do_simulation(self, ctrl: np.ndarray) -> None:
        """Sets each instance's ``ctrl`` row and advances ``frame_skip`` physics steps.

        Workers (the pool threads and the calling thread) take instances from a shared
        counter one at a time, so a core slowed by other load takes fewer of them.

        Args:
            ctrl: ``(N, nu)`` controls, row ``i`` for instance ``i``.
        """
        counter = itertools.count()
        if self._pooled:
            self._states[:, self._slices["ctrl"]] = ctrl
        run = self._run_pooled if self._pooled else self._run_worker
        futures: list[Future[None]] = []
        if self._pool is not None:
            futures = [self._pool.submit(run, w, counter, ctrl) for w in range(1, self._workers)]
        run(0, counter, ctrl)
        for fut in futures:
            fut.result()
        if self._pooled:
            for name, buf in self.batch.items():
                if name in self._slices:
                    buf[...] = self._states[:, self._slices[name]]

    def _run_pooled(self, worker: int, counter: Iterator[int], ctrl: np.ndarray) -> None:
        models, states, nstep, n = self.models, self._states, self.frame_skip, self.num_envs
        d = self._scratch[worker]
        bufs = [(name, self.batch[name]) for name in self._row_fields]
        for i in counter:
            if i >= n:
                return
            m = models[i]
            mujoco.mj_setState(m, d, states[i], PHYSICS_STATE)  # ctrl is in the row
            mujoco.mj_step(m, d, nstep=nstep)
            mujoco.mj_getState(m, d, states[i], PHYSICS_STATE)
            for name, buf in bufs:
                buf[i] = getattr(d, name)

    def _run_worker(self, worker: int, counter: Iterator[int], ctrl: np.ndarray) -> None:
        del worker
        models, datas, nstep, n = self.models, self.datas, self.frame_skip, self.num_envs
        bufs = list(self.batch.items())
        step = mujoco.mj_step
        for i in counter:  # next() on itertools.count is atomic under the GIL
            if i >= n:
                return
            d = datas[i]
            d.ctrl[:] = ctrl[i]
            step(models[i], d, nstep=nstep)
            for name, buf in bufs:
                buf[i] = getattr(d, name)

    def get_env_state(self) -> dict[str, Any]:
        if self._pooled:
            return {"physics": self._states.copy(), "extra": super().get_env_state()}
        physics = np.empty((self.num_envs, self._state_size), dtype=np.float64)
        for i, d in enumerate(self.datas):
            mujoco.mj_getState(self.models[i], d, physics[i], PHYSICS_STATE)
        return {"physics": physics, "extra": super().get_env_state()}

    def set_env_state(self, state: Mapping[str, Any]) -> None:
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
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


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
