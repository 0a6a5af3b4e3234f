"""``simkit.BatchEnv``: the author writes reset/step over arrays of N instances.

A :class:`BatchEnv` is a ``gymnasium.vector.VectorEnv``: learners and Gymnasium vector
wrappers take it directly. The base class owns the contract, per instance: one
``np.random.Generator`` per instance and episode (seeded with
:func:`simkit._seeding.episode_seed`), declared randomization, the time limit, typed
autoreset and snapshots. So instance ``i`` of a batch behaves bit for bit like a
single-instance env reset with ``episode_seed(root, i, k)`` for its ``k``-th episode.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from simkit._seeding import EpisodeSeeds
from simkit._state import check_state_attributes
from simkit._types import BatchStep
from simkit._validation import ActionBounds, check_send_ids, validate_action
from simkit.errors import InvalidAction, InvalidState, ResetNeeded
from simkit.randomization import (
    Distribution,
    LogUniform,
    Params,
    Uniform,
    resolve_overrides,
    sample_params,
)
from simkit.registry import EnvKind
from simkit.snapshot import rng_from_plain, rng_to_plain

__all__ = ["BatchEnv", "BATCH_STATE_FORMAT"]

BATCH_STATE_FORMAT = 1
"""Version of the snapshot layout produced by :meth:`BatchEnv.get_state`."""

_MODES = (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP)


class BatchEnv(gym.vector.VectorEnv[Any, Any, Any]):
    """N instances of one environment, stepped as arrays by the author's code.

    Authors call ``super().__init__(num_envs, single_observation_space=...,
    single_action_space=..., **kwargs)`` and implement two hooks:

    - :meth:`reset_instances` ``(ids, rngs, params, options) -> (obs_rows, infos)``
    - :meth:`step_instances` ``(actions, rngs) -> (obs, reward, terminated, infos)``

    plus either ``state_attributes`` (attributes holding per-instance arrays) or
    ``get_env_state``/``set_env_state``. Arrays are numpy by default; with
    ``device`` set, :attr:`xp` is ``torch`` and the author's arrays are tensors on
    that device (observations stay tensors; rewards and flags come back as numpy).

    Class attributes:
        randomization: parameter name to :class:`~simkit.randomization.Distribution`,
            sampled per instance per episode from that instance's generator.
        max_episode_steps: default time limit (``None`` for none).
        state_attributes: names of attributes holding the batch's dynamic state.

    Args:
        num_envs: N, the number of instances.
        single_observation_space: the space of one instance's observation.
        single_action_space: the space of one instance's action.
        max_episode_steps: time limit per instance; defaults to the class attribute.
        params: randomization overrides, one mapping for every instance or a sequence
            of N mappings (one per instance).
        autoreset_mode: ``SAME_STEP`` (default; final observation in the same step)
            or ``NEXT_STEP`` (Gymnasium's default: reset on the following step).
        validate_actions: check every batch of actions; ``False`` is the fast path
            for trusted callers.
        device: ``None`` for numpy, or a torch device (``"cpu"``, ``"cuda:0"``).
        batch_size: how many instances :meth:`recv` returns (default N), as in
            :class:`simkit.vector.VectorEnv` and EnvPool.
    """

    metadata: dict[str, Any] = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}
    env_kind: ClassVar[EnvKind] = EnvKind.BATCH
    randomization: ClassVar[Mapping[str, Distribution]] = {}
    max_episode_steps: int | None = None
    state_attributes: ClassVar[tuple[str, ...] | None] = None

    def __init__(
        self,
        num_envs: int,
        *,
        single_observation_space: spaces.Space[Any],
        single_action_space: spaces.Space[Any],
        max_episode_steps: int | None = None,
        params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP,
        validate_actions: bool = True,
        device: Any = None,
        batch_size: int | None = None,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer):
            raise TypeError(f"num_envs must be an int, got {type(num_envs).__name__}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if max_episode_steps is not None:
            if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int):
                raise TypeError(
                    f"max_episode_steps must be an int or None, got {type(max_episode_steps).__name__}"
                )
            if max_episode_steps <= 0:
                raise ValueError(f"max_episode_steps must be positive, got {max_episode_steps}")
            self.max_episode_steps = max_episode_steps
        mode = AutoresetMode(autoreset_mode)
        if mode not in _MODES:
            raise ValueError(f"autoreset_mode must be SAME_STEP or NEXT_STEP, got {mode}")
        self.num_envs = int(num_envs)
        if batch_size is None:
            batch_size = self.num_envs
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
            raise TypeError(f"batch_size must be an int or None, got {type(batch_size).__name__}")
        if not 1 <= batch_size <= self.num_envs:
            raise ValueError(
                f"batch_size must be in [1, num_envs={self.num_envs}], got {batch_size}"
            )
        self.batch_size = int(batch_size)
        self.autoreset_mode = mode
        self.metadata = {**type(self).metadata, "autoreset_mode": mode}
        self.single_observation_space = single_observation_space
        self.single_action_space = single_action_space
        self.observation_space = batch_space(single_observation_space, self.num_envs)
        self.action_space = batch_space(single_action_space, self.num_envs)
        self.validate_actions = validate_actions
        self.device = device
        self.xp: Any = np
        if device is not None:
            import torch

            self.xp = torch
            self.device = torch.device(device)
        self._env_overrides = self._per_instance(params, "params")
        compiled: dict[int, Callable[[np.random.Generator], Params]] = {}
        self._samplers = [
            compiled.setdefault(
                id(overrides),
                _compile_sampler(resolve_overrides(self.randomization, overrides)),
            )
            for overrides in self._env_overrides
        ]
        n = self.num_envs
        self._seeds = EpisodeSeeds(n)
        self._rngs: list[np.random.Generator | None] = [None] * n
        self._params: list[Params] = [{} for _ in range(n)]
        self.param_arrays: dict[str, np.ndarray] = {}
        self._elapsed = np.zeros(n, dtype=np.int64)
        self._pending_reset = np.zeros(n, dtype=np.bool_)
        self._has_reset = False
        self._obs: Any = None
        self._in_flight = np.zeros(n, dtype=np.bool_)
        self._pending: deque[tuple[np.ndarray, PendingStep]] = deque()
        self._ready: deque[BatchStep] = deque()

    # ----------------------------------------------------------------- author hooks

    def reset_instances(
        self,
        ids: np.ndarray,
        rngs: Sequence[np.random.Generator],
        params: Sequence[Params],
        options: dict[str, Any],
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Starts an episode for the instances ``ids`` (sorted int64 indices).

        ``rngs[k]`` and ``params[k]`` belong to instance ``ids[k]``; :attr:`param_arrays`
        already holds the new values. Draw each instance's initial state from its own
        generator, in the order a single-instance env would.

        Returns:
            ``(len(ids), *obs_shape)`` first observations and one info dict per row.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement reset_instances()")

    def step_instances(
        self, actions: Any, rngs: Sequence[np.random.Generator]
    ) -> tuple[Any, Any, Any, list[dict[str, Any]] | None]:
        """Advances every instance one step with validated ``actions`` (N rows).

        Returns:
            ``(obs, reward, terminated, infos)``: N-row arrays and one info dict per
            row, or ``None`` for no infos. Truncation is the base class's job.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement step_instances()")

    def step_subset(
        self, ids: np.ndarray, actions: Any, rngs: Sequence[np.random.Generator]
    ) -> tuple[Any, Any, Any, list[dict[str, Any]] | None]:
        """Advances only the instances ``ids`` (sorted int64) with ``actions`` (one row each).

        Needed by :meth:`send` for anything but all N instances at once; ``rngs[k]``
        belongs to ``ids[k]``. Must give each instance exactly what :meth:`step_instances`
        gives it. The default handles ``ids == arange(N)`` through :meth:`step_instances`.

        Returns:
            ``(obs, reward, terminated, infos)`` with ``len(ids)`` rows.
        """
        if len(ids) == self.num_envs:
            return self.step_instances(actions, self._rngs)  # type: ignore[arg-type]
        raise NotImplementedError(
            f"{type(self).__name__} must implement step_subset() to step {len(ids)} of "
            f"{self.num_envs} instances (step_batch() or send() with env_ids, or batch_size < num_envs)"
        )

    def _supports_subset(self) -> bool:
        return type(self).step_subset is not BatchEnv.step_subset

    @property
    def subset_steps(self) -> bool:
        """Whether :meth:`step_batch` and :meth:`send` take a subset of the instances
        (the class implements :meth:`step_subset`)."""
        return self._supports_subset()

    def _start_subset(self, ids: np.ndarray, actions: Any) -> PendingStep:
        """Starts stepping ``ids``; simulator bases start native work in the background.

        The default defers the whole step to :meth:`recv` (runs it on the calling thread).
        """
        rngs: list[np.random.Generator] = [self._rngs[i] for i in ids.tolist()]
        return PendingStep(finish=lambda: self.step_subset(ids, actions, rngs))

    def _prepare_instances(self, ids: np.ndarray) -> None:
        """Runs before ``reset_instances``; simulator bases reset physics here."""
        del ids

    # ------------------------------------------------------------------- properties

    @property
    def params(self) -> list[Params]:
        """Each instance's randomized parameters of its current episode (a copy)."""
        return copy.deepcopy(self._params)

    @property
    def elapsed_steps(self) -> np.ndarray:
        """Steps taken in each instance's current episode (a copy)."""
        return self._elapsed.copy()

    @property
    def episode_index(self) -> np.ndarray:
        """Each instance's episode number under the current root seed (a copy)."""
        return self._seeds.episode.copy()

    @property
    def root_seed(self) -> int | None:
        """The root seed of the batch; instance seeds derive from it."""
        return self._seeds.roots[0]

    @property
    def action_bounds(self) -> ActionBounds:
        """The declared out-of-bounds policy for continuous actions."""
        mode = self.metadata.get("action_bounds", ActionBounds.CLIP)
        if not isinstance(mode, ActionBounds):
            raise TypeError(f"metadata['action_bounds'] must be an ActionBounds, got {mode!r}")
        return mode

    # ------------------------------------------------------------------------ reset

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets instances (all, or ``options["reset_mask"]``); Gymnasium-style infos.

        Args:
            seed: the root seed: instance ``i`` starts episode 0 with
                ``episode_seed(seed, i, 0)``. ``None`` continues: each reset instance
                starts its next episode.
            options: ``{"params": overrides}`` (one mapping or N mappings) for this
                reset, ``{"reset_mask": (N,) bool}`` to reset only some instances;
                other keys are passed to :meth:`reset_instances`.
        """
        ids, infos = self._reset(seed, options)
        vector_info: dict[str, Any] = {}
        for k, i in enumerate(ids):
            vector_info = self._add_info(vector_info, infos[k], int(i))
        return self._obs, vector_info

    def _reset(
        self, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[np.ndarray, list[dict[str, Any]]]:
        self._require_idle("reset()")
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"reset options must be a dict or None, got {type(options).__name__}")
        opts = dict(options or {})
        mask = opts.pop("reset_mask", None)
        if mask is None:
            ids = np.arange(self.num_envs, dtype=np.int64)
        else:
            mask_arr = _to_numpy(mask)
            if mask_arr.dtype != np.bool_ or mask_arr.shape != (self.num_envs,):
                raise ValueError(
                    f"reset_mask must be a bool array of shape ({self.num_envs},), "
                    f"got dtype {mask_arr.dtype} and shape {mask_arr.shape}"
                )
            if not self._has_reset and not mask_arr.all():
                raise ResetNeeded("the first reset() must reset every instance")
            ids = np.flatnonzero(mask_arr).astype(np.int64)
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
                raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
            self._seeds.restart(int(seed))
            self._np_random, self._np_random_seed = seeding.np_random(int(seed))
        reset_params = opts.pop("params", None)
        per_reset = (
            None if reset_params is None else self._per_instance(reset_params, "options['params']")
        )
        obs_rows, infos = self._reset_ids(ids, per_reset, opts)
        if self._obs is None or len(ids) == self.num_envs:
            self._obs = obs_rows
        else:
            self._obs = _scatter(self._obs, ids, obs_rows)
        self._pending_reset[ids] = False
        self._has_reset = True
        return ids, infos

    def _reset_ids(
        self,
        ids: np.ndarray,
        per_reset: list[Mapping[str, Any]] | None,
        options: dict[str, Any],
    ) -> tuple[Any, list[dict[str, Any]]]:
        id_list = ids.tolist()
        rngs = self._seeds.next_generators(ids, [self._rngs[i] for i in id_list])
        params: list[Params] = []
        for i, rng in zip(id_list, rngs, strict=True):
            if per_reset is None or not per_reset[i]:
                sampled = self._samplers[i](rng)
            else:
                overrides = {**self._env_overrides[i], **per_reset[i]}
                sampled = sample_params(resolve_overrides(self.randomization, overrides), rng)
            self._rngs[i] = rng
            self._params[i] = sampled
            params.append(sampled)
        self._elapsed[ids] = 0
        self._update_param_arrays(ids)
        self._prepare_instances(ids)
        obs_rows, infos = self.reset_instances(ids, rngs, params, options)
        if len(infos) != len(ids):
            raise ValueError(
                f"{type(self).__name__}.reset_instances must return {len(ids)} info dicts, "
                f"got {len(infos)}"
            )
        out = []
        for info, p in zip(infos, params, strict=True):
            row = dict(info)
            row["params"] = _copy_params(p)
            out.append(row)
        return obs_rows, out

    def _update_param_arrays(self, ids: np.ndarray) -> None:
        if not len(ids):
            return
        first = self._params[int(ids[0])]
        for name, dist in self.randomization.items():
            sample = first.get(name)
            if not isinstance(sample, int | float | np.ndarray) or isinstance(sample, bool):
                continue
            arr = self.param_arrays.get(name)
            if arr is None:
                arr = np.zeros((self.num_envs, *dist.shape), dtype=np.float64)
                self.param_arrays[name] = arr
            arr[ids] = [self._params[i][name] for i in ids.tolist()]

    # ------------------------------------------------------------------------- step

    def step_batch(self, actions: Any, env_ids: Any = None) -> BatchStep:
        """Steps every instance, or only ``env_ids``; ended instances autoreset in the same step.

        ``env_ids`` is EnvPool's synchronous ``step(action, env_id)``: the other instances
        do not move, and each stepped instance's trajectory is bit for bit the one a
        whole-batch step gives it. Anything but all N instances needs
        :meth:`step_subset`.

        Args:
            actions: one row per stepped instance (N rows, or one per ``env_ids`` entry,
                in that order).
            env_ids: the instances to step (default all, in order).

        Returns:
            A :class:`~simkit.BatchStep` whose ``final_obs`` rows are the observations
            the actions led to and ``obs`` rows the ones to act on next; rows follow
            ``env_ids``.

        Raises:
            ResetNeeded: called before :meth:`reset`.
            InvalidAction: the batch of actions does not fit ``action_space``.
            ValueError: ``env_ids`` out of range or repeated.
            NotImplementedError: a subset, and the class has no :meth:`step_subset`.
        """
        if not self._has_reset:
            raise ResetNeeded("step_batch() called before reset(); call reset() first")
        self._require_idle("step_batch()")
        if env_ids is None:
            if self.validate_actions:
                actions = self.check_actions(actions)
            final_obs, reward, terminated, infos = self._step_all(actions)
            return self._complete(
                np.arange(self.num_envs, dtype=np.int64), final_obs, reward, terminated, infos
            )
        ids, actions, order = self._sorted_subset(env_ids, actions, "step_batch()")
        pending = self._start_subset(ids, actions)
        try:
            result = self._checked(pending.finish(), len(ids), "step_subset")
        except BaseException:
            if pending.drain is not None:
                pending.drain()
            raise
        step = self._complete(ids, *result)
        if order is None:
            return step
        back = np.argsort(order)
        return BatchStep(
            obs=_take_rows(step.obs, back),
            reward=step.reward[back],
            terminated=step.terminated[back],
            truncated=step.truncated[back],
            final_obs=_take_rows(step.final_obs, back),
            env_ids=step.env_ids[back],
            infos=[step.infos[k] for k in back.tolist()],
        )

    def _sorted_subset(
        self, env_ids: Any, actions: Any, what: str
    ) -> tuple[np.ndarray, Any, np.ndarray | None]:
        """Checked ``env_ids`` sorted, their action rows in that order, and the sorting
        permutation (``None`` if they were sorted already)."""
        ids = self._check_ids(env_ids)
        if self.validate_actions:
            actions = self.check_actions(actions, len(ids))
        elif len(actions) != len(ids):
            raise InvalidAction(f"actions must hold {len(ids)} rows, got {len(actions)}")
        if len(ids) != self.num_envs and not self._supports_subset():
            raise NotImplementedError(
                f"{type(self).__name__} must implement step_subset() to step {len(ids)} of "
                f"{self.num_envs} instances ({what} with env_ids, or batch_size < num_envs)"
            )
        order = np.argsort(ids, kind="stable")
        if not (order != np.arange(len(ids))).any():
            return ids, actions, None
        actions = actions[order] if not isinstance(actions, list) else [actions[k] for k in order]
        return ids[order], actions, order

    def _complete(
        self,
        ids: np.ndarray,
        final_obs: Any,
        reward: np.ndarray,
        terminated: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> BatchStep:
        """Truncation and same-step autoreset of the stepped rows ``ids`` (sorted)."""
        truncated = self._truncated(ids)
        done = terminated | truncated
        obs = final_obs
        if done.any():
            rows = np.flatnonzero(done)
            reset_rows, reset_infos = self._reset_ids(ids[rows], None, {})
            obs = _scatter(final_obs, rows, reset_rows)
            for k, r in enumerate(rows.tolist()):
                infos[r] = {**infos[r], "reset_info": reset_infos[k]}
        self._obs = obs if len(ids) == self.num_envs else _scatter(self._obs, ids, obs)
        return BatchStep(
            obs=obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            env_ids=ids,
            infos=infos,
        )

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Gymnasium's 5-tuple under ``metadata["autoreset_mode"]``.

        ``SAME_STEP``: ended instances are reset now; their last observation is in
        ``info["final_obs"]`` (masked by ``info["_final_obs"]``), the step's info in
        ``info["final_info"]`` and the reset's info merged into ``info``, as
        ``SyncVectorEnv`` does. ``NEXT_STEP``: an ended instance ignores its next
        action and is reset instead (reward 0, flags False).
        """
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            return self._step_next(actions)
        result = self.step_batch(actions)
        vector_info: dict[str, Any] = {}
        done = result.done
        for i, info in enumerate(result.infos):
            if done[i]:
                step_info = {k: v for k, v in info.items() if k != "reset_info"}
                vector_info = self._add_info(
                    vector_info,
                    {"final_obs": result.final_obs[i], "final_info": step_info},
                    i,
                )
                vector_info = self._add_info(vector_info, info["reset_info"], i)
            elif info:
                vector_info = self._add_info(vector_info, info, i)
        return result.obs, result.reward, result.terminated, result.truncated, vector_info

    def _step_next(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._has_reset:
            raise ResetNeeded("step() called before reset(); call reset() first")
        self._require_idle("step()")
        if self.validate_actions:
            actions = self.check_actions(actions)
        pending = self._pending_reset.copy()
        obs, reward, terminated, infos = self._step_all(actions)
        truncated = self._truncated()
        if pending.any():
            ids = np.flatnonzero(pending).astype(np.int64)
            rows, reset_infos = self._reset_ids(ids, None, {})
            obs = _scatter(obs, ids, rows)
            reward[ids] = 0.0
            terminated[ids] = False
            truncated[ids] = False
            for k, j in enumerate(ids.tolist()):
                infos[j] = reset_infos[k]
        self._pending_reset = terminated | truncated
        self._obs = obs
        vector_info: dict[str, Any] = {}
        for i, info in enumerate(infos):
            if info:
                vector_info = self._add_info(vector_info, info, i)
        return obs, reward, terminated, truncated, vector_info

    def _step_all(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        rngs: list[np.random.Generator] = self._rngs  # type: ignore[assignment]
        result = self.step_instances(actions, rngs)
        return self._checked(result, self.num_envs, "step_instances")

    def _checked(
        self, result: tuple[Any, Any, Any, list[dict[str, Any]] | None], n: int, hook: str
    ) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        obs, reward, terminated, infos = result
        reward_np = _to_numpy(reward).astype(np.float64, copy=False)
        term_np = _to_numpy(terminated).astype(np.bool_, copy=False)
        if reward_np.shape != (n,) or term_np.shape != (n,):
            raise ValueError(
                f"{type(self).__name__}.{hook} must return reward and terminated of "
                f"shape ({n},), got {reward_np.shape} and {term_np.shape}"
            )
        if infos is None:
            row_infos: list[dict[str, Any]] = [{} for _ in range(n)]
        else:
            if len(infos) != n:
                raise ValueError(
                    f"{type(self).__name__}.{hook} must return {n} info dicts or None, "
                    f"got {len(infos)}"
                )
            row_infos = [dict(info) for info in infos]
        return obs, reward_np.copy(), term_np.copy(), row_infos

    def _truncated(self, ids: np.ndarray | None = None) -> np.ndarray:
        if ids is None or len(ids) == self.num_envs:
            self._elapsed += 1
            elapsed = self._elapsed
        else:
            self._elapsed[ids] += 1
            elapsed = self._elapsed[ids]
        if self.max_episode_steps is None:
            return np.zeros(len(elapsed), dtype=np.bool_)
        return elapsed >= self.max_episode_steps

    # ------------------------------------------------------------------------ async

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Starts stepping the instances ``env_ids`` (default all) with ``actions`` rows.

        EnvPool-style asynchronous stepping, as :meth:`simkit.vector.VectorEnv.send`:
        row ``k`` of ``actions`` is for ``env_ids[k]``. Where the subclass can (the
        native :class:`~simkit.BatchMujocoEnv` backend) the physics starts at once on a
        background thread; otherwise the step runs in :meth:`recv`. Steps autoreset in
        the same step, as :meth:`step_batch`; collect them with :meth:`recv`. Each
        instance's trajectory is bit for bit the one :meth:`step_batch` gives it,
        whatever the split.

        Raises:
            ResetNeeded: called before :meth:`reset` / :meth:`async_reset`.
            ValueError: an id is out of range, repeated, or already in flight.
            InvalidAction: the actions do not fit (names the rows).
        """
        if not self._has_reset:
            raise ResetNeeded("send() called before reset(); call reset() or async_reset() first")
        ids, actions, _ = self._sorted_subset(env_ids, actions, "send()")
        pending = self._start_subset(ids, actions)
        self._in_flight[ids] = True
        self._pending.append((ids, pending))

    def _check_ids(self, env_ids: Any) -> np.ndarray:
        ids = None if env_ids is None else _to_numpy(env_ids)
        return check_send_ids(ids, self.num_envs, self._in_flight)

    def recv(self) -> BatchStep:
        """The next ``batch_size`` instances, as a :class:`~simkit.BatchStep`.

        Sends are completed first in, first out; ``env_ids`` names the rows' instances
        (a send's rows sorted by id, sends in the order they were made); send their
        next actions with :meth:`send`. Rows from :meth:`async_reset` have reward 0, no
        flags, ``final_obs == obs`` and the reset info under ``"reset_info"``.

        Raises:
            RuntimeError: fewer than ``batch_size`` instances are in flight.
        """
        count = self.batch_size
        if int(self._in_flight.sum()) < count:
            raise RuntimeError(
                f"recv() needs {count} envs in flight, only {int(self._in_flight.sum())} are; "
                "send() actions for more envs first"
            )
        have = sum(len(c.env_ids) for c in self._ready)
        while have < count:
            ids, pending = self._pending.popleft()
            try:
                result = self._checked(pending.finish(), len(ids), "step_subset")
                chunk = self._complete(ids, *result)
            except BaseException:
                self._abort_async()
                raise
            self._ready.append(chunk)
            have += len(ids)
        parts: list[BatchStep] = []
        need = count
        while need:
            chunk = self._ready.popleft()
            if len(chunk.env_ids) > need:
                chunk, rest = _split(chunk, need)
                self._ready.appendleft(rest)
            parts.append(chunk)
            need -= len(chunk.env_ids)
        out = parts[0] if len(parts) == 1 else _concat(parts, self.xp)
        self._in_flight[out.env_ids] = False
        return out

    def async_reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Resets (as :meth:`reset`) and queues the reset instances as ready for :meth:`recv`."""
        ids, infos = self._reset(seed, options)
        obs = _take_rows(self._obs, ids)
        k = len(ids)
        self._ready.append(
            BatchStep(
                obs=obs,
                reward=np.zeros(k, dtype=np.float64),
                terminated=np.zeros(k, dtype=np.bool_),
                truncated=np.zeros(k, dtype=np.bool_),
                final_obs=obs,
                env_ids=ids.copy(),
                infos=[{"reset_info": info} for info in infos],
            )
        )
        self._in_flight[ids] = True

    def _abort_async(self) -> None:
        """After a failed step: wait out every background step and forget in-flight ones."""
        while self._pending:
            _, pending = self._pending.popleft()
            if pending.drain is not None:
                pending.drain()
        self._ready.clear()
        self._in_flight[:] = False

    def _require_idle(self, what: str) -> None:
        if self._in_flight.any():
            raise RuntimeError(
                f"{what} called with envs {np.flatnonzero(self._in_flight).tolist()} in flight; "
                "recv() them first"
            )

    # ------------------------------------------------------------ action validation

    def check_actions(self, actions: Any, num_rows: int | None = None) -> Any:
        """Validates a batch of actions (``num_rows`` rows, default N); canonical form.

        ``Box`` and ``Discrete`` single action spaces take a vectorised fast path
        (numpy or torch); other spaces are checked row by row with
        :func:`simkit.validate_action`.

        Raises:
            InvalidAction: wrong shape, dtype, a NaN/inf, or out of range; the message
                names the offending rows.
        """
        space = self.single_action_space
        n = self.num_envs if num_rows is None else num_rows
        if self.xp is not np:
            return self._check_torch(actions, n)
        if isinstance(space, spaces.Box):
            arr = _array_or_raise(actions, (n, *space.shape))
            if arr.dtype.kind not in "iuf":
                raise InvalidAction(
                    f"actions must be a numeric array of shape {(n, *space.shape)}, "
                    f"got dtype {arr.dtype}"
                )
            arr = arr.astype(space.dtype, copy=True)
            finite = np.isfinite(arr).reshape(n, -1).all(axis=1)
            if not finite.all():
                raise InvalidAction(
                    f"actions must be finite (no NaN or inf); rows {np.flatnonzero(~finite).tolist()} are not"
                )
            if self.action_bounds is ActionBounds.CLIP:
                return np.clip(arr, space.low, space.high).astype(space.dtype, copy=False)
            bad = ((arr < space.low) | (arr > space.high)).reshape(n, -1).any(axis=1)
            if bad.any():
                raise InvalidAction(
                    f"actions must lie in [{space.low.tolist()}, {space.high.tolist()}]; "
                    f"rows {np.flatnonzero(bad).tolist()} do not"
                )
            return arr
        if isinstance(space, spaces.Discrete):
            arr = _array_or_raise(actions, (n,))
            if arr.dtype.kind not in "iu":
                raise InvalidAction(
                    f"actions must be an integer array of shape ({n},), got dtype {arr.dtype}"
                )
            lo, hi = int(space.start), int(space.start + space.n)
            bad = (arr < lo) | (arr >= hi)
            if bad.any():
                raise InvalidAction(
                    f"actions must be in [{lo}, {hi}); rows {np.flatnonzero(bad).tolist()} "
                    f"are {arr[bad].tolist()}"
                )
            return arr.astype(np.int64)
        rows = list(actions)
        if len(rows) != n:
            raise InvalidAction(f"actions must hold {n} rows, got {len(rows)}")
        return [
            validate_action(space, a, bounds=self.action_bounds, name=f"actions[{i}]")
            for i, a in enumerate(rows)
        ]

    def _check_torch(self, actions: Any, n: int) -> Any:
        torch = self.xp
        space = self.single_action_space
        if not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(np.asarray(actions), device=self.device)
        if isinstance(space, spaces.Box):
            if tuple(actions.shape) != (n, *space.shape):
                raise InvalidAction(
                    f"actions must have shape {(n, *space.shape)}, got shape {tuple(actions.shape)}"
                )
            if actions.dtype.is_complex or actions.dtype == torch.bool:
                raise InvalidAction(f"actions must be numeric, got dtype {actions.dtype}")
            arr = actions.to(device=self.device, dtype=_torch_dtype(torch, space.dtype))
            if not bool(torch.isfinite(arr).all()):
                raise InvalidAction("actions must be finite (no NaN or inf)")
            low = torch.as_tensor(space.low, device=self.device, dtype=arr.dtype)
            high = torch.as_tensor(space.high, device=self.device, dtype=arr.dtype)
            if self.action_bounds is ActionBounds.CLIP:
                return torch.clamp(arr, low, high)
            if bool(((arr < low) | (arr > high)).any()):
                raise InvalidAction(
                    f"actions must lie in [{space.low.tolist()}, {space.high.tolist()}]"
                )
            return arr
        if isinstance(space, spaces.Discrete):
            if tuple(actions.shape) != (n,) or actions.dtype.is_floating_point:
                raise InvalidAction(
                    f"actions must be an integer tensor of shape ({n},), got "
                    f"{actions.dtype} of shape {tuple(actions.shape)}"
                )
            lo, hi = int(space.start), int(space.start + space.n)
            if bool(((actions < lo) | (actions >= hi)).any()):
                raise InvalidAction(f"actions must be in [{lo}, {hi})")
            return actions.to(device=self.device, dtype=torch.int64)
        raise TypeError(
            f"torch BatchEnvs support Box and Discrete action spaces, got {type(space).__name__}"
        )

    # -------------------------------------------------------------------- snapshots

    def get_env_state(self) -> dict[str, Any]:
        """The author's dynamic state as plain data; defaults to ``state_attributes``."""
        names = self._declared_state_attributes("get_env_state")
        return {name: _plain_copy(getattr(self, name)) for name in names}

    def set_env_state(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`get_env_state` returned; defaults to ``state_attributes``."""
        names = self._declared_state_attributes("set_env_state")
        check_state_attributes(
            type(self).__name__, names, state, lambda name: getattr(self, name, None)
        )
        for name in names:
            setattr(self, name, self._restore_like(getattr(self, name, None), state[name]))

    def _declared_state_attributes(self, hook: str) -> tuple[str, ...]:
        if self.state_attributes is None:
            raise NotImplementedError(
                f"{type(self).__name__} must declare state_attributes or override {hook}()"
            )
        return self.state_attributes

    def _restore_like(self, current: Any, value: Any) -> Any:
        if self.xp is not np and isinstance(current, self.xp.Tensor):
            return self.xp.as_tensor(np.array(value), device=current.device, dtype=current.dtype)
        if self.xp is not np and isinstance(value, np.ndarray):
            return self.xp.as_tensor(value.copy(), device=self.device)
        return copy.deepcopy(value)

    def get_state(self) -> dict[str, Any]:
        """A snapshot of the whole batch: every instance's RNG, params, counters and state.

        Plain data (msgpack-able with :mod:`simkit.snapshot`); ``set_state`` on this or
        a fresh batch of the same class and size continues bit-identically.
        """
        if not self._has_reset:
            raise ResetNeeded("get_state() called before reset(); call reset() first")
        self._require_idle("get_state()")
        return {
            "format": BATCH_STATE_FORMAT,
            "env": f"{type(self).__module__}:{type(self).__qualname__}",
            "num_envs": self.num_envs,
            "root_seed": self._seeds.roots[0],
            "episode_index": self._seeds.episode.copy(),
            "rngs": [rng_to_plain(r) for r in self._rngs if r is not None],
            "params": copy.deepcopy(self._params),
            "elapsed_steps": self._elapsed.copy(),
            "max_episode_steps": self.max_episode_steps,
            "pending_reset": self._pending_reset.copy(),
            "obs": _plain_copy(self._obs),
            "data": self.get_env_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a snapshot from :meth:`get_state`.

        Raises:
            InvalidState: malformed, from another class, or of another batch size.
        """
        if not isinstance(state, Mapping):
            raise InvalidState(f"state must be a dict from get_state(), got {type(state).__name__}")
        self._require_idle("set_state()")
        fields = {
            "format",
            "env",
            "num_envs",
            "root_seed",
            "episode_index",
            "rngs",
            "params",
            "elapsed_steps",
            "pending_reset",
            "obs",
            "data",
        }
        missing = fields - set(state)
        if missing:
            raise InvalidState(
                f"state is missing fields {sorted(missing)}; was it made by get_state()?"
            )
        if state["format"] != BATCH_STATE_FORMAT:
            raise InvalidState(
                f"state format must be {BATCH_STATE_FORMAT}, got {state['format']!r}"
            )
        expected = f"{type(self).__module__}:{type(self).__qualname__}"
        if state["env"] != expected:
            raise InvalidState(f"state belongs to env {state['env']!r}, expected {expected!r}")
        if state["num_envs"] != self.num_envs or len(state["rngs"]) != self.num_envs:
            raise InvalidState(
                f"state holds {state['num_envs']} instances, this batch has {self.num_envs}"
            )
        n = self.num_envs
        core = {
            "_rngs": [rng_from_plain(r) for r in state["rngs"]],
            "_params": [copy.deepcopy(dict(p)) for p in _per_env_list(state, "params", n)],
            "_elapsed": _per_env_array(state, "elapsed_steps", np.int64, n),
            "max_episode_steps": state.get("max_episode_steps", self.max_episode_steps),
            "_pending_reset": _per_env_array(state, "pending_reset", np.bool_, n),
            "_has_reset": True,
        }
        root = state["root_seed"]
        if root is not None and (isinstance(root, bool) or not isinstance(root, int | np.integer)):
            raise InvalidState(f"state['root_seed'] must be an int or None, got {root!r}")
        seeds = EpisodeSeeds.parse_state(
            {
                "root_seeds": [None if root is None else int(root)] * n,
                "episode_index": _per_env_array(state, "episode_index", np.int64, n),
            },
            n,
        )
        obs = self._restore_like(self._obs, state["obs"])
        saved = {name: getattr(self, name, None) for name in core}
        saved_seeds = EpisodeSeeds.parse_state(self._seeds.get_state(), n)
        saved_obs, saved_data = self._obs, self.get_env_state()
        try:
            for name, value in core.items():
                setattr(self, name, value)
            self._seeds.set_state(seeds)
            self._obs = obs
            self._update_param_arrays(np.arange(n, dtype=np.int64))
            self.set_env_state(state["data"])
        except Exception:
            for name, value in saved.items():
                setattr(self, name, value)
            self._seeds.set_state(saved_seeds)
            self._obs = saved_obs
            self._update_param_arrays(np.arange(n, dtype=np.int64))
            self.set_env_state(saved_data)
            raise

    # ---------------------------------------------------------------------- helpers

    def _per_instance(self, value: Any, what: str) -> list[Mapping[str, Any]]:
        if value is None:
            return [{}] * self.num_envs
        if isinstance(value, Mapping):
            return [dict(value)] * self.num_envs
        if isinstance(value, Sequence) and not isinstance(value, str | bytes):
            if len(value) != self.num_envs or not all(isinstance(v, Mapping) for v in value):
                raise ValueError(
                    f"{what} must be one mapping or {self.num_envs} mappings (one per instance), "
                    f"got a sequence of {len(value)}"
                )
            return [dict(v) for v in value]
        raise TypeError(
            f"{what} must be a mapping or a sequence of mappings, got {type(value).__name__}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={self.num_envs})"


@dataclass(frozen=True)
class PendingStep:
    """A started subset step: ``finish()`` waits for it and returns the step hook's
    tuple; ``drain()`` (if any) only waits for background work, after a failure."""

    finish: Callable[[], tuple[Any, Any, Any, list[dict[str, Any]] | None]]
    drain: Callable[[], object] | None = None


def _take_rows(x: Any, ids: np.ndarray) -> Any:
    if isinstance(x, np.ndarray):
        return x[ids]
    import torch

    return x[torch.as_tensor(ids, device=x.device)]


def _split(step: BatchStep, k: int) -> tuple[BatchStep, BatchStep]:
    """The first ``k`` rows of ``step`` and the rest."""

    def part(sl: slice) -> BatchStep:
        return BatchStep(
            obs=step.obs[sl],
            reward=step.reward[sl],
            terminated=step.terminated[sl],
            truncated=step.truncated[sl],
            final_obs=step.final_obs[sl],
            env_ids=step.env_ids[sl],
            infos=step.infos[sl],
        )

    return part(slice(0, k)), part(slice(k, None))


def _concat(parts: list[BatchStep], xp: Any) -> BatchStep:
    cat = np.concatenate if xp is np else xp.cat
    return BatchStep(
        obs=cat([p.obs for p in parts]),
        reward=np.concatenate([p.reward for p in parts]),
        terminated=np.concatenate([p.terminated for p in parts]),
        truncated=np.concatenate([p.truncated for p in parts]),
        final_obs=cat([p.final_obs for p in parts]),
        env_ids=np.concatenate([p.env_ids for p in parts]),
        infos=[info for p in parts for info in p.infos],
    )


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):
        return np.asarray(x.detach().cpu().numpy())
    return np.asarray(x)


def _per_env_array(state: Mapping[str, Any], key: str, dtype: Any, n: int) -> np.ndarray:
    value = np.array(state[key], dtype=dtype)
    if value.shape != (n,):
        raise InvalidState(f"state[{key!r}] must have shape ({n},), got {value.shape}")
    return value


def _per_env_list(state: Mapping[str, Any], key: str, n: int) -> list[Any]:
    value = state[key]
    if not isinstance(value, list | tuple) or len(value) != n:
        got = len(value) if isinstance(value, list | tuple) else type(value).__name__
        raise InvalidState(f"state[{key!r}] must be a list of {n} entries, got {got}")
    return list(value)


def _plain_copy(x: Any) -> Any:
    if x is None:
        return None
    if hasattr(x, "detach"):
        return np.array(x.detach().cpu().numpy(), copy=True)
    return copy.deepcopy(x)


def _scatter(full: Any, ids: np.ndarray, rows: Any) -> Any:
    """A copy of ``full`` with rows ``ids`` replaced by ``rows`` (numpy or torch)."""
    if isinstance(full, np.ndarray):
        out = full.copy()
        out[ids] = rows
        return out
    if hasattr(full, "clone"):
        import torch

        out = full.clone()
        out[torch.as_tensor(ids, device=full.device)] = rows
        return out
    raise TypeError(
        f"observations must be numpy arrays or torch tensors, got {type(full).__name__}"
    )


def _array_or_raise(actions: Any, shape: tuple[int, ...]) -> np.ndarray:
    try:
        arr = np.asarray(actions)
    except (TypeError, ValueError) as exc:
        raise InvalidAction(
            f"actions must be array-like with shape {shape}, got {actions!r}"
        ) from exc
    if arr.shape != shape:
        raise InvalidAction(f"actions must have shape {shape}, got shape {arr.shape}")
    return arr


def _torch_dtype(torch: Any, dtype: Any) -> Any:
    return {np.float32: torch.float32, np.float64: torch.float64}.get(
        np.dtype(dtype).type, torch.float32
    )


def _copy_params(params: Params) -> Params:
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in params.items()}


def _compile_sampler(
    resolved: Mapping[str, Distribution | Any],
) -> Callable[[np.random.Generator], Params]:
    """A sampler equal to ``sample_params(resolved, rng)`` draw for draw, bit for bit.

    When every randomized parameter is a scalar ``Uniform``/``LogUniform``, their draws
    come from one ``rng.random(k)`` call: ``Generator.uniform(lo, hi)`` is
    ``lo + (hi - lo) * next_double`` on the same stream, so the values (and the clipping
    into the bounds that :meth:`Distribution.sample` applies) are the same doubles.
    Anything else falls back to :func:`sample_params`.
    """
    plan: list[tuple[str, int, float, float, float, float]] = []
    fixed: dict[str, Any] = {}
    for name, spec in resolved.items():
        if type(spec) is Uniform and spec.shape == ():
            lo, hi = float(spec.low), float(spec.high)  # type: ignore[arg-type]
            plan.append((name, 0, lo, hi - lo, lo, hi))
        elif type(spec) is LogUniform and spec.shape == ():
            lo64, hi64 = np.float64(spec.low), np.float64(spec.high)  # type: ignore[arg-type]
            log_lo, log_hi = float(np.log(lo64)), float(np.log(hi64))
            plan.append((name, 1, log_lo, log_hi - log_lo, float(lo64), float(hi64)))
        elif isinstance(spec, Distribution | np.ndarray):
            return lambda rng: sample_params(resolved, rng)
        else:
            fixed[name] = spec
    order = list(resolved)
    count = len(plan)

    def sample(rng: np.random.Generator) -> Params:
        out: Params = dict(fixed)
        draws = rng.random(count).tolist() if count else []
        for (name, kind, start, width, lo, hi), u in zip(plan, draws, strict=True):
            value = start + width * u
            if kind == 1:
                value = float(np.exp(value))
            out[name] = min(max(value, lo), hi)
        return {name: out[name] for name in order}

    return sample
