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
from dataclasses import replace
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from simkit._batch_actions import check_torch_actions
from simkit._batch_contract import BATCH_STATE_FORMAT, BatchContract, Sampler
from simkit._batch_device import (
    DEFAULT_WINDOW,
    DeviceDraws,
    DeviceLoop,
    DeviceRowInfos,
    NoStepDraws,
    check_step_shapes,
)
from simkit._batch_gym import GymStepAdapter, scatter
from simkit._batch_names import check_author_names, reserved_names
from simkit._batch_queue import BatchQueue, PendingStep, RowInfos, take_rows, to_numpy
from simkit._contract import EnvKind, check_max_episode_steps
from simkit._seeding import EpisodeSeeds, StreamTable
from simkit._types import BatchStep
from simkit._validation import validate_action
from simkit.errors import InvalidAction, ResetNeeded
from simkit.randomization import Distribution, Params, resolve_overrides
from simkit.vector._actions import check_batch_array

__all__ = ["BatchEnv", "BATCH_STATE_FORMAT"]

_MODES = (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP)


class BatchEnv(BatchContract, BatchQueue, GymStepAdapter, gym.vector.VectorEnv[Any, Any, Any]):
    """N instances of one environment, stepped as arrays by the author's code.

    Authors call ``super().__init__(num_envs, single_observation_space=...,
    single_action_space=..., **kwargs)`` and implement two hooks:

    - :meth:`reset_instances` ``(ids, rngs, params, options) -> (obs_rows, infos)``
      (declared with the reset path it serves, in :class:`~simkit._batch_contract.BatchContract`)
    - :meth:`step_instances` ``(actions, rngs) -> (obs, reward, terminated, infos)``

    plus either ``state_attributes`` (attributes holding per-instance arrays) or
    ``get_env_state``/``set_env_state``. Arrays are numpy by default; with
    ``device`` set, :attr:`xp` is ``torch``, the author's arrays are tensors on that
    device, and :meth:`step_batch` returns observations, rewards and flags as tensors
    there; with the optional masked hook :meth:`reset_masked` a whole-batch step never
    synchronises with the host (:mod:`simkit._batch_device`).

    Class attributes:
        randomization: parameter name to :class:`~simkit.randomization.Distribution`,
            sampled per instance per episode from that instance's stream.
        max_episode_steps: default time limit (``None`` for none).
        state_attributes: names of attributes holding the batch's dynamic state.
        time_limit_only: ``True`` where the step hooks never terminate an episode (only
            the time limit ends one): which instances reset is then known on the host
            from the step counts, so a torch batch's whole-batch steps never read the
            device even without :meth:`reset_masked` (the host runs the exact reset
            of those instances; :meth:`_host_known_resets`).
        single_env: the single-instance env this batch equals instance by instance (a
            registered id, an env class or a zero-argument factory), or ``None``: the
            conformance kit (``check_batch_singles``) then checks that instance ``i``
            is bit for bit that env reset with ``episode_seed(root, i, k)``.

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
    time_limit_only: ClassVar[bool] = False
    single_env: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuses a subclass that reuses a private name of the base classes
        (:meth:`reserved_names`), at its definition instead of at its first step."""
        super().__init_subclass__(**kwargs)
        check_author_names(cls)

    @classmethod
    def reserved_names(cls) -> list[str]:
        """The private names (``_obs``, ``_params``, ...) the base classes of this batch
        keep their state in: a subclass may not define them nor assign them on ``self``
        (``TypeError`` when the class is defined)."""
        return sorted(reserved_names(cls))

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
        self._device_loop: DeviceLoop | None = None
        self._device_ready = False
        self._device_sampler: Sampler | None = None
        self._reset_draws_known = False
        self._all_ids = np.arange(n, dtype=np.int64)

    # ------------------------------------------------------------ author helpers

    def as_array(self, arr: np.ndarray) -> Any:
        """``arr`` as this batch computes: itself with numpy, a float64 tensor on
        :attr:`device` with torch (what an author's hooks keep their state in)."""
        if self.xp is np:
            return arr
        return self.xp.as_tensor(arr, dtype=self.xp.float64, device=self.device)

    def param_columns(self) -> dict[str, Any]:
        """The ``(N,)`` column of each declared parameter, as :meth:`as_array` gives it
        (numpy: the live columns of :attr:`param_arrays` themselves; torch: a copy on
        the device, to take again after a reset changed them)."""
        if self.xp is np:
            return self.param_arrays
        return {name: self.as_array(arr) for name, arr in self.param_arrays.items()}

    # ----------------------------------------------------------------- author hooks

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

    def reset_masked(self, mask: Any, draws: DeviceDraws, params: dict[str, Any]) -> Any:
        """Starts an episode for the instances where ``mask`` is true, on the device
        (optional; torch batches only): what makes :meth:`step_batch` device-resident.

        Called in every device-resident step, with every row, so that nothing depends on
        how many instances reset (no host synchronisation): update the state with
        ``torch.where(mask[:, None], new_rows, old_rows)`` and return the first
        observations of all N rows (only the masked ones are used).

        Args:
            mask: ``(N,)`` bool tensor, the instances starting a new episode.
            draws: their streams' next draws after the parameters: ``draws.uniform(low,
                high, size)`` / ``draws.random(size)`` give row ``i`` what
                ``rngs.uniform``/``rngs.random`` give instance ``i`` in
                :meth:`reset_instances` (same calls, same order, same bits).
            params: parameter name to ``(N,)`` float64 tensor, every numeric parameter
                of every row, the new values on the masked rows (live tensors the base
                class updates in place; keep them for the step hooks).

        Returns:
            ``(N, *obs_shape)`` first observations.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement reset_masked()")

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
        self._host_sync()
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
        self._prepare_next_episodes()
        if self._device_loop is not None:
            self._device_loop.restart(ids)
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
            ``env_ids``. With a device, ``obs``, ``final_obs``, ``reward`` and the flags
            are tensors on it; a whole-batch step of a class with :meth:`reset_masked`
            never reads the device (docs/batch_device.md, "Device-resident steps").

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
            if self.xp is not np and self._device_steps():
                return self._step_device(actions)
            if self.xp is not np and self._host_known_resets():
                return self._step_known_resets(actions)
            self._host_sync()
            final_obs, reward, terminated, infos = self._step_all(actions)
            step = self._complete(
                np.arange(self.num_envs, dtype=np.int64), final_obs, reward, terminated, infos
            )
            return step if self.xp is np else self._on_device(step)
        self._host_sync()
        ids, actions, order = self._sorted_subset(env_ids, actions, "step_batch()")
        pending = self._start_subset(ids, actions)
        try:
            step = self._finish_subset(ids, pending)
        except BaseException:
            if pending.drain is not None:
                pending.drain()
            raise
        if order is not None:
            back = np.argsort(order)
            step = BatchStep(
                obs=take_rows(step.obs, back),
                reward=step.reward[back],
                terminated=step.terminated[back],
                truncated=step.truncated[back],
                final_obs=take_rows(step.final_obs, back),
                env_ids=step.env_ids[back],
                infos=[step.infos[k] for k in back.tolist()],
            )
        return step if self.xp is np else self._on_device(step)

    def _on_device(self, step: BatchStep) -> BatchStep:
        """A host-path step of a torch batch with its rewards and flags as device
        tensors, like a device-resident step's."""
        xp, device = self.xp, self.device
        return replace(
            step,
            reward=xp.as_tensor(step.reward, device=device),
            terminated=xp.as_tensor(step.terminated, device=device),
            truncated=xp.as_tensor(step.truncated, device=device),
        )

    # --------------------------------------------------------- device-resident steps

    def _device_steps(self) -> bool:
        """Whether whole-batch steps can stay on the device: the class has
        :meth:`reset_masked`, every instance is under one root seed with one sampler of
        scalar parameters, and no stream is held as a generator."""
        if self._device_ready:
            return True
        if type(self).reset_masked is BatchEnv.reset_masked:
            return False
        samplers = self._sampler_groups()[0]
        if (
            not self._reset_draws_known  # how many draws a reset takes (learnt by one)
            or self._seeds._shared_root is None
            or len(samplers) != 1
            or not samplers[0].fast
            or self._streams.live
            or any(arr.ndim != 1 for arr in self.param_arrays.values())
            or any(name not in self.param_arrays for name in samplers[0].names)
        ):
            return False
        self._device_push(samplers[0])
        return True

    def _device_push(self, sampler: Sampler, width: int = DEFAULT_WINDOW) -> None:
        """Loads the host state onto the device and computes the key window."""
        loop = self._device_loop
        if loop is None:
            loop = self._device_loop = DeviceLoop(self.xp, self.device, self.num_envs)
        streams = self._streams
        loop.push(
            self._elapsed,
            self._seeds.episode,
            streams.states,
            streams.pos,
            self.param_arrays,
            sampler.names,
        )
        self._params.clear()  # one fast sampler: every row's params rebuild from the arrays
        self._device_sampler = sampler
        self._device_window(width)
        self._device_ready = True

    def _device_window(self, width: int) -> None:
        """Next-episode keys of every instance for up to ``width`` steps on the device,
        from the host's episode counters (read back from the device when it is ahead):
        each instance's ring of next episodes gets the episodes it lacks, computed on the
        host (the numpy path's rows) and uploaded, and covers ``width`` steps or as many
        as it holds."""
        loop = self._device_loop
        assert loop is not None
        episode = loop.pull_counters() if loop.ahead else self._seeds.episode
        sampler = self._device_sampler
        assert sampler is not None
        m = len(sampler.names)
        draws = max(self._streams.prefetch, m)
        scale = sampler if m else None
        seeds = self._seeds

        def rows_of(envs: np.ndarray, episodes: np.ndarray) -> np.ndarray:
            return seeds.rows(envs, episodes, draws, scale)

        key = (seeds._shared_root, seeds.env_offset, draws, scale)
        loop.load_ring(episode + 1, width, key, 4 + draws, rows_of, m)

    def prepare_device_steps(self, steps: int) -> bool:
        """Makes the next ``steps`` whole-batch :meth:`step_batch` calls of a torch batch
        run without any host synchronisation (call it once per fragment): loads the
        state onto the device if a host operation changed it, and the keys of every
        episode the instances can reach in those steps (reading the episode counters
        back once). Each instance's ring of next episodes holds up to
        ``MAX_WINDOW`` of them (fewer for a batch too large for ``MAX_RING_BYTES``):
        for a longer fragment it covers as many steps as it holds and the batch reads
        the counters again when they run out. Without this call a device-resident
        batch refills every 32 steps.

        Returns:
            Whether steps are device-resident (a torch batch whose class has
            :meth:`reset_masked`, one root seed, scalar parameters); ``False`` means
            they run through the host path.

        Raises:
            ValueError: ``steps`` < 1.
            ResetNeeded: before the first :meth:`reset`.
        """
        if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        if not self._has_reset:
            raise ResetNeeded("prepare_device_steps() called before reset(); call reset() first")
        self._require_idle("prepare_device_steps()")
        if self.xp is np:
            return False
        if not self._device_steps():
            if not self._host_known_resets():
                return False
            self._stats_loop()
            return True
        loop = self._device_loop
        assert loop is not None
        if loop.steps_left < steps:
            self._device_window(max(int(steps), DEFAULT_WINDOW))
        return True

    def _step_device(self, actions: Any) -> BatchStep:
        """A whole-batch step that never waits on the device (see :mod:`simkit._batch_device`)."""
        loop = self._device_loop
        assert loop is not None
        if loop.steps_left <= 0:
            self._device_window(DEFAULT_WINDOW)  # one read of the counters per window
        n = self.num_envs
        final_obs, reward, terminated, base = self._device_step_instances(actions, NoStepDraws(n))
        xp = self.xp
        truncated, done, new, draws, params = loop.step(reward, terminated, self.max_episode_steps)
        reset_obs = self.reset_masked(done, draws, params)
        loop.took(done, loop.param_draws + draws.taken)
        obs = xp.where(done.view(n, *([1] * (final_obs.dim() - 1))), reset_obs, final_obs)
        sampler = self._device_sampler
        assert sampler is not None
        infos = DeviceRowInfos(
            n, base, done, new, lambda k, values: sampler.row([float(v) for v in values])
        )
        return self._step_result(
            self._all_ids, obs, reward, terminated, truncated, final_obs, infos
        )

    def _device_step_instances(self, actions: Any, draws: Any) -> tuple[Any, Any, Any, Any]:
        """``step_instances`` of the whole batch with rewards (float64) and terminations
        (bool) as tensors on the device, their shapes and the info list checked."""
        n = self.num_envs
        final_obs, reward, terminated, base = self.step_instances(actions, draws)
        xp = self.xp
        reward = xp.as_tensor(reward, device=self.device).to(xp.float64)
        terminated = xp.as_tensor(terminated, device=self.device).to(xp.bool)
        check_step_shapes(reward, terminated, n, type(self).__name__, "step_instances")
        if base is not None and len(base) != n:
            raise ValueError(
                f"{type(self).__name__}.step_instances must return {n} info dicts or None, "
                f"got {len(base)}"
            )
        return final_obs, reward, terminated, base

    def _host_known_resets(self) -> bool:
        """Whether whole-batch steps of this torch batch keep rewards and flags on the
        device with the resets scheduled on the host: the class declares
        :attr:`time_limit_only` and there is a time limit, so the instances that reset
        in a step are those whose host step count reaches it."""
        return self.time_limit_only and self.max_episode_steps is not None

    def _stats_loop(self) -> DeviceLoop:
        """The device loop that keeps the episode statistics (made on first use)."""
        loop = self._device_loop
        if loop is None:
            loop = self._device_loop = DeviceLoop(self.xp, self.device, self.num_envs)
        return loop

    def _step_known_resets(self, actions: Any) -> BatchStep:
        """A whole-batch step of a :attr:`time_limit_only` torch batch that reads
        nothing back: truncation from the host step counts, and the instances that
        reach the time limit reset on the host (the same keyed draws and the same
        ``reset_instances`` as the host path: the same bits), their start states
        uploaded; rewards and the episode statistics stay on the device."""
        self._host_sync()
        loop = self._stats_loop()
        n = self.num_envs
        final_obs, reward, terminated, base = self._device_step_instances(
            actions, self._all_streams
        )
        xp = self.xp
        done = self._truncated()
        loop.record_known(reward, done, self._elapsed)
        obs: Any = final_obs
        infos = RowInfos(n, base)
        truncated = xp.zeros(n, dtype=xp.bool, device=self.device)
        if done.any():
            obs, infos = self._autoreset(self._all_ids, final_obs, done.nonzero()[0], base)
            truncated = xp.as_tensor(done, device=self.device)
        return self._step_result(
            self._all_ids, obs, reward, terminated, truncated, final_obs, infos
        )

    def _host_sync(self) -> None:
        """Brings the host copies of the contract up to date after device-resident steps
        (one read back), before a host-side operation; later steps load them again."""
        loop = self._device_loop
        if loop is not None and loop.ahead:
            self._elapsed = loop.elapsed.cpu().numpy().copy()
            self._seeds.episode = loop.episode.cpu().numpy().copy()
            self._streams.states = loop.states.cpu().numpy().view(np.uint64).copy()
            self._streams.pos = loop.pos.cpu().numpy().copy()
            self._streams.version += 1
            values = loop.params.cpu().numpy()
            for j, name in enumerate(loop.names):
                self.param_arrays[name][...] = values[:, j]
            self._params.clear()
            loop.ahead = False
        self._device_ready = False

    def read_episode_stats(self) -> dict[str, np.ndarray]:
        """The episodes completed since the last call, per instance, and clears them:
        ``episodes`` (int64 count), ``return_sum`` (float64) and ``length_sum`` (int64).
        Kept on the device by device-resident steps (host-path subset steps add theirs;
        an episode cut by :meth:`reset` is not counted). One read back from the device:
        call it once per fragment, not per step.

        Raises:
            RuntimeError: not a device-resident torch batch.
        """
        loop = self._device_loop
        if loop is None:
            raise RuntimeError(
                f"{type(self).__name__} keeps episode statistics only in device-resident "
                "steps (a torch batch with reset_masked() or time_limit_only)"
            )
        torch = self.xp
        both = torch.stack([loop.count, loop.return_sum.view(torch.int64), loop.length_sum])
        host = both.cpu().numpy().copy()  # the one read back (float64 bits in row 1)
        out = {"episodes": host[0], "return_sum": host[1].view(np.float64), "length_sum": host[2]}
        loop.count.zero_()
        loop.return_sum.zero_()
        loop.length_sum.zero_()
        return out

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

    def _finish_subset(self, ids: np.ndarray, pending: PendingStep) -> BatchStep:
        """Waits for the started step of ``ids`` (sorted), checks what its hook returned
        and completes it (truncation, same-step autoreset)."""
        return self._complete(ids, *self._checked(pending.finish(), len(ids), "step_subset"))

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
        if self._device_loop is not None:  # a torch batch between device-resident steps
            self._device_loop.record(ids, reward, done, self._elapsed[ids])
        obs = final_obs
        if done.any():
            obs, infos = self._autoreset(ids, final_obs, done.nonzero()[0], infos)
        return self._step_result(ids, obs, reward, terminated, truncated, final_obs, infos)

    def _autoreset(
        self,
        ids: np.ndarray,
        final_obs: Any,
        rows: np.ndarray,
        base: Sequence[dict[str, Any]] | None,
    ) -> tuple[Any, RowInfos]:
        """Same-step autoreset of the ended ``rows`` of a step of instances ``ids``
        (sorted): the step's ``obs`` (``final_obs`` with those rows' first observations)
        and its infos (``base`` with each reset row's ``reset_info``)."""
        whole = len(ids) == self.num_envs  # ids is arange(N): rows are the instances
        reset_rows, reset_infos = self._reset_ids(rows if whole else ids[rows], None, {})

        def reset_info(k: int) -> dict[str, Any] | None:
            j = int(np.searchsorted(rows, k))
            return {"reset_info": reset_infos[j]} if j < len(rows) and rows[j] == k else None

        return scatter(final_obs, rows, reset_rows), RowInfos(len(ids), base, reset_info)

    def _step_result(
        self,
        ids: np.ndarray,
        obs: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        final_obs: Any,
        infos: Sequence[dict[str, Any]],
    ) -> BatchStep:
        """The step of instances ``ids`` (sorted); their ``obs`` become the batch's."""
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
