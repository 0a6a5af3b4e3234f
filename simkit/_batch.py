"""``simkit.BatchEnv``: the author writes reset/step over arrays of N instances.

A :class:`BatchEnv` is a ``gymnasium.vector.VectorEnv``: learners and Gymnasium vector
wrappers take it directly. The base class owns the contract, per instance: the random
stream of ``Generator(PCG64(episode_seed(root, i, k)))`` for instance ``i``'s episode
``k``, kept as keyed streams (:class:`simkit._seeding.StreamTable`: every draw a pure
function of key and draw index, computed for all resetting instances at once),
declared randomization (:mod:`simkit._batch_params`), the time limit, typed autoreset
and snapshots; and the ways to step: whole batches, subsets, EnvPool-style
``send``/``recv`` and Gymnasium's ``step()``. So instance ``i`` of a batch behaves bit
for bit like a single-instance env reset with ``episode_seed(root, i, k)`` for its
``k``-th episode, with no per-instance Python work on the hot path.

The base class keeps all its state in one attribute, ``_simkit`` (:class:`BatchState`),
and names its helpers ``__name`` (mangled to ``_BatchEnv__name``), so an author's
subclass may use any other name (:mod:`simkit._batch_names`).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from simkit._batch_actions import check_torch_actions
from simkit._batch_device import DEFAULT_WINDOW, DeviceDraws, DeviceLoop, NoStepDraws, device_infos
from simkit._batch_names import check_author_names, reserved_names
from simkit._batch_params import ParamRows, Sampler, copy_params
from simkit._batch_rows import (
    RowInfos,
    concat_steps,
    host_arrays,
    host_rows,
    scatter,
    take_rows,
    take_step,
    to_numpy,
)
from simkit._contract import (
    EnvKind,
    action_bounds_of,
    check_max_episode_steps,
    check_state_limit,
    declared_state_attributes,
)
from simkit._seeding import EpisodeSeeds, KeyedStreams, ResetSeed, StreamTable
from simkit._state import (
    check_envelope,
    check_observation,
    check_state_attributes,
    is_tag,
    state_array,
)
from simkit._types import BatchStep, RowStep
from simkit._validation import ActionBounds, check_send_ids, validate_action
from simkit.errors import InvalidAction, InvalidState, ResetNeeded
from simkit.randomization import (
    Distribution,
    Params,
    check_params,
    resolve_overrides,
    sample_params,
)
from simkit.vector._actions import check_batch_array
from simkit.vector._build import check_mask, no_sub_env_methods, positive_int

__all__ = ["BATCH_STATE_FORMAT", "BatchEnv", "PendingStep", "Physics"]

BATCH_STATE_FORMAT = 1
"""Version of the snapshot layout produced by :meth:`BatchEnv.get_state`."""

_MODES = (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP)
_STATE_KEYS = {"format", "env", "num_envs", "root_seed", "episode_index", "rngs", "params"}
_STATE_KEYS |= {"elapsed_steps", "pending_reset", "obs", "data"}  # env_offset etc. optional
StepResult = tuple[Any, Any, Any, list[dict[str, Any]] | None]
"""What a step hook returns: ``(obs, reward, terminated, infos)``."""


@dataclass(frozen=True)
class PendingStep:
    """A started step of some instances: ``finish()`` waits for it and returns the step
    hook's tuple; ``drain()`` (if any) only waits for background work, after a failure."""

    finish: Callable[[], StepResult]
    drain: Callable[[], object] | None = None


class Physics:
    """The simulator a batch's instances live in besides the author's arrays: none for a
    plain :class:`BatchEnv` (these defaults), one per backend of
    :class:`~simkit.BatchMujocoEnv`. Kept in the batch's private state."""

    on_host = False
    """Whether it computes on the host: a torch batch then reads every whole-batch
    step's rewards back anyway, so it never schedules resets on the host for
    :attr:`BatchEnv.time_limit_only`."""

    def prepare(self, env: BatchEnv, ids: np.ndarray, params: Sequence[Params]) -> None:
        """Runs before ``reset_instances`` of ``ids`` (sorted), given their new parameters."""

    def start(
        self, env: BatchEnv, ids: np.ndarray, actions: Any, rngs: KeyedStreams
    ) -> PendingStep:
        """Starts stepping ``ids`` (sorted); the default runs the whole step in
        ``finish``, on the thread that calls it."""
        return PendingStep(finish=lambda: env.step_subset(ids, actions, rngs))

    def close(self) -> None:
        """Waits out background work and stops the simulator's threads."""


class BatchState:
    """What the base class keeps of a batch: episode seeds and keyed streams, parameters,
    step counters, the last observations, the send/recv queue, the device loop and the
    physics. One object, under the one attribute name the base class reserves."""

    def __init__(
        self, n: int, overrides: list[Mapping[str, Any]], randomization: Mapping[str, Distribution]
    ) -> None:
        distinct = {id(o): o for o in overrides}  # one sampler per distinct overrides object
        compiled = {k: Sampler(resolve_overrides(randomization, o)) for k, o in distinct.items()}
        self.env_overrides = overrides
        self.samplers = [compiled[id(o)] for o in overrides]
        self.groups = list(compiled.values())
        """The distinct samplers; ``group_of[i]`` is instance ``i``'s index among them."""
        group = {id(smp): g for g, smp in enumerate(self.groups)}
        self.group_of = np.array([group[id(smp)] for smp in self.samplers], dtype=np.int64)
        self.seeds = EpisodeSeeds(n)
        self.streams = StreamTable(n)
        self.all_streams = self.streams.rows(np.arange(n, dtype=np.int64))
        self.all_ids = np.arange(n, dtype=np.int64)
        self.params: dict[int, Params] = {i: {} for i in range(n)}
        """Parameters kept as drawn (slow path, restored); the others are rebuilt from
        ``param_arrays`` and the instance's sampler."""
        self.param_block: tuple[tuple[str, ...], np.ndarray] | None = None
        self.elapsed = np.zeros(n, dtype=np.int64)
        self.pending_reset = np.zeros(n, dtype=np.bool_)
        self.has_reset = False
        self.reset_draws_known = False
        self.obs: Any = None
        self.in_flight = np.zeros(n, dtype=np.bool_)
        self.pending: deque[tuple[np.ndarray, PendingStep]] = deque()
        self.ready: deque[BatchStep] = deque()
        self.device_loop: DeviceLoop | None = None
        self.device_ready = False
        self.device_sampler: Sampler | None = None
        self.physics = Physics()


class BatchEnv(gym.vector.VectorEnv[Any, Any, Any]):
    """N instances of one environment, stepped as arrays by the author's code.

    Authors call ``super().__init__(num_envs, single_observation_space=...,
    single_action_space=..., **kwargs)`` and implement two hooks:

    - :meth:`reset_instances` ``(ids, rngs, params, options) -> (obs_rows, infos)``
    - :meth:`step_instances` ``(actions, rngs) -> (obs, reward, terminated, infos)``

    plus either ``state_attributes`` (attributes holding per-instance arrays) or
    ``get_env_state``/``set_env_state``. Arrays are numpy by default; with
    ``device`` set, :attr:`xp` is ``torch``, the author's arrays are tensors on that
    device, and :meth:`step_batch` returns observations, rewards and flags as tensors
    there; with the optional masked hook :meth:`reset_masked` a whole-batch step never
    synchronises with the host (:mod:`simkit._batch_device`). Every name but
    :meth:`reserved_names` (``_simkit`` and Gymnasium's own) is the author's.

    Class attributes:
        randomization: parameter name to :class:`~simkit.randomization.Distribution`,
            sampled per instance per episode from that instance's stream.
        max_episode_steps: default time limit (``None`` for none).
        state_attributes: names of attributes holding the batch's dynamic state.
        time_limit_only: ``True`` where the step hooks never terminate an episode (only
            the time limit ends one): which instances reset is then known on the host
            from the step counts, so a torch batch's whole-batch steps never read the
            device even without :meth:`reset_masked` (the host runs the exact reset
            of those instances).
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
    call, get_attr, set_attr = no_sub_env_methods("batch")  # one env, not N sub-envs

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuses a subclass that reuses a reserved name (:meth:`reserved_names`), at
        its definition instead of at its first step."""
        super().__init_subclass__(**kwargs)
        check_author_names(cls)

    @classmethod
    def reserved_names(cls) -> list[str]:
        """The private names the base classes keep their state in (``_simkit``, and
        Gymnasium's ``_np_random``, ...): a subclass may not define them nor assign
        them on ``self`` (``TypeError`` when the class is defined)."""
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
        self.num_envs = positive_int(num_envs, "num_envs")
        if max_episode_steps is not None:
            self.max_episode_steps = check_max_episode_steps(max_episode_steps)
        mode = AutoresetMode(autoreset_mode)
        if mode not in _MODES:
            raise ValueError(
                f"autoreset_mode must be SAME_STEP or NEXT_STEP, got {mode}: a BatchEnv steps "
                "every instance, so an ended one cannot wait for its reset (a VectorEnv can)"
            )
        batch_size = self.num_envs if batch_size is None else batch_size
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
        overrides = _per_instance(params, self.num_envs, "params")
        self.param_arrays: dict[str, np.ndarray] = {}
        self._simkit = BatchState(self.num_envs, overrides, self.randomization)

    # ------------------------------------------------------------------- properties

    @property
    def params(self) -> list[Params]:
        """Each instance's randomized parameters of its current episode (a copy)."""
        self.__host_sync()
        return [self.__param_row(i) for i in range(self.num_envs)]

    @property
    def elapsed_steps(self) -> np.ndarray:
        """Steps taken in each instance's current episode (a copy)."""
        self.__host_sync()
        return self._simkit.elapsed.copy()

    @property
    def episode_index(self) -> np.ndarray:
        """Each instance's episode number under the current root seed (a copy)."""
        self.__host_sync()
        return self._simkit.seeds.episode.copy()

    @property
    def root_seed(self) -> int | list[int | None] | None:
        """The root seed instance seeds derive from: one int while every instance shares
        it, else each instance's (a masked or list reset gave them their own; ``None``
        for one reset with an exact seed), as the batch's snapshot writes it."""
        return self._simkit.seeds.batch_root()

    @property
    def seeds(self) -> EpisodeSeeds:
        """The episode seeding of the N instances (set ``seeds.env_offset`` before a
        ``reset(seed=...)`` to seed them as envs ``offset..offset+N-1`` of a larger set)."""
        return self._simkit.seeds

    @property
    def action_bounds(self) -> ActionBounds:
        """The declared out-of-bounds policy for continuous actions."""
        return action_bounds_of(self.metadata)

    @property
    def subset_steps(self) -> bool:
        """Whether :meth:`step_batch` and :meth:`send` take a subset of the instances
        (the class implements :meth:`step_subset`)."""
        return type(self).step_subset is not BatchEnv.step_subset

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
            return self.step_instances(actions, self._simkit.all_streams)
        raise _no_subset(self, len(ids), "step_batch() or send()")

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

    def get_env_state(self) -> dict[str, Any]:
        """The author's dynamic state as plain data; defaults to ``state_attributes``."""
        names = declared_state_attributes(self, "get_env_state")
        return {name: _plain_copy(getattr(self, name)) for name in names}

    def set_env_state(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`get_env_state` returned; defaults to ``state_attributes``."""
        names = declared_state_attributes(self, "set_env_state")
        check_state_attributes(
            type(self).__name__, names, state, lambda name: getattr(self, name, None)
        )
        for name in names:
            value = _restore_like(self.xp, self.device, getattr(self, name, None), state[name])
            setattr(self, name, value)

    # ------------------------------------------------------------------------ reset

    def reset(
        self, *, seed: ResetSeed = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets instances (all, or ``options["reset_mask"]``); Gymnasium-style infos.

        Args:
            seed: the root seed: instance ``i`` starts episode 0 with
                ``episode_seed(seed, i, 0)``. Gymnasium's list of N ``int | None`` (or
                a 1-D int array): instance ``i`` starts with exactly ``seed[i]`` and
                later continues its own stream, as a VectorEnv's env. ``None``
                continues: each reset instance starts its next episode.
            options: ``{"params": overrides}`` (one mapping or N mappings) for this
                reset, ``{"reset_mask": (N,) bool}`` to reset only some instances;
                other keys are passed to :meth:`reset_instances`.
        """
        ids, infos = self.__reset(seed, options)
        vector_info: dict[str, Any] = {}
        for k, i in enumerate(ids):
            vector_info = self._add_info(vector_info, infos[k], int(i))
        return self._simkit.obs, vector_info

    def async_reset(self, *, seed: ResetSeed = None, options: dict[str, Any] | None = None) -> None:
        """Resets (as :meth:`reset`) and queues the reset instances as ready for :meth:`recv`."""
        s = self._simkit
        ids, infos = self.__reset(seed, options)
        obs = take_rows(s.obs, ids)
        k = len(ids)
        flags = np.zeros(k, dtype=np.bool_)
        rows = [{"reset_info": info} for info in infos]
        s.ready.append(BatchStep(obs, np.zeros(k), flags, flags.copy(), obs, ids.copy(), rows))
        s.in_flight[ids] = True

    def __reset(
        self, seed: ResetSeed, options: dict[str, Any] | None
    ) -> tuple[np.ndarray, RowInfos]:
        s, n = self._simkit, self.num_envs
        self.__require_idle("reset()")
        self.__host_sync()
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"reset options must be a dict or None, got {type(options).__name__}")
        opts = dict(options or {})
        mask = opts.pop("reset_mask", None)
        if mask is None:
            ids = np.arange(n, dtype=np.int64)
        else:
            mask_arr = check_mask(to_numpy(mask), n)  # a vector's check: some env, as Gymnasium
            if not s.has_reset and not mask_arr.all():
                raise ResetNeeded("the first reset() must reset every instance")
            ids = np.flatnonzero(mask_arr).astype(np.int64)
        root = seed if isinstance(seed, int | np.integer) and not isinstance(seed, bool) else None
        if root is not None and len(ids) == n:  # all restart, reading the rows held ahead
            s.seeds.restart(int(root))
            seed = None  # (a masked root reset re-roots only the masked, as a VectorEnv)
        reset_params = opts.pop("params", None)
        per_reset = (
            None if reset_params is None else _per_instance(reset_params, n, "options['params']")
        )
        obs_rows, infos = self.__reset_ids(ids, per_reset, opts, seed)
        if root is not None:  # Gymnasium's VectorEnv.reset seeds the vector's np_random
            self._np_random, self._np_random_seed = seeding.np_random(int(root))
        # every instance holds its next episodes' keys, as the coming autoresets read them
        s.seeds.prepare(s.streams.prefetch, self.__reset_scale(None))
        if s.device_loop is not None:
            s.device_loop.restart(ids)
        s.obs = obs_rows if s.obs is None or len(ids) == n else scatter(s.obs, ids, obs_rows)
        s.pending_reset[ids] = False
        s.has_reset = True
        return ids, infos

    def __reset_ids(
        self,
        ids: np.ndarray,
        per_reset: list[Mapping[str, Any]] | None,
        options: dict[str, Any],
        seed: ResetSeed = None,
    ) -> tuple[Any, RowInfos]:
        """Starts the next episode of ``ids``: keyed streams, parameters, the physics and
        the author's hook; returns the first observations and the rows' reset infos."""
        s = self._simkit
        scale = self.__reset_scale(per_reset)
        rngs = s.seeds.start_streams(s.streams, ids, seed, s.streams.prefetch, scale)
        params = self.__sample(ids, rngs, per_reset)
        s.elapsed[ids] = 0
        s.physics.prepare(self, ids, params)
        obs_rows, infos = self.reset_instances(ids, rngs, params, options)
        s.streams.prefetch = rngs.taken
        s.reset_draws_known = True
        if infos is not None and len(infos) != len(ids):
            raise ValueError(
                f"{type(self).__name__}.reset_instances must return {len(ids)} info dicts "
                f"or None, got {len(infos)}"
            )
        return obs_rows, RowInfos(len(ids), infos, lambda k: {"params": params[k]})

    def __reset_scale(self, per_reset: list[Mapping[str, Any]] | None) -> Sampler | None:
        """The sampler whose parameters the keyed rows of a reset carry already scaled
        (:meth:`EpisodeSeeds.next_states`): the one sampler of every instance, on its
        fast path, unless the reset overrides parameters."""
        groups = self._simkit.groups
        one = groups[0] if per_reset is None and len(groups) == 1 else None
        return one if one is not None and one.fast and one.names else None

    # ------------------------------------------------------------------- parameters

    def __param_row(self, i: int) -> Params:
        """Instance ``i``'s parameters, a new dict: stored for one drawn the slow way,
        else rebuilt from :attr:`param_arrays` and its sampler's fixed values."""
        s = self._simkit
        stored = s.params.get(i)
        if stored is not None:
            return copy_params(stored)
        sampler = s.samplers[i]
        return sampler.row([float(self.param_arrays[name][i]) for name in sampler.names])

    def __sample(
        self, ids: np.ndarray, rngs: KeyedStreams, per_reset: list[Mapping[str, Any]] | None
    ) -> ParamRows:
        """Each instance's parameters for its new episode, drawn from its stream: for
        all instances of one sampler at once on the fast path (scalar ``Uniform`` /
        ``LogUniform``), else one instance at a time from its generator."""
        s = self._simkit
        rows = ParamRows(len(ids))
        explicit: list[int] = []
        shared = None
        if per_reset is not None:
            mine = np.array([bool(per_reset[i]) for i in ids.tolist()], dtype=np.bool_)
            explicit = np.flatnonzero(mine).tolist()
            shared = np.flatnonzero(~mine)
        which = None
        if len(s.groups) == 1:
            groups = [0]
        else:
            which = s.group_of[ids] if shared is None else s.group_of[ids[shared]]
            groups = np.unique(which).tolist()
        for g in groups:
            ks = shared  # every shared row (all rows if None)
            if len(groups) > 1:
                assert which is not None
                sel = which == g
                ks = shared[sel] if shared is not None else np.flatnonzero(sel)
            sampler = s.groups[g]
            sub = rngs if ks is None else KeyedStreams(s.streams, ids[ks])
            if not sampler.fast:
                explicit.extend(range(len(ids)) if ks is None else ks.tolist())
                continue
            values = sampler.values(sub)
            rows.add(ks, sampler, values)
            if s.params:  # instances drawn the slow way (or restored) before
                if len(sub.ids) == self.num_envs:
                    s.params.clear()
                else:
                    for i in sub.ids.tolist():
                        s.params.pop(i, None)
            self.__update_param_arrays(sub.ids, values, sampler)
        if explicit:
            explicit.sort()
            for k in explicit:
                i = int(ids[k])
                resolved: Mapping[str, Any] = s.samplers[i].resolved
                if per_reset is not None and per_reset[i]:
                    overrides = {**s.env_overrides[i], **per_reset[i]}
                    resolved = resolve_overrides(self.randomization, overrides)
                p = sample_params(resolved, rngs[k])
                rows.set(k, p)
                s.params[i] = p
            self.__update_param_arrays(ids[explicit])
        return rows

    def __update_param_arrays(
        self, ids: np.ndarray, values: np.ndarray | None = None, sampler: Sampler | None = None
    ) -> None:
        """Writes the new parameters of ``ids`` into :attr:`param_arrays`; ``values`` are
        those of ``sampler``'s sampled names (:attr:`Sampler.names`), one row per id."""
        if not len(ids):
            return
        s = self._simkit
        columns: dict[str, Any] = {}
        if values is not None and sampler is not None:
            names = sampler.names
            block = s.param_block
            if block is None and not self.param_arrays and names == tuple(self.randomization):
                # every declared parameter is a sampled scalar: one (N, m) array whose
                # columns are the param_arrays, written with one assignment per reset
                block = s.param_block = (names, np.zeros((self.num_envs, len(names)), order="F"))
                self.param_arrays.update({name: block[1][:, j] for j, name in enumerate(names)})
            if block is not None and block[0] == names:
                block[1][ids] = values
                return
            columns = {name: values[:, j] for j, name in enumerate(names)}
            first = sampler.row(values[0].tolist())
        else:
            first = self.__param_row(int(ids[0]))
        for name, dist in self.randomization.items():
            sample = first.get(name)
            if not isinstance(sample, int | float | np.ndarray) or isinstance(sample, bool):
                continue
            arr = self.param_arrays.get(name)
            if arr is None:
                arr = np.zeros((self.num_envs, *dist.shape), dtype=np.float64)
                self.param_arrays[name] = arr
            column = columns.get(name)
            if column is None and sampler is not None:
                column = sample  # a fixed value of the sampler, the same for every row
            arr[ids] = (
                column if column is not None else [self.__param_row(i)[name] for i in ids.tolist()]
            )

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
        s = self.__ready("step_batch()")
        whole = env_ids is None
        if whole:
            if self.validate_actions:
                actions = self.check_actions(actions)
            if self.xp is not np and self.__device_steps():
                return self.__step_device(actions)
        self.__host_sync()
        if whole:
            ids, order = s.all_ids, None
            pending = PendingStep(finish=lambda: self.step_instances(actions, s.all_streams))
        else:
            ids, order, pending = self.__start(env_ids, actions, "step_batch()")
        try:
            hook = "step_instances" if whole else "step_subset"
            step = self.__complete(ids, pending.finish(), hook, whole and self.__known_resets())
        except BaseException:
            if pending.drain is not None:
                pending.drain()
            raise
        if order is not None:
            step = take_step(step, np.argsort(order))
        return step if self.xp is np else self.__on_device(step)

    def step_rows(self, actions: Any) -> RowStep:
        """Steps every instance as :meth:`step_batch` does; the rows as a rollout on the
        host reads them (:class:`~simkit._types.RowStep`: numpy copies, every row live,
        no infos)."""
        return host_rows(self.step_batch(actions), np.ones(self.num_envs, dtype=np.bool_))

    def reset_rows(self, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`reset` of every instance as a rollout on the host reads it: ``(obs,
        mask)`` of every row (numpy copies; every row live)."""
        obs, _ = self.reset(seed=seed)
        return np.array(host_arrays(obs)), np.ones(self.num_envs, dtype=np.bool_)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Gymnasium's 5-tuple under ``metadata["autoreset_mode"]``.

        ``SAME_STEP``: ended instances are reset now; their last observation is in
        ``info["final_obs"]`` (masked by ``info["_final_obs"]``), the step's info in
        ``info["final_info"]`` and the reset's info merged into ``info``, as
        ``SyncVectorEnv`` does. ``NEXT_STEP``: an ended instance ignores its next
        action and is reset instead (reward 0, flags False).
        """
        vector_info: dict[str, Any] = {}
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            s, n = self.__ready("step()"), self.num_envs
            self.__host_sync()
            if self.validate_actions:
                actions = self.check_actions(actions)
            pending = s.pending_reset.copy()
            step = self.step_instances(actions, s.all_streams)
            obs, reward, terminated, base = self.__checked(step, n, "step_instances")
            infos = RowInfos(n, base)
            truncated = self.__truncated()
            if pending.any():  # the instances that ended last step reset now
                ids = np.flatnonzero(pending).astype(np.int64)
                rows, reset_infos = self.__reset_ids(ids, None, {})
                obs = scatter(obs, ids, rows)
                reward[ids] = 0.0
                terminated[ids] = False
                truncated[ids] = False
                for k, j in enumerate(ids.tolist()):
                    infos[j] = reset_infos[k]
            s.pending_reset = terminated | truncated
            s.obs = obs
            for i, info in enumerate(infos):
                if info:
                    vector_info = self._add_info(vector_info, info, i)
            return obs, reward, terminated, truncated, vector_info
        result = self.step_batch(actions)
        reward, terminated, truncated = (
            to_numpy(x) for x in (result.reward, result.terminated, result.truncated)
        )
        done = terminated | truncated
        for i, info in enumerate(result.infos):
            if done[i]:
                step_info = {k: v for k, v in info.items() if k != "reset_info"}
                vector_info = self._add_info(
                    vector_info, {"final_obs": result.final_obs[i], "final_info": step_info}, i
                )
                vector_info = self._add_info(vector_info, info["reset_info"], i)
            elif info:
                vector_info = self._add_info(vector_info, info, i)
        return result.obs, reward, terminated, truncated, vector_info

    def __start(
        self, env_ids: Any, actions: Any, what: str
    ) -> tuple[np.ndarray, np.ndarray | None, PendingStep]:
        """Starts the step of the checked ``env_ids`` (sorted, with their action rows),
        in the background where the physics can; returns them sorted, the sorting
        permutation (``None`` if they were sorted already) and the started step."""
        ids = check_send_ids(
            None if env_ids is None else to_numpy(env_ids), self.num_envs, self._simkit.in_flight
        )
        if self.validate_actions:
            actions = self.check_actions(actions, len(ids))
        elif len(actions) != len(ids):
            raise InvalidAction(f"actions must hold {len(ids)} rows, got {len(actions)}")
        if len(ids) != self.num_envs and not self.subset_steps:
            raise _no_subset(self, len(ids), what)
        order = np.argsort(ids, kind="stable")
        moved = bool((order != np.arange(len(ids))).any())
        if moved:
            ids = ids[order]
            actions = [actions[k] for k in order] if isinstance(actions, list) else actions[order]
        pending = self._simkit.physics.start(self, ids, actions, self._simkit.streams.rows(ids))
        return ids, order if moved else None, pending

    def __checked(
        self, result: StepResult, n: int, hook: str, device: bool = False
    ) -> tuple[Any, Any, Any, list[dict[str, Any]] | None]:
        """A step hook's ``result`` for ``n`` rows with its shapes and infos checked:
        rewards (float64) and terminations (bool) as new numpy arrays, or, with
        ``device``, as tensors on the device (not read back)."""
        obs, reward, terminated, infos = result
        if device:
            xp = self.xp
            reward = xp.as_tensor(reward, device=self.device).to(xp.float64)
            terminated = xp.as_tensor(terminated, device=self.device).to(xp.bool)
        else:
            reward = to_numpy(reward).astype(np.float64)
            terminated = to_numpy(terminated).astype(np.bool_)
        name = type(self).__name__
        if tuple(reward.shape) != (n,) or tuple(terminated.shape) != (n,):
            raise ValueError(
                f"{name}.{hook} must return reward and terminated of shape ({n},), got "
                f"{tuple(reward.shape)} and {tuple(terminated.shape)}"
            )
        if infos is not None and len(infos) != n:
            raise ValueError(f"{name}.{hook} must return {n} info dicts or None, got {len(infos)}")
        return obs, reward, terminated, infos

    def __complete(
        self, ids: np.ndarray, result: StepResult, hook: str, known: bool = False
    ) -> BatchStep:
        """The step of instances ``ids`` (sorted) from what ``hook`` returned: truncation,
        the episode statistics and same-step autoreset; their observations become the
        batch's. ``known``: a whole-batch step of a :attr:`time_limit_only` torch batch,
        whose resets follow from the host step counts, so rewards and terminations stay
        on the device (the same bits as the host path)."""
        s, n = self._simkit, len(ids)
        final_obs, reward, terminated, base = self.__checked(result, n, hook, known)
        truncated = self.__truncated(ids)
        if known:
            done = truncated
            self.__loop().record_known(reward, done, s.elapsed)
            xp = self.xp
            truncated = (
                xp.as_tensor(done, device=self.device)
                if done.any()
                else xp.zeros(n, dtype=xp.bool, device=self.device)
            )
        else:
            done = terminated | truncated
            if s.device_loop is not None:  # a torch batch between device-resident steps
                s.device_loop.record(ids, reward, done, s.elapsed[ids])
        obs: Any = final_obs
        infos = RowInfos(n, base)
        if done.any():  # same-step autoreset: each ended row's first obs and reset_info
            rows = np.flatnonzero(done)  # with all N ids, the rows are the instances
            resets, reset_infos = self.__reset_ids(
                rows if n == self.num_envs else ids[rows], None, {}
            )

            def reset_info(k: int) -> dict[str, Any] | None:
                j = int(np.searchsorted(rows, k))
                return {"reset_info": reset_infos[j]} if j < len(rows) and rows[j] == k else None

            obs, infos = scatter(final_obs, rows, resets), RowInfos(n, base, reset_info)
        s.obs = obs if n == self.num_envs else scatter(s.obs, ids, obs)
        return BatchStep(obs, reward, terminated, truncated, final_obs, ids, infos)

    def __truncated(self, ids: np.ndarray | None = None) -> np.ndarray:
        """Counts a step of ``ids`` (all if ``None``); which of them hit the time limit."""
        s = self._simkit
        if ids is None or len(ids) == self.num_envs:
            s.elapsed += 1
            elapsed = s.elapsed
        else:
            s.elapsed[ids] += 1
            elapsed = s.elapsed[ids]
        if self.max_episode_steps is None:
            return np.zeros(len(elapsed), dtype=np.bool_)
        return elapsed >= self.max_episode_steps

    def __on_device(self, step: BatchStep) -> BatchStep:
        """A host-path step of a torch batch with its rewards and flags as device
        tensors, like a device-resident step's."""
        xp, device = self.xp, self.device
        flags = ("reward", "terminated", "truncated")
        return replace(step, **{f: xp.as_tensor(getattr(step, f), device=device) for f in flags})

    # ------------------------------------------------------------------ send / recv

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
        s = self._simkit
        if not s.has_reset:
            raise ResetNeeded("send() called before reset(); call reset() or async_reset() first")
        self.__host_sync()
        ids, _, pending = self.__start(env_ids, actions, "send()")
        s.in_flight[ids] = True
        s.pending.append((ids, pending))

    def recv(self) -> BatchStep:
        """The next ``batch_size`` instances, as a :class:`~simkit.BatchStep`.

        Sends are completed first in, first out; ``env_ids`` names the rows' instances
        (a send's rows sorted by id, sends in the order they were made); send their
        next actions with :meth:`send`. Rows from :meth:`async_reset` have reward 0, no
        flags, ``final_obs == obs`` and the reset info under ``"reset_info"``.

        Raises:
            RuntimeError: fewer than ``batch_size`` instances are in flight.
        """
        s, count = self._simkit, self.batch_size
        flying = int(s.in_flight.sum())
        if flying < count:
            raise RuntimeError(
                f"recv() needs {count} envs in flight, only {flying} are; "
                "send() actions for more envs first"
            )
        have = sum(len(c.env_ids) for c in s.ready)
        while have < count:
            ids, pending = s.pending.popleft()
            try:
                chunk = self.__complete(ids, pending.finish(), "step_subset")
            except BaseException:
                self.__abort()
                raise
            s.ready.append(chunk)
            have += len(ids)
        parts: list[BatchStep] = []
        need = count
        while need:
            chunk = s.ready.popleft()
            if len(chunk.env_ids) > need:
                s.ready.appendleft(take_step(chunk, slice(need, None)))
                chunk = take_step(chunk, slice(0, need))
            parts.append(chunk)
            need -= len(chunk.env_ids)
        out = parts[0] if len(parts) == 1 else concat_steps(parts, self.xp)
        s.in_flight[out.env_ids] = False
        return out if self.xp is np else self.__on_device(out)

    def __abort(self) -> None:
        """After a failed step: wait out every background step and forget in-flight ones."""
        s = self._simkit
        while s.pending:
            _, pending = s.pending.popleft()
            if pending.drain is not None:
                pending.drain()
        s.ready.clear()
        s.in_flight[:] = False

    def __ready(self, what: str) -> BatchState:
        """The batch's state, once it has been reset and has no step in flight."""
        s = self._simkit
        if not s.has_reset:
            raise ResetNeeded(f"{what} called before reset(); call reset() first")
        self.__require_idle(what)
        return s

    def __require_idle(self, what: str) -> None:
        in_flight = self._simkit.in_flight
        if in_flight.any():
            raise RuntimeError(
                f"{what} called with envs {np.flatnonzero(in_flight).tolist()} in flight; "
                "recv() them first"
            )

    def close_extras(self, **kwargs: Any) -> None:
        """Waits out steps in flight, then stops the physics' threads (if any)."""
        s: BatchState | None = getattr(self, "_simkit", None)
        if s is None:  # __init__ failed before there was anything to close
            return
        if s.in_flight.any():
            self.__abort()
        s.physics.close()

    # -------------------------------------------------------- device-resident steps

    def prepare_device_steps(self, steps: int) -> bool:
        """Makes the next ``steps`` whole-batch :meth:`step_batch` calls of a torch batch
        run without any host synchronisation (call it once per fragment): loads the
        state onto the device if a host operation changed it, and the keys of every
        episode the instances can reach in those steps (one read of the episode
        counters; a fragment longer than the ring of next episodes,
        ``simkit._batch_device.MAX_WINDOW``, reads them again when it runs out).
        Without this call a device-resident batch refills every 32 steps.

        Returns:
            Whether steps are device-resident (a torch batch whose class has
            :meth:`reset_masked`, one root seed, scalar parameters, or one that is
            :attr:`time_limit_only`); ``False`` means they run through the host path.

        Raises:
            ValueError: ``steps`` < 1.
            ResetNeeded: before the first :meth:`reset`.
        """
        if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        self.__ready("prepare_device_steps()")
        if self.xp is np:
            return False
        if not self.__device_steps():
            if not self.__known_resets():
                return False
            self.__loop()
            return True
        if self.__loop().steps_left < steps:
            self.__device_window(max(int(steps), DEFAULT_WINDOW))
        return True

    def read_episode_stats(self) -> dict[str, np.ndarray]:
        """The episodes completed since the last call, per instance, and clears them:
        ``episodes`` (int64 count), ``return_sum`` (float64) and ``length_sum`` (int64).
        Kept on the device by device-resident steps (host-path subset steps add theirs;
        an episode cut by :meth:`reset` is not counted). One read back from the device:
        call it once per fragment, not per step.

        Raises:
            RuntimeError: not a device-resident torch batch.
        """
        loop = self._simkit.device_loop
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

    def __loop(self) -> DeviceLoop:
        """The device loop (made on first use)."""
        s = self._simkit
        if s.device_loop is None:
            s.device_loop = DeviceLoop(self.xp, self.device, self.num_envs)
        return s.device_loop

    def __known_resets(self) -> bool:
        """Whether whole-batch steps of this torch batch keep rewards and flags on the
        device with the resets scheduled on the host: the class declares
        :attr:`time_limit_only` and there is a time limit, so the instances that reset
        in a step are those whose host step count reaches it."""
        return (
            self.xp is not np
            and self.time_limit_only
            and self.max_episode_steps is not None
            and not self._simkit.physics.on_host
        )

    def __device_steps(self) -> bool:
        """Whether whole-batch steps can stay on the device (the class has
        :meth:`reset_masked`, every instance is under one root seed with one sampler of
        scalar parameters, and no stream is held as a generator); on the first step
        after a host operation, loads the host state onto the device."""
        s = self._simkit
        if s.device_ready:
            return True
        if type(self).reset_masked is BatchEnv.reset_masked:
            return False
        sampler = s.groups[0]
        if (
            not s.reset_draws_known  # how many draws a reset takes (learnt by one)
            or s.seeds._shared_root is None
            or len(s.groups) != 1
            or not sampler.fast
            or s.streams.live
            or any(arr.ndim != 1 for arr in self.param_arrays.values())
            or any(name not in self.param_arrays for name in sampler.names)
        ):
            return False
        loop = self.__loop()
        loop.push(
            s.elapsed,
            s.seeds.episode,
            s.streams.states,
            s.streams.pos,
            self.param_arrays,
            sampler.names,
        )
        s.params.clear()  # one fast sampler: every row's params rebuild from the arrays
        s.device_sampler = sampler
        self.__device_window(DEFAULT_WINDOW)
        s.device_ready = True
        return True

    def __device_window(self, width: int) -> None:
        """Next-episode keys of every instance for up to ``width`` steps on the device,
        from the host's episode counters (read back from the device when it is ahead):
        each instance's ring of next episodes gets the episodes it lacks, computed on the
        host (the numpy path's rows) and uploaded, and covers ``width`` steps or as many
        as it holds."""
        s = self._simkit
        loop, sampler, seeds = self.__loop(), s.device_sampler, s.seeds
        assert sampler is not None
        # Read back when the device is ahead (a host sync; a copy: not a view on a CPU device).
        episode = loop.episode.cpu().numpy().copy() if loop.ahead else seeds.episode
        m = len(sampler.names)
        draws = max(s.streams.prefetch, m)
        scale = sampler if m else None

        def rows_of(envs: np.ndarray, episodes: np.ndarray) -> np.ndarray:
            return seeds.rows(envs, episodes, draws, scale)

        key = (seeds._shared_root, seeds.env_offset, draws, scale)
        loop.load_ring(episode + 1, width, key, 4 + draws, rows_of, m)

    def __step_device(self, actions: Any) -> BatchStep:
        """A whole-batch step that never waits on the device (:mod:`simkit._batch_device`)."""
        s, n, xp = self._simkit, self.num_envs, self.xp
        loop, sampler = self.__loop(), s.device_sampler
        assert sampler is not None
        if loop.steps_left <= 0:
            self.__device_window(DEFAULT_WINDOW)  # one read of the counters per window
        result = self.step_instances(actions, NoStepDraws(n))
        final_obs, reward, terminated, base = self.__checked(result, n, "step_instances", True)
        truncated, done, new, draws, params = loop.step(reward, terminated, self.max_episode_steps)
        reset_obs = self.reset_masked(done, draws, params)
        loop.took(done, loop.param_draws + draws.taken)
        obs = xp.where(done.view(n, *([1] * (final_obs.dim() - 1))), reset_obs, final_obs)
        infos = device_infos(n, base, done, new, lambda row: sampler.row([float(v) for v in row]))
        s.obs = obs
        return BatchStep(obs, reward, terminated, truncated, final_obs, s.all_ids, infos)

    def __host_sync(self) -> None:
        """Brings the host copies of the contract up to date after device-resident steps
        (one read back), before a host-side operation; later steps load them again."""
        s = self._simkit
        loop = s.device_loop
        if loop is not None and loop.ahead:
            s.elapsed = loop.elapsed.cpu().numpy().copy()
            s.seeds.episode = loop.episode.cpu().numpy().copy()
            s.streams.states = loop.states.cpu().numpy().view(np.uint64).copy()
            s.streams.pos = loop.pos.cpu().numpy().copy()
            s.streams.version += 1
            values = loop.params.cpu().numpy()
            for j, name in enumerate(loop.names):
                self.param_arrays[name][...] = values[:, j]
            s.params.clear()
            loop.ahead = False
        s.device_ready = False

    # -------------------------------------------------------------------- snapshots

    def get_state(self) -> dict[str, Any]:
        """A snapshot of the whole batch: every instance's RNG, params, counters and state.

        Plain data (msgpack-able with :mod:`simkit.snapshot`); ``set_state`` on this or
        a fresh batch of the same class and size continues bit-identically.
        """
        s = self.__ready("get_state()")
        self.__host_sync()
        return {
            "format": BATCH_STATE_FORMAT,
            "env": f"{type(self).__module__}:{type(self).__qualname__}",
            "num_envs": self.num_envs,
            "root_seed": s.seeds.batch_root(),
            "env_offset": s.seeds.env_offset,
            "episode_index": s.seeds.episode.copy(),
            "rngs": s.streams.to_plain(),
            "params": self.params,
            "elapsed_steps": s.elapsed.copy(),
            "max_episode_steps": self.max_episode_steps,
            "pending_reset": s.pending_reset.copy(),
            "obs": _plain_copy(s.obs),
            "data": self.get_env_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a snapshot from :meth:`get_state`, all or nothing: a snapshot the
        author's :meth:`set_env_state` rejects leaves the batch as it was.

        Every field is checked before anything changes, against what the batch could
        have produced itself: the seeding fields against their ranges
        (:meth:`EpisodeSeeds.parse_state`), each instance's ``params`` against the
        declared randomization (the check a reset's overrides get), the counters
        (``elapsed_steps >= 0``, a positive ``max_episode_steps``), ``pending_reset`` as
        ``(N,)`` bools and ``obs`` as N observations of the observation space, so a
        snapshot that passes cannot break a later step.

        Raises:
            InvalidState: malformed, from another class, of another batch size, or a
                field out of its range; the message names the field, what it must be
                and what came.
        """
        if not isinstance(state, Mapping):
            raise InvalidState(f"state must be a dict from get_state(), got {type(state).__name__}")
        self.__require_idle("set_state()")
        self.__host_sync()
        check_envelope(state, _STATE_KEYS, BATCH_STATE_FORMAT)
        expected = f"{type(self).__module__}:{type(self).__qualname__}"
        if not is_tag(state["env"], expected):
            raise InvalidState(f"state belongs to env {state['env']!r}, expected {expected!r}")
        s, n = self._simkit, self.num_envs
        if not is_tag(state["num_envs"], n):
            raise InvalidState(f"state holds {state['num_envs']!r} instances, this batch has {n}")
        rngs = _per_env_list(state, "rngs", n)
        params = {}
        for i, p in enumerate(_per_env_list(state, "params", n)):
            check_params(self.randomization, p, f"state['params'][{i}]")
            params[i] = copy.deepcopy(dict(p))
        streams = StreamTable.parse_plain(rngs, n)
        elapsed = state_array(state["elapsed_steps"], "state['elapsed_steps']", "iu", n)
        if elapsed.size and elapsed.min() < 0:
            raise InvalidState(
                f"state['elapsed_steps'] must be ints >= 0, got {elapsed.min()} "
                f"(instance {int(np.argmin(elapsed))})"
            )
        limit = check_state_limit(state, self.max_episode_steps)
        pending = state_array(state["pending_reset"], "state['pending_reset']", "b", n)
        seeds = EpisodeSeeds.parse_batch_state(state, n)
        check_observation(self.single_observation_space, state["obs"], "state['obs']", rows=n)
        obs = _restore_like(self.xp, self.device, s.obs, state["obs"])
        core = (params, elapsed.astype(np.int64), limit, pending, True, obs)
        saved = (s.params, s.elapsed, self.max_episode_steps, s.pending_reset, s.has_reset, s.obs)
        saved_streams = (s.streams.states, s.streams.pos, s.streams.live)
        saved_values = {name: arr.copy() for name, arr in self.param_arrays.items()}
        saved_seeds = EpisodeSeeds.parse_state(s.seeds.get_state(), n)
        saved_data = self.get_env_state()
        try:
            s.params, s.elapsed, self.max_episode_steps, s.pending_reset, s.has_reset, s.obs = core
            s.seeds.set_state(seeds)
            s.streams.restore(streams)
            self.__update_param_arrays(np.arange(n, dtype=np.int64))
            self.set_env_state(state["data"])
        except Exception:
            s.params, s.elapsed, self.max_episode_steps, s.pending_reset, s.has_reset, s.obs = saved
            s.seeds.set_state(saved_seeds)
            s.streams.states, s.streams.pos, s.streams.live = saved_streams
            for name, arr in saved_values.items():
                self.param_arrays[name][...] = arr
            self.set_env_state(saved_data)
            raise

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
        row_ids = self._simkit.all_streams.ids if n == self.num_envs else np.arange(n)
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


def _no_subset(env: BatchEnv, k: int, what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{type(env).__name__} must implement step_subset() to step {k} of "
        f"{env.num_envs} instances ({what} with env_ids, or batch_size < num_envs)"
    )


def _per_instance(value: Any, n: int, what: str) -> list[Mapping[str, Any]]:
    """Parameter overrides (``None``, one mapping, or ``n`` of them) as ``n`` mappings."""
    if value is None:
        return [{}] * n
    if isinstance(value, Mapping):
        return [dict(value)] * n
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        if len(value) != n or not all(isinstance(v, Mapping) for v in value):
            raise ValueError(
                f"{what} must be one mapping or {n} mappings (one per instance), "
                f"got a sequence of {len(value)}"
            )
        return [dict(v) for v in value]
    raise TypeError(
        f"{what} must be a mapping or a sequence of mappings, got {type(value).__name__}"
    )


def _restore_like(xp: Any, device: Any, current: Any, value: Any) -> Any:
    """``value`` from a snapshot in the form of the live ``current`` (a tensor stays one)."""
    if xp is not np and isinstance(current, xp.Tensor):
        return xp.as_tensor(np.array(value), device=current.device, dtype=current.dtype)
    if xp is not np and isinstance(value, np.ndarray):
        return xp.as_tensor(value.copy(), device=device)
    return copy.deepcopy(value)


def _per_env_list(state: Mapping[str, Any], key: str, n: int) -> list[Any]:
    value = state[key]
    if not isinstance(value, list | tuple) or len(value) != n:
        got = len(value) if isinstance(value, list | tuple) else type(value).__name__
        raise InvalidState(f"state[{key!r}] must be a list of {n} entries, got {got}")
    return list(value)


def _plain_copy(x: Any) -> Any:
    if hasattr(x, "detach"):
        return np.array(x.detach().cpu().numpy(), copy=True)
    return copy.deepcopy(x)
