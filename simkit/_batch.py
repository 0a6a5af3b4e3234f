"""``simkit.BatchEnv``: the author writes reset/step over arrays of N instances.

A :class:`BatchEnv` is a ``gymnasium.vector.VectorEnv``: learners and Gymnasium vector
wrappers take it directly. The base class owns the contract, per instance: the random
stream of ``Generator(PCG64(episode_seed(root, i, k)))`` for instance ``i``'s episode
``k``, kept as keyed streams (:class:`simkit._seeding.StreamTable`: every draw a pure
function of key and draw index, computed for all resetting instances at once),
declared randomization, the time limit, typed autoreset and snapshots. So instance
``i`` of a batch behaves bit for bit like a single-instance env reset with
``episode_seed(root, i, k)`` for its ``k``-th episode, with no per-instance Python
work on the hot path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from simkit._batch_actions import check_torch_actions
from simkit._batch_contract import BATCH_STATE_FORMAT, BatchContract, Sampler
from simkit._batch_gym import GymStepAdapter, scatter
from simkit._batch_queue import BatchQueue, PendingStep, RowInfos, take_rows, to_numpy
from simkit._contract import check_max_episode_steps
from simkit._seeding import EpisodeSeeds, StreamTable
from simkit._types import BatchStep
from simkit._validation import validate_action
from simkit.errors import InvalidAction, ResetNeeded
from simkit.randomization import Distribution, Params, resolve_overrides
from simkit.registry import EnvKind
from simkit.vector._actions import check_batch_array

__all__ = ["BatchEnv", "BATCH_STATE_FORMAT"]

_MODES = (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP)


class BatchEnv(BatchContract, BatchQueue, GymStepAdapter, gym.vector.VectorEnv[Any, Any, Any]):
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
            sampled per instance per episode from that instance's stream.
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
            self.max_episode_steps = check_max_episode_steps(max_episode_steps)
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
        compiled: dict[int, Sampler] = {}
        self._samplers = [
            compiled.setdefault(
                id(overrides), Sampler(resolve_overrides(self.randomization, overrides))
            )
            for overrides in self._env_overrides
        ]
        n = self.num_envs
        self._seeds = EpisodeSeeds(n)
        self._streams = StreamTable(n)
        self._all_streams = self._streams.rows(np.arange(n, dtype=np.int64))
        self._params: dict[int, Params] = {i: {} for i in range(n)}
        self.param_arrays: dict[str, np.ndarray] = {}
        self._param_block: tuple[tuple[str, ...], np.ndarray] | None = None
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
    ) -> tuple[Any, list[dict[str, Any]] | None]:
        """Starts an episode for the instances ``ids`` (sorted int64 indices).

        ``rngs`` are the instances' random streams (row ``k`` is instance ``ids[k]``'s)
        and ``params[k]`` its parameters; :attr:`param_arrays` already holds the new
        values. Draw the initial states for all rows at once with ``rngs.uniform`` /
        ``rngs.random`` (row ``k`` gets what instance ``ids[k]``'s own generator would
        give a single-instance env making the same calls, in the same order);
        ``rngs[k]`` is that ``np.random.Generator`` itself, for other draws (slower).

        Returns:
            ``(len(ids), *obs_shape)`` first observations and one info dict per row, or
            ``None`` for none.
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
            return self.step_instances(actions, self._all_streams)
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

    @property
    def seeds(self) -> EpisodeSeeds:
        """The episode seeding of the N instances (set ``seeds.env_offset`` before a
        ``reset(seed=...)`` to seed them as envs ``offset..offset+N-1`` of a larger set)."""
        return self._seeds

    def _start_subset(self, ids: np.ndarray, actions: Any) -> PendingStep:
        """Starts stepping ``ids``; simulator bases start native work in the background.

        The default defers the whole step to :meth:`recv` (runs it on the calling thread).
        """
        rngs = self._streams.rows(ids)
        return PendingStep(finish=lambda: self.step_subset(ids, actions, rngs))

    def _prepare_instances(self, ids: np.ndarray) -> None:
        """Runs before ``reset_instances``; simulator bases reset physics here."""
        del ids

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
    ) -> tuple[np.ndarray, RowInfos]:
        self._require_idle("reset()")
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"reset options must be a dict or None, got {type(options).__name__}")
        opts = dict(options or {})
        mask = opts.pop("reset_mask", None)
        if mask is None:
            ids = np.arange(self.num_envs, dtype=np.int64)
        else:
            mask_arr = to_numpy(mask)
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
            self._obs = scatter(self._obs, ids, obs_rows)
        self._pending_reset[ids] = False
        self._has_reset = True
        return ids, infos

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
            obs=take_rows(step.obs, back),
            reward=step.reward[back],
            terminated=step.terminated[back],
            truncated=step.truncated[back],
            final_obs=take_rows(step.final_obs, back),
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
        infos: Sequence[dict[str, Any]],
    ) -> BatchStep:
        """Truncation and same-step autoreset of the stepped rows ``ids`` (sorted)."""
        truncated = self._truncated(ids)
        done = terminated | truncated
        obs = final_obs
        if done.any():
            rows = done.nonzero()[0]
            whole = len(ids) == self.num_envs  # ids is arange(N): rows are the instances
            reset_rows, reset_infos = self._reset_ids(rows if whole else ids[rows], None, {})
            obs = scatter(final_obs, rows, reset_rows)

            def reset_info(k: int) -> dict[str, Any] | None:
                j = int(np.searchsorted(rows, k))
                return {"reset_info": reset_infos[j]} if j < len(rows) and rows[j] == k else None

            infos = RowInfos(len(ids), infos, reset_info)
        self._obs = obs if len(ids) == self.num_envs else scatter(self._obs, ids, obs)
        return BatchStep(
            obs=obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
            env_ids=ids,
            infos=infos,
        )

    def _step_all(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, RowInfos]:
        result = self.step_instances(actions, self._all_streams)
        return self._checked(result, self.num_envs, "step_instances")

    def _checked(
        self, result: tuple[Any, Any, Any, list[dict[str, Any]] | None], n: int, hook: str
    ) -> tuple[Any, np.ndarray, np.ndarray, RowInfos]:
        obs, reward, terminated, infos = result
        reward_np = to_numpy(reward).astype(np.float64, copy=False)
        term_np = to_numpy(terminated).astype(np.bool_, copy=False)
        if reward_np.shape != (n,) or term_np.shape != (n,):
            raise ValueError(
                f"{type(self).__name__}.{hook} must return reward and terminated of "
                f"shape ({n},), got {reward_np.shape} and {term_np.shape}"
            )
        if infos is not None and len(infos) != n:
            raise ValueError(
                f"{type(self).__name__}.{hook} must return {n} info dicts or None, got {len(infos)}"
            )
        return obs, reward_np.copy(), term_np.copy(), RowInfos(n, infos)

    # ------------------------------------------------------------ action validation

    def check_actions(self, actions: Any, num_rows: int | None = None) -> Any:
        """Validates a batch of actions (``num_rows`` rows, default N); canonical form.

        ``Box`` and ``Discrete`` single action spaces take a vectorised fast path
        (numpy, :func:`simkit.vector._actions.check_batch_array`, or torch); other
        spaces are checked row by row with :func:`simkit.validate_action`.

        Raises:
            InvalidAction: wrong shape, dtype, a NaN/inf, or out of range; the message
                names the offending rows.
        """
        space = self.single_action_space
        n = self.num_envs if num_rows is None else num_rows
        if self.xp is not np:
            return check_torch_actions(self.xp, space, actions, n, self.action_bounds, self.device)
        row_ids = self._all_streams.ids if n == self.num_envs else np.arange(n)
        arr = check_batch_array(space, actions, row_ids, self.action_bounds, "rows")
        if arr is not None:
            return arr
        rows = list(actions)
        if len(rows) != n:
            raise InvalidAction(f"actions must hold {n} rows, got {len(rows)}")
        return [
            validate_action(space, a, bounds=self.action_bounds, name=f"actions[{i}]")
            for i, a in enumerate(rows)
        ]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={self.num_envs})"
