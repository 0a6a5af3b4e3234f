"""``BatchEnvHost``: one :class:`simkit.BatchEnv` served as ``num_envs`` protocol envs.

The batch is the author's arrays of N instances, so it is stepped whole: a ``step``
must list every env (in any order), and a failure inside ``step_instances`` is a
failure of the whole batch. Seeding is the BatchEnv's own (``episode_seed(root, i, k)``
per instance), so a remote BatchEnv equals a local one bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit._batch import BatchEnv
from simkit._batch_rows import host_arrays
from simkit._seeding import ResetSeed
from simkit._state import is_tag
from simkit._types import BatchStep
from simkit.errors import InvalidState, ResetNeeded
from simkit.protocol import (
    EnvFault,
    InvalidField,
    ResetRequest,
    Unsupported,
    error_code_of,
    put_rows,
)
from simkit.protocol import take_rows as _take
from simkit.randomization import resolve_overrides
from simkit.vector._vector import info_row

__all__ = ["BatchEnvHost", "BATCH_HOST_STATE"]

BATCH_HOST_STATE = "simkit.batch_host/1"
"""Tag of the per-env snapshots :meth:`BatchEnvHost.get_state` returns."""


class BatchEnvHost:
    """Serves a :class:`simkit.BatchEnv` of N instances as N envs.

    - ``reset``: a root ``seed`` or none (each listed instance starts its next episode),
      for every env or any subset after the first reset; per-env ``params`` and ``options["params"]``
      become the BatchEnv's per-instance overrides. ``seeds`` (exact per-env seeds, any
      subset) is ``BatchEnv.reset``'s list of seeds; a root for a subset re-roots those
      instances only (``reset_mask``), as a vector server does. ``env_offset != 0`` gets ``unsupported``: a
      BatchEnv seeds its instances by their own index.
    - ``step``: all N envs in one request (any order); a subset gets ``unsupported``.
      Actions are checked with :meth:`BatchEnv.check_actions` before the batch moves.
    - Faults: if the batch raises while stepping, every row ends (truncated, reward 0,
      ``final_obs`` = its previous observation) with the fault listed per env, and the
      whole batch starts its next episodes; if that reset raises too, every step
      reports ``reset_needed`` until a ``reset`` of all envs succeeds.
    - ``get_state``/``set_state``: all N envs at once (the batch's snapshot rides in
      the first listed env's entry).

    - A torch batch (``device`` set, e.g. ``BatchMujocoEnv(backend="mjwarp")``) is
      served too: its rows are copied to the host once per reply (the wire carries
      numpy arrays), and actions reach it as numpy arrays.

    Args:
        env: the batch; the host owns and closes it.
    """

    def __init__(self, env: BatchEnv) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.observation_space: spaces.Space[Any] = env.single_observation_space
        self.action_space: spaces.Space[Any] = env.single_action_space
        caps = {"state", "params"}
        if env.randomization:
            caps.add("randomization")
        self.capabilities = frozenset(caps)
        self._validate = env.validate_actions
        self._subsets = env.subset_steps
        env.validate_actions = False  # checked once in step, before the batch moves
        self._all = np.arange(self.num_envs, dtype=np.int64)
        self._obs: Any = None
        self._broken = False

    # ------------------------------------------------------------------------ reset

    def reset(self, request: ResetRequest) -> tuple[Any, list[dict[str, Any]]]:
        """Resets ``request.env_ids`` through ``BatchEnv.reset`` (``reset_mask`` for a
        subset)."""
        env_ids, params, n = request.env_ids, request.params, self.num_envs
        everyone = env_ids.size == n
        seed: ResetSeed = request.seed
        if request.seeds is not None:  # Gymnasium's list: None for an instance not listed
            listed = dict(zip(env_ids.tolist(), request.seeds, strict=True))
            seed = [listed.get(i) for i in range(n)]
        if request.env_offset:
            raise Unsupported(
                "a BatchEnv seeds its instances by their own index",
                expected="env_offset 0",
                got=request.env_offset,
            )
        if self._obs is None and not everyone:
            raise ResetNeeded(f"the first reset must reset all {n} envs, got {env_ids.size}")
        opts = dict(request.options or {})
        shared = _option_params(opts.pop("params", None), env_ids.size)
        per: list[dict[str, Any]] = [{} for _ in range(n)]
        for k, i in enumerate(env_ids.tolist()):
            per[i] = {**shared[k], **(params[k] if params else {})}
            if per[i]:
                # Checked up front so a bad override changes nothing.
                resolve_overrides(
                    self.env.randomization, {**self.env._simkit.env_overrides[i], **per[i]}
                )
        if any(per):
            opts["params"] = per
        if not everyone:
            opts["reset_mask"] = np.isin(np.arange(n), env_ids)
        obs, vector_info = self.env.reset(seed=seed, options=opts or None)
        obs = self._obs = host_arrays(obs)
        if everyone:
            self._broken = False
        infos = [info_row(vector_info, i) for i in env_ids.tolist()]
        return _take(self.observation_space, obs, env_ids), infos

    # ------------------------------------------------------------------------- step

    def step(self, env_ids: np.ndarray, actions: Any) -> tuple[BatchStep, list[EnvFault]]:
        """Steps ``env_ids`` through ``BatchEnv.step_batch``; rows come back in ``env_ids``
        order. All N ids in any order work for every BatchEnv; a subset needs
        ``step_subset`` (the other instances do not move)."""
        n = self.num_envs
        if env_ids.size != n and not self._subsets:
            raise Unsupported(
                f"{type(self.env).__name__} steps all its instances at once (no step_subset)",
                expected=f"all {n} env ids",
                got=f"{env_ids.size} env ids",
            )
        if self._obs is None:
            raise ResetNeeded("step before reset; send reset first")
        if self._broken:
            return self._failed(env_ids, "reset_needed", "the batch failed to reset; reset it")
        if self.env.device is not None:  # torch reads the wire's read-only buffer: a copy
            actions = _writable(actions)
        if self._validate:
            actions = self.env.check_actions(actions, env_ids.size)
        in_order = env_ids.size == n and bool(np.array_equal(env_ids, self._all))
        try:
            result = self.env.step_batch(actions, None if in_order else env_ids)
        except Exception as exc:  # the stepped instances fail; the others did not move
            return self._fault_all(env_ids, exc)
        if self.env.device is not None:
            rows = ("obs", "reward", "terminated", "truncated", "final_obs")
            result = replace(result, **{f: host_arrays(getattr(result, f)) for f in rows})
        self._obs = (
            result.obs
            if in_order
            else put_rows(self.observation_space, self._obs, env_ids, result.obs)
        )
        return result, []

    def _failed(
        self, env_ids: np.ndarray, code: str, message: str
    ) -> tuple[BatchStep, list[EnvFault]]:
        obs = _take(self.observation_space, self._obs, env_ids)
        k = env_ids.size
        step = BatchStep(
            obs=obs,
            reward=np.zeros(k, dtype=np.float64),
            terminated=np.zeros(k, dtype=np.bool_),
            truncated=np.ones(k, dtype=np.bool_),
            final_obs=obs,
            env_ids=env_ids.astype(np.int64),
            infos=[{} for _ in range(k)],
        )
        return step, [EnvFault(int(i), code, message) for i in env_ids.tolist()]

    def _fault_all(self, env_ids: np.ndarray, exc: Exception) -> tuple[BatchStep, list[EnvFault]]:
        """Every row ends with the batch's fault; the batch starts its next episodes."""
        step, faults = self._failed(env_ids, error_code_of(exc), f"{type(exc).__name__}: {exc}")
        options = None
        if env_ids.size < self.num_envs:  # a subset step failed: restart only its instances
            options = {"reset_mask": np.isin(np.arange(self.num_envs), env_ids)}
        try:
            obs, vector_info = self.env.reset(options=options)
            obs = host_arrays(obs)
        except Exception as again:
            self._broken = True
            msg = f"reset failed: {type(again).__name__}: {again}"
            faults += [EnvFault(int(i), error_code_of(again), msg) for i in env_ids.tolist()]
            return step, faults
        self._obs = obs
        infos = [{"reset_info": info_row(vector_info, i)} for i in env_ids.tolist()]
        return replace(step, obs=_take(self.observation_space, obs, env_ids), infos=infos), faults

    # -------------------------------------------------------------------- snapshots

    def _check_all(self, env_ids: np.ndarray, what: str) -> None:
        if env_ids.size != self.num_envs:
            raise Unsupported(
                f"a BatchEnv {what} covers all its instances at once",
                expected=f"all {self.num_envs} env ids",
                got=f"{env_ids.size} env ids",
            )

    def get_state(self, env_ids: np.ndarray) -> list[dict[str, Any]]:
        """One entry per env; the first carries the whole batch's snapshot."""
        self._check_all(env_ids, "snapshot")
        if self._obs is None:
            raise ResetNeeded("get_state before reset; reset first")
        batch = {"env": self.env.get_state(), "broken": self._broken}
        return [
            {
                "format": BATCH_HOST_STATE,
                "instance": int(i),
                "num_envs": self.num_envs,
                "batch": batch if k == 0 else None,
            }
            for k, i in enumerate(env_ids.tolist())
        ]

    def set_state(self, env_ids: np.ndarray, states: list[dict[str, Any]]) -> None:
        """Restores a :meth:`get_state` result (all N entries, any order), all or
        nothing: the host's own fields are checked first, then ``BatchEnv.set_state``
        checks the batch's snapshot before it changes anything.

        Raises:
            InvalidState: not this host's snapshot, or a field the batch refuses.
        """
        self._check_all(env_ids, "snapshot")
        batch: Any = None
        for i, state in zip(env_ids.tolist(), states, strict=True):
            if (
                not isinstance(state, Mapping)
                or not is_tag(state.get("format"), BATCH_HOST_STATE)
                or not is_tag(state.get("instance"), i)
                or not is_tag(state.get("num_envs"), self.num_envs)
            ):
                raise InvalidState(
                    f"a BatchEnv host snapshot is its get_state entry for this env: format "
                    f"{BATCH_HOST_STATE!r}, instance {i}, num_envs {self.num_envs}"
                )
            if state.get("batch") is not None:
                if batch is not None:
                    raise InvalidState("the snapshot holds the batch's state twice")
                batch = state["batch"]
        if not isinstance(batch, Mapping) or {"env", "broken"} - set(batch):
            raise InvalidState("the snapshot lacks the batch's state (env and broken)")
        broken = batch["broken"]
        if not isinstance(broken, bool | np.bool_):
            raise InvalidState(f"the batch's state 'broken' must be a bool, got {broken!r:.80}")
        self.env.set_state(batch["env"])  # checks every field (obs too) before any change
        self._broken = bool(broken)
        self._obs = host_arrays(copy.deepcopy(batch["env"]["obs"]))

    def close(self) -> None:
        """Closes the batch."""
        self.env.close()


def _writable(actions: Any) -> Any:
    """``actions`` (arrays, or a dict/tuple of them) with every array writable."""
    if isinstance(actions, Mapping):
        return {k: _writable(v) for k, v in actions.items()}
    if isinstance(actions, tuple):
        return tuple(_writable(v) for v in actions)
    if isinstance(actions, np.ndarray) and not actions.flags.writeable:
        return actions.copy()
    return actions


def _option_params(value: Any, rows: int) -> list[dict[str, Any]]:
    """``options["params"]``: one map for every listed env, or one map per listed env."""
    if value is None:
        return [{}] * rows
    if isinstance(value, Mapping):
        return [dict(value)] * rows
    if (
        isinstance(value, list)
        and len(value) == rows
        and all(isinstance(v, Mapping) for v in value)
    ):
        return [dict(v) for v in value]
    raise InvalidField(
        "options['params'] must be one map or one map per env id",
        expected=f"a map or {rows} maps",
        got=repr(value)[:200],
    )
