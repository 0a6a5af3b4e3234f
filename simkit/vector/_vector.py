"""``simkit.vector.VectorEnv``: N single-instance envs in one process, on a thread pool."""

from __future__ import annotations

import contextlib
import copy
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from simkit._seeding import EpisodeSeeds
from simkit._state import restore_all
from simkit._types import BatchStep, StepFault
from simkit._validation import ActionBounds, check_send_ids
from simkit.errors import InvalidState, ResetNeeded
from simkit.registry import make
from simkit.vector._actions import check_batch, split_rows
from simkit.vector._pool import WorkerPool

__all__ = ["VectorEnv", "make_vec", "VECTOR_STATE_FORMAT", "gather_rows"]

VECTOR_STATE_FORMAT = 1
"""Version of the snapshot layout produced by :meth:`VectorEnv.get_state`."""

_SAME, _NEXT, _DISABLED = AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED


class VectorEnv(gym.vector.VectorEnv[Any, Any, Any]):
    """N instances of one env stepped in one process, on ``num_threads`` threads.

    A ``gymnasium.vector.VectorEnv``: Gymnasium's vector wrappers and VectorEnv
    learners take it unchanged. On top of Gymnasium's API it offers:

    - :meth:`step_batch`: a typed :class:`~simkit._types.BatchStep` with the final and
      the next observation as separate fields (same-step autoreset, nothing lost);
    - :meth:`send` / :meth:`recv` / :meth:`async_reset`: EnvPool-style asynchronous
      stepping that returns the first ``batch_size`` envs to finish;
    - :meth:`get_state` / :meth:`set_state`: a plain-data snapshot of the whole vector.

    Seeding is independent of scheduling: after ``reset(seed=root)`` episode ``k`` of
    env ``i`` is seeded with ``episode_seed(root, i, k)`` (:class:`simkit._seeding.EpisodeSeeds`),
    each env counting its own episodes, so thread count, batch split and the order in
    which episodes end never change what an env produces.

    Stepping: the envs are split into ``num_threads`` contiguous chunks; a step hands
    one task per chunk to a worker (the calling thread runs the last chunk itself), so
    a step costs ``num_threads - 1`` thread wake-ups whatever N is. ``num_threads=1``
    runs inline with no thread at all. MuJoCo releases the GIL inside ``mj_step``, so
    MuJoCo envs step in parallel; pure-Python envs gain nothing from threads.

    Args:
        env_fns: a registered env id, or a sequence of zero-argument functions each
            returning a ``gymnasium.Env`` (a simkit :class:`~simkit.Env` for snapshots).
        num_envs: N; required with an env id, must equal ``len(env_fns)`` otherwise.
        num_threads: worker threads (1 = inline, no threads). At most N are used.
        batch_size: how many envs :meth:`recv` returns (default N).
        autoreset_mode: how :meth:`step` reports episode ends (``metadata
            ["autoreset_mode"]``); :meth:`step_batch` and :meth:`recv` always autoreset
            in the same step.
        params: randomization overrides for envs built from an id: one mapping for
            all envs, or a list of N mappings (e.g. a different gravity per env).
        env_kwargs: other constructor arguments for envs built from an id.
        validate_actions: check each batch of actions once (shape, dtype, NaN, range)
            and turn the envs' own per-action check off (``validate_actions = False``
            where they have one).
        isolate_faults: an env whose ``step`` raises ends its episode (truncated, reward
            0, last observation) and is reset while the others go on; the failure is
            reported by :meth:`step_envs` as a :class:`~simkit._types.StepFault` (what a
            rollout server needs). Off by default: the exception propagates.
    """

    def __init__(
        self,
        env_fns: str | Sequence[Callable[[], gym.Env[Any, Any]]],
        num_envs: int | None = None,
        *,
        num_threads: int = 1,
        batch_size: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP,
        params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        validate_actions: bool = True,
        isolate_faults: bool = False,
    ) -> None:
        self.closed = False
        self.isolate_faults = isolate_faults
        self._pool: WorkerPool | None = None
        self.envs = _build_envs(env_fns, num_envs, params, env_kwargs)
        n = len(self.envs)
        self.num_envs = n
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        first = self.envs[0]
        self.metadata = {**first.metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = first.render_mode
        self.spec = None
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        for i, env in enumerate(self.envs):
            if env.observation_space != self.single_observation_space:
                raise ValueError(
                    f"every env must share one observation space; env 0 has "
                    f"{self.single_observation_space}, env {i} has {env.observation_space}"
                )
            if env.action_space != self.single_action_space:
                raise ValueError(
                    f"every env must share one action space; env 0 has "
                    f"{self.single_action_space}, env {i} has {env.action_space}"
                )
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.validate_actions = validate_actions
        if validate_actions:
            for env in self.envs:
                if hasattr(env.unwrapped, "validate_actions"):
                    env.unwrapped.validate_actions = False
        bounds = getattr(first.unwrapped, "action_bounds", ActionBounds.CLIP)
        self._bounds = bounds if isinstance(bounds, ActionBounds) else ActionBounds.CLIP

        self.num_threads = _positive_int(num_threads, "num_threads")
        self.batch_size = n if batch_size is None else _positive_int(batch_size, "batch_size")
        if self.batch_size > n:
            raise ValueError(f"batch_size must be <= num_envs={n}, got {self.batch_size}")
        workers = min(self.num_threads, n)
        self._chunks = [c.astype(np.int64) for c in np.array_split(np.arange(n), workers)]
        self._owner = np.empty(n, dtype=np.int64)
        for w, chunk in enumerate(self._chunks):
            self._owner[chunk] = w
        if workers > 1:
            self._pool = WorkerPool(workers)

        self.seeds = EpisodeSeeds(n)
        self._has_reset = False
        self._pending = np.zeros(n, dtype=np.bool_)
        # Per-env result slots written by whichever thread steps the env.
        self._obs_slot: list[Any] = [None] * n
        self._final_slot: list[Any] = [None] * n
        self._reward = np.zeros(n, dtype=np.float64)
        self._term = np.zeros(n, dtype=np.bool_)
        self._trunc = np.zeros(n, dtype=np.bool_)
        self._info_slot: list[dict[str, Any]] = [{} for _ in range(n)]
        self._reset_info_slot: list[dict[str, Any] | None] = [None] * n
        self._broken = np.zeros(n, dtype=np.bool_)
        self._faults: list[StepFault] = []
        # Async bookkeeping.
        self._in_flight = np.zeros(n, dtype=np.bool_)
        self._ready: deque[int] = deque()
        self._lazy: deque[tuple[int, Any, AutoresetMode]] = deque()
        self._tasks_out = 0
        self._waiting_all = False

    # ------------------------------------------------------------------ properties

    @property
    def episode_index(self) -> np.ndarray:
        """Each env's current episode number (a copy; -1 before the first reset)."""
        return self.seeds.episode.copy()

    @property
    def root_seeds(self) -> list[int | None]:
        """Each env's root seed; ``None`` for an env reset with an explicit seed."""
        return list(self.seeds.roots)

    # ------------------------------------------------------------------------ reset

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env (or ``options["reset_mask"]``); Gymnasium-style infos.

        Args:
            seed: ``int`` root seed: env ``i`` starts episode 0 with
                ``episode_seed(root, i, 0)`` and later episodes continue the
                derivation. A list of N ``int | None``: env ``i`` is reset with
                ``seed[i]`` exactly (its later episodes continue its own generator),
                ``None`` entries act as below. ``None``: each env starts its next
                episode (a fresh random root on the very first reset).
            options: passed to every env's ``reset``; ``{"reset_mask": (N,) bool}``
                resets only some envs, as in Gymnasium.
        """
        self._require_idle("reset()")
        opts = dict(options) if options is not None else None
        mask = None
        if opts is not None and "reset_mask" in opts:
            mask = _check_mask(opts.pop("reset_mask"), self.num_envs)
            if not self._has_reset and not mask.all():
                raise ResetNeeded("the first reset() must reset every env")
        ids = np.arange(self.num_envs) if mask is None else np.flatnonzero(mask)
        seeds = self.seeds.plan(ids, seed)
        self._run_resets(ids, seeds, opts)
        self._has_reset = True
        self._pending[ids] = self._broken[ids] = False
        infos: dict[str, Any] = {}
        for i in ids:
            infos = self._add_info(infos, self._info_slot[i], int(i))
        return self._gather(self._obs_slot, np.arange(self.num_envs)), infos

    def _run_resets(
        self, ids: np.ndarray, seeds: list[int | None], options: dict[str, Any] | None
    ) -> None:
        def run(part: list[tuple[int, int | None]]) -> None:
            for i, s in part:
                obs, info = self.envs[i].reset(seed=s, options=copy.deepcopy(options))
                self._obs_slot[i] = self._final_slot[i] = obs
                self._info_slot[i] = info
                self._reset_info_slot[i] = None

        work = list(zip((int(i) for i in ids), seeds, strict=True))
        if self._pool is None:
            run(work)
            return
        parts: list[list[tuple[int, int | None]]] = [[] for _ in self._chunks]
        for i, s in work:
            parts[int(self._owner[i])].append((i, s))
        self._fan_out(run, parts, inline_last=True)

    # ------------------------------------------------------------------------- step

    def _step_env(self, i: int, action: Any, mode: AutoresetMode) -> None:
        """Steps (or autoresets) env ``i`` and writes its slots; runs on any thread."""
        if self._pending[i]:
            if mode is _NEXT:
                obs, info = self.envs[i].reset(seed=self.seeds.next_one(i))
                self._obs_slot[i] = self._final_slot[i] = obs
                self._reward[i] = 0.0
                self._term[i] = self._trunc[i] = False
                self._info_slot[i] = info
                self._reset_info_slot[i] = None
                self._pending[i] = False
                return
            raise ResetNeeded(
                f"env {i} ended its episode and was not reset; with autoreset_mode "
                f"{self.autoreset_mode.name} reset it with reset(options={{'reset_mask': mask}})"
            )
        if self._broken[i]:
            self._faults.append(StepFault(i, None, "broken"))
            self._write_fault(i)
            return
        try:
            obs, reward, terminated, truncated, info = self.envs[i].step(action)
        except Exception as exc:
            if not self.isolate_faults:
                raise
            self._faults.append(StepFault(i, exc, "step"))
            self._write_fault(i)
            obs, terminated, truncated, info = self._obs_slot[i], False, True, {}
        else:
            self._final_slot[i] = obs
            self._reward[i] = reward
            self._term[i] = terminated
            self._trunc[i] = truncated
            self._info_slot[i] = info
        if mode is _SAME and (terminated or truncated):
            try:
                self._obs_slot[i], self._reset_info_slot[i] = self.envs[i].reset(
                    seed=self.seeds.next_one(i)
                )
            except Exception as exc:
                if not self.isolate_faults:
                    raise
                self._faults.append(StepFault(i, exc, "reset"))
                self._broken[i] = True
                self._obs_slot[i], self._reset_info_slot[i] = obs, None
        else:
            self._obs_slot[i] = obs
            self._reset_info_slot[i] = None
            self._pending[i] = bool(terminated or truncated)

    def _write_fault(self, i: int) -> None:
        """Ends env ``i``'s episode without a step: truncated, reward 0, last observation."""
        self._final_slot[i] = self._obs_slot[i]
        self._reward[i] = 0.0
        self._term[i] = False
        self._trunc[i] = True
        self._info_slot[i] = {}
        self._reset_info_slot[i] = None

    def _run_steps(self, part: list[tuple[int, Any, AutoresetMode]]) -> list[int]:
        for i, action, mode in part:
            self._step_env(i, action, mode)
        return [i for i, _, _ in part]

    def _rows(self, actions: Any, ids: np.ndarray) -> list[Any]:
        if self.validate_actions:
            return check_batch(self.single_action_space, actions, ids, self._bounds)
        return split_rows(self.single_action_space, actions, len(ids))

    def _dispatch_all(self, actions: Any, mode: AutoresetMode) -> None:
        """Steps every env synchronously, one task per chunk."""
        if not self._has_reset:
            raise ResetNeeded("step() called before reset(); call reset() first")
        self._require_idle("step()")
        ids = np.arange(self.num_envs, dtype=np.int64)
        rows = self._rows(actions, ids)
        self._faults = []
        if self._pool is None:
            for i in range(self.num_envs):
                self._step_env(i, rows[i], mode)
            return
        parts = [[(int(i), rows[int(i)], mode) for i in chunk] for chunk in self._chunks]
        self._fan_out(self._run_steps, parts, inline_last=True)

    def _fan_out(self, fn: Callable[[Any], Any], parts: list[Any], *, inline_last: bool) -> None:
        assert self._pool is not None
        last = len(parts) - 1 if inline_last else len(parts)
        sent = 0
        for w in range(last):
            if parts[w]:
                self._pool.submit(w, fn, parts[w], None)
                sent += 1
        error: BaseException | None = None
        if inline_last and parts[-1]:
            try:
                fn(parts[-1])
            except BaseException as exc:
                error = exc
        for _ in range(sent):
            _, _, failure = self._pool.get()
            if failure is not None and error is None:
                error = failure
        if error is not None:
            raise error

    def step_batch(self, actions: Any) -> BatchStep:
        """Steps every env; ended envs autoreset in the same step, nothing is lost.

        Returns:
            A :class:`~simkit._types.BatchStep` over all N envs: ``final_obs`` rows are
            the observations the actions led to, ``obs`` rows the ones to act on next;
            an ended env's info holds the next episode's reset info under
            ``"reset_info"``.

        Raises:
            ResetNeeded: before :meth:`reset`, or while an env awaits a ``NEXT_STEP``
                or ``DISABLED`` reset from :meth:`step`.
            InvalidAction: the batch does not fit ``action_space`` (names the envs).
        """
        self._dispatch_all(actions, _SAME)
        return self._batch_step(np.arange(self.num_envs, dtype=np.int64))

    def step_envs(
        self, env_ids: Any, actions: Any, *, check_ids: bool = True
    ) -> tuple[BatchStep, list[StepFault]]:
        """Steps only ``env_ids`` (in that order), synchronously, with same-step autoreset.

        EnvPool's ``step(action, env_id)``, as the rollout server's hosts use it: a
        subset of the envs moves, each env's rows are in ``env_ids`` order.

        Args:
            env_ids: ``(k,)`` distinct env indices.
            actions: ``k`` action rows.
            check_ids: ``False`` skips the env-id check (the fast path for ids checked
                already, e.g. by a protocol session): ``env_ids`` must then be a
                ``(k,)`` int64 array of distinct ids in ``[0, N)``, none in flight.

        Returns:
            The :class:`~simkit._types.BatchStep` of ``env_ids`` and the faults of this
            step (with ``isolate_faults``; otherwise an env's exception propagates).

        Raises:
            ResetNeeded: an env was never reset.
            ValueError: a bad, repeated or in-flight env id.
            InvalidAction: the rows do not fit the action space (nothing moved).
        """
        ids = check_send_ids(env_ids, self.num_envs, self._in_flight) if check_ids else env_ids
        if not self._has_reset:  # every env has started an episode: nothing to scan
            never = ids[self.seeds.episode[ids] < 0]
            if never.size:
                raise ResetNeeded(f"envs {never.tolist()} were never reset; send reset first")
        rows = self._rows(actions, ids)
        self._faults = []
        if self._pool is None:
            for k, i in enumerate(ids.tolist()):
                self._step_env(i, rows[k], _SAME)
        else:
            parts: list[list[tuple[int, Any, AutoresetMode]]] = [[] for _ in self._chunks]
            for k, i in enumerate(ids.tolist()):
                parts[int(self._owner[i])].append((i, rows[k], _SAME))
            self._fan_out(self._run_steps, parts, inline_last=True)
        faults = sorted(self._faults, key=lambda f: f.env_id)
        return self._batch_step(ids), faults

    def reset_envs(
        self,
        env_ids: Any,
        *,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        options: Mapping[str, Any] | None = None,
        params: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets only ``env_ids`` (in that order): the array form of :meth:`reset`.

        Args:
            env_ids: ``(k,)`` distinct env indices.
            seed: a root seed for these envs (see :class:`simkit._seeding.EpisodeSeeds`).
            seeds: ``k`` explicit seeds, ``seeds[j]`` for ``env_ids[j]``.
            options: reset options for every env.
            params: ``k`` randomization overrides (or ``None``), merged over
                ``options["params"]`` for each env.

        Returns:
            The ``(k, ...)`` observations and the ``k`` reset infos.
        """
        self._require_idle("reset()")
        ids = check_send_ids(env_ids, self.num_envs, self._in_flight)
        plan = plan_env_resets(
            self.seeds, ids, seed=seed, seeds=seeds, options=options, params=params
        )
        infos = []
        for i, env_seed, opts in plan:
            obs, info = self.envs[i].reset(seed=env_seed, options=opts)
            self._obs_slot[i] = self._final_slot[i] = obs
            self._info_slot[i] = {}
            self._reset_info_slot[i] = None
            self._pending[i] = self._broken[i] = False
            infos.append(dict(info))
        self._has_reset = bool((self.seeds.episode >= 0).all())
        return self._gather(self._obs_slot, ids), infos

    def get_env_states(self, env_ids: Any) -> list[dict[str, Any]]:
        """Per-env snapshots: ``{"env", "root_seed", "episode_index", "obs"}`` each.

        Raises:
            ResetNeeded: an env was never reset.
            TypeError: an env is not a simkit env.
        """
        out = []
        for i in np.asarray(env_ids, dtype=np.int64).tolist():
            if self.seeds.episode[i] < 0:
                raise ResetNeeded(f"env {i}: get_state before reset; reset first")
            getter = getattr(self.envs[i].unwrapped, "get_state", None)
            if getter is None:
                raise TypeError(f"env {i} has no get_state(); snapshots need simkit envs")
            out.append(
                {
                    "env": getter(),
                    **self.seeds.env_state(i),
                    "obs": copy.deepcopy(self._obs_slot[i]),
                }
            )
        return out

    def set_env_states(self, env_ids: Any, states: Sequence[Mapping[str, Any]]) -> None:
        """Restores :meth:`get_env_states` snapshots, all or nothing.

        Raises:
            InvalidState: a malformed snapshot, or one an env rejects (nothing changes).
        """
        ids = np.asarray(env_ids, dtype=np.int64).tolist()
        need = {"env", "root_seed", "episode_index", "obs"}
        parsed = []
        for state in states:
            if not isinstance(state, Mapping) or need - set(state):
                raise InvalidState(
                    "a host snapshot holds env, root_seed, episode_index and obs",
                )
            parsed.append((EpisodeSeeds.parse_env_state(state), state["obs"]))
        restore_all([self.envs[i].unwrapped for i in ids], [s["env"] for s in states])
        for i, (seeding, obs) in zip(ids, parsed, strict=True):
            self.seeds.set_env_state(i, seeding)
            self._obs_slot[i] = self._final_slot[i] = copy.deepcopy(obs)
            self._pending[i] = self._broken[i] = False
        self._has_reset = bool((self.seeds.episode >= 0).all())

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Gymnasium's 5-tuple under ``metadata["autoreset_mode"]``, as ``SyncVectorEnv``.

        ``SAME_STEP``: ended envs are reset now; their last observation is in
        ``info["final_obs"]`` (mask ``info["_final_obs"]``), the step's info in
        ``info["final_info"]`` and the reset info merged into ``info``.
        ``NEXT_STEP``: an ended env ignores its next action and is reset instead
        (reward 0, flags False, the reset info). ``DISABLED``: no autoreset; stepping
        an ended env raises :class:`~simkit.errors.ResetNeeded`.
        """
        self._dispatch_all(actions, self.autoreset_mode)
        return self._gym_step()

    def _gym_step(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            reset_info = self._reset_info_slot[i]
            if reset_info is not None:
                infos = self._add_info(
                    infos, {"final_obs": self._final_slot[i], "final_info": self._info_slot[i]}, i
                )
                infos = self._add_info(infos, reset_info, i)
            else:
                infos = self._add_info(infos, self._info_slot[i], i)
        everyone = np.arange(self.num_envs)
        return (
            self._gather(self._obs_slot, everyone),
            self._reward.copy(),
            self._term.copy(),
            self._trunc.copy(),
            infos,
        )

    def _gather(self, slots: list[Any], ids: np.ndarray) -> Any:
        return gather_rows(self.single_observation_space, [slots[i] for i in ids.tolist()])

    def _batch_step(self, ids: np.ndarray) -> BatchStep:
        infos: list[dict[str, Any]] = []
        for i in ids.tolist():
            info, reset_info = self._info_slot[i], self._reset_info_slot[i]
            infos.append(info if reset_info is None else {**info, "reset_info": reset_info})
        return BatchStep(
            obs=self._gather(self._obs_slot, ids),
            reward=self._reward[ids],
            terminated=self._term[ids],
            truncated=self._trunc[ids],
            final_obs=self._gather(self._final_slot, ids),
            env_ids=np.asarray(ids, dtype=np.int64).copy(),
            infos=infos,
        )

    # ------------------------------------------------------------------------ async

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Starts stepping the envs ``env_ids`` (default all) with ``actions`` rows.

        Returns at once with threads; the steps autoreset in the same step, as
        :meth:`step_batch`. Collect them with :meth:`recv`.

        Raises:
            ValueError: an env id is out of range, repeated, or already in flight.
            InvalidAction: the actions do not fit (names the envs).
        """
        self._send(actions, env_ids, _SAME)

    def _send(self, actions: Any, env_ids: Any, mode: AutoresetMode) -> None:
        if not self._has_reset:
            raise ResetNeeded("send() called before reset(); call reset() or async_reset() first")
        ids = self._check_ids(env_ids)
        rows = self._rows(actions, ids)
        self._in_flight[ids] = True
        work = [(int(i), rows[k], mode) for k, i in enumerate(ids)]
        if self._pool is None:
            self._lazy.extend(work)
            return
        parts: list[list[tuple[int, Any, AutoresetMode]]] = [[] for _ in self._chunks]
        for item in work:
            parts[int(self._owner[item[0]])].append(item)
        for w, part in enumerate(parts):
            if part:
                self._pool.submit(w, self._run_steps, part, "step")
                self._tasks_out += 1

    def _check_ids(self, env_ids: Any) -> np.ndarray:
        return check_send_ids(env_ids, self.num_envs, self._in_flight)

    def recv(self) -> BatchStep:
        """The first ``batch_size`` envs to finish, as a :class:`~simkit._types.BatchStep`.

        ``env_ids`` names the rows' envs; send their next actions with
        :meth:`send`. Rows from :meth:`async_reset` have reward 0, no flags,
        ``final_obs == obs`` and the reset info under ``"reset_info"``.

        Raises:
            RuntimeError: fewer than ``batch_size`` envs are in flight.
        """
        ids = self._collect(self.batch_size)
        return self._batch_step(ids)

    def _collect(self, count: int) -> np.ndarray:
        if int(self._in_flight.sum()) < count:
            raise RuntimeError(
                f"recv() needs {count} envs in flight, only {int(self._in_flight.sum())} are; "
                "send() actions for more envs first"
            )
        while len(self._ready) < count:
            if self._lazy:
                i, action, mode = self._lazy.popleft()
                try:
                    self._step_env(i, action, mode)
                except BaseException:
                    self._abort_async()
                    raise
                self._ready.append(i)
                continue
            assert self._pool is not None
            _, done, exc = self._pool.get()
            self._tasks_out -= 1
            if exc is not None:
                self._abort_async()
                raise exc
            self._ready.extend(done)
        ids = np.array([self._ready.popleft() for _ in range(count)], dtype=np.int64)
        self._in_flight[ids] = False
        return ids

    def _abort_async(self) -> None:
        """After a failed step: drain every outstanding task and forget in-flight envs."""
        while self._tasks_out:
            assert self._pool is not None
            self._pool.get()
            self._tasks_out -= 1
        self._lazy.clear()
        self._ready.clear()
        self._in_flight[:] = False

    def async_reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """Resets every env (as :meth:`reset`) and queues all N as ready for :meth:`recv`."""
        self.reset(seed=seed, options=options)
        for i in range(self.num_envs):
            self._reset_info_slot[i] = self._info_slot[i]
            self._info_slot[i] = {}
            self._reward[i] = 0.0
            self._term[i] = self._trunc[i] = False
        self._in_flight[:] = True
        self._ready.extend(range(self.num_envs))

    def step_async(self, actions: Any) -> None:
        """Gymnasium's asynchronous step: starts stepping all N envs."""
        self._send(actions, None, self.autoreset_mode)
        self._waiting_all = True

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Waits for every env sent by :meth:`step_async`; returns :meth:`step`'s tuple."""
        if not self._waiting_all:
            raise RuntimeError("step_wait() called without a pending step_async()")
        self._collect(self.num_envs)
        self._waiting_all = False
        return self._gym_step()

    def _require_idle(self, what: str) -> None:
        if self._in_flight.any():
            raise RuntimeError(
                f"{what} called with envs {np.flatnonzero(self._in_flight).tolist()} in flight; "
                "recv() them first"
            )

    # -------------------------------------------------------------------- snapshots

    def get_state(self) -> dict[str, Any]:
        """A snapshot of the whole vector: per-env snapshots, seeds and counters.

        Plain data: round-trips through :func:`simkit.snapshot.dumps`/``loads``;
        :meth:`set_state` on this or a fresh vector of the same env and size continues
        bit-identically.

        Raises:
            ResetNeeded: before the first reset.
            RuntimeError: envs are in flight.
            TypeError: an env has no ``get_state`` (not a simkit env).
        """
        if not self._has_reset:
            raise ResetNeeded("get_state() called before reset(); call reset() first")
        self._require_idle("get_state()")
        envs = []
        for i, env in enumerate(self.envs):
            getter = getattr(env.unwrapped, "get_state", None)
            if getter is None:
                raise TypeError(
                    f"env {i} ({type(env.unwrapped).__name__}) has no get_state(); "
                    "vector snapshots need simkit envs"
                )
            envs.append(getter())
        return {
            "format": VECTOR_STATE_FORMAT,
            "num_envs": self.num_envs,
            **self.seeds.get_state(),
            "pending_reset": self._pending.copy(),
            "envs": envs,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a snapshot from :meth:`get_state`.

        Raises:
            InvalidState: malformed, or taken from a vector of another size.
        """
        if not isinstance(state, Mapping):
            raise InvalidState(f"state must be a dict from get_state(), got {type(state).__name__}")
        missing = {"format", "num_envs", "root_seeds", "episode_index", "pending_reset", "envs"}
        missing -= set(state)
        if missing:
            raise InvalidState(
                f"state is missing fields {sorted(missing)}; was it made by get_state()?"
            )
        if state["format"] != VECTOR_STATE_FORMAT:
            raise InvalidState(
                f"state format must be {VECTOR_STATE_FORMAT}, got {state['format']!r}"
            )
        n = self.num_envs
        if state["num_envs"] != n or len(state["envs"]) != n:
            raise InvalidState(f"state holds {state['num_envs']} envs, this vector has {n}")
        self._require_idle("set_state()")
        seeds = EpisodeSeeds.parse_state(state, n)
        pending = np.asarray(state["pending_reset"], dtype=np.bool_).copy()
        restore_all([env.unwrapped for env in self.envs], state["envs"])
        self.seeds.set_state(seeds)
        self._pending = pending
        self._has_reset = True

    # ------------------------------------------------------------------------- misc

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` of every env (or reads the attribute)."""
        results = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env."""
        return tuple(env.get_wrapper_attr(name) for env in self.envs)

    def render(self) -> tuple[Any, ...]:
        """Every env's ``render()``."""
        return tuple(env.render() for env in self.envs)

    def __del__(self) -> None:
        # Worker threads hold the pool, not the vector: stop them with the vector.
        if getattr(self, "_pool", None) is not None and not getattr(self, "closed", True):
            with contextlib.suppress(Exception):
                self.close()

    def close_extras(self, **kwargs: Any) -> None:
        """Stops the worker threads and closes every env."""
        if self._pool is not None:
            self._abort_async()
            self._pool.close()
            self._pool = None
        for env in getattr(self, "envs", []):
            env.close()


def make_vec(env_id: str, num_envs: int, **kwargs: Any) -> VectorEnv:
    """Builds a :class:`VectorEnv` of ``num_envs`` instances of ``env_id``.

    ``kwargs`` are :class:`VectorEnv`'s keyword arguments (``num_threads``,
    ``autoreset_mode``, ``params``, ``env_kwargs``, ...).
    """
    return VectorEnv(env_id, num_envs, **kwargs)


def _build_envs(
    env_fns: str | Sequence[Callable[[], gym.Env[Any, Any]]],
    num_envs: int | None,
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
    env_kwargs: Mapping[str, Any] | None,
) -> list[gym.Env[Any, Any]]:
    if isinstance(env_fns, str):
        if num_envs is None:
            raise TypeError("num_envs is required when building envs from an id")
        n = _positive_int(num_envs, "num_envs")
        per_env = _per_env_params(params, n)
        kwargs = dict(env_kwargs or {})
        envs: list[gym.Env[Any, Any]] = []
        for i in range(n):
            extra = {"params": per_env[i]} if per_env[i] is not None else {}
            envs.append(make(env_fns, **kwargs, **extra))
        return envs
    if isinstance(env_fns, Sequence):
        if params is not None or env_kwargs is not None:
            raise ValueError(
                "params and env_kwargs apply to envs built from an id; with env_fns, "
                "pass them inside the functions"
            )
        if not env_fns:
            raise ValueError("env_fns must hold at least one function, got none")
        if num_envs is not None and num_envs != len(env_fns):
            raise ValueError(f"num_envs={num_envs} but {len(env_fns)} env_fns were given")
        built = [fn() for fn in cast(Sequence[Callable[[], Any]], env_fns)]
        for i, env in enumerate(built):
            if not isinstance(env, gym.Env):
                raise TypeError(
                    f"env_fns[{i}] must return a gymnasium.Env, got {type(env).__name__}"
                )
        return built
    raise TypeError(
        f"env_fns must be an env id or a sequence of env functions, got {type(env_fns).__name__}"
    )


def _per_env_params(
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, n: int
) -> list[Mapping[str, Any] | None]:
    if params is None:
        return [None] * n
    if isinstance(params, Mapping):
        return [params] * n
    if isinstance(params, Sequence) and not isinstance(params, str):
        if len(params) != n:
            raise ValueError(
                f"params must be one mapping or a list of {n} mappings, got {len(params)}"
            )
        for i, p in enumerate(params):
            if p is not None and not isinstance(p, Mapping):
                raise TypeError(f"params[{i}] must be a mapping or None, got {type(p).__name__}")
        return list(params)
    raise TypeError(f"params must be a mapping or a list of mappings, got {type(params).__name__}")


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


_LEAF = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def gather_rows(space: spaces.Space[Any], rows: list[Any]) -> Any:
    """Observations ``rows`` of ``space`` stacked into one batch of ``batch_space(space, n)``.

    What ``gymnasium.vector.utils.concatenate`` builds (the same values and dtype), with
    a direct path for array spaces.
    """
    if isinstance(space, _LEAF):
        shape: tuple[int, ...] = space.shape or ()
        out = np.empty((len(rows), *shape), dtype=space.dtype)
        if len(rows) == 1:
            out[0] = rows[0]
            return out
        return np.stack(rows, axis=0, out=out)
    empty: Any = create_empty_array(space, len(rows), np.zeros)
    return concatenate(space, rows, empty)


def with_params(
    options: Mapping[str, Any] | None, params: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Reset options with one env's randomization overrides merged over ``options["params"]``."""
    if not params:
        return None if options is None else dict(options)
    opts = dict(options or {})
    opts["params"] = {**dict(opts.get("params") or {}), **dict(params)}
    return opts


def plan_env_resets(
    seeding: EpisodeSeeds,
    env_ids: np.ndarray,
    *,
    seed: int | None,
    seeds: Sequence[int] | None,
    options: Mapping[str, Any] | None,
    params: Sequence[Mapping[str, Any] | None] | None,
) -> list[tuple[int, int | None, dict[str, Any] | None]]:
    """What a ``reset_envs`` call does to each env, in order: ``(env, seed, options)``.

    The seeds come from ``seeding`` (which advances its counters): a root ``seed``,
    explicit ``seeds`` or neither (:meth:`EpisodeSeeds.plan_reset`); the options are
    ``options`` with ``params[k]`` merged over ``options["params"]`` (:func:`with_params`).
    """
    planned = seeding.plan_reset(env_ids, seed=seed, seeds=seeds)
    return [
        (i, planned[k], with_params(options, None if params is None else params[k]))
        for k, i in enumerate(env_ids.tolist())
    ]


def _check_mask(mask: Any, n: int) -> np.ndarray:
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (n,):
        got = f"{mask.dtype} {mask.shape}" if isinstance(mask, np.ndarray) else type(mask).__name__
        raise ValueError(f"options['reset_mask'] must be a bool array of shape ({n},), got {got}")
    if not mask.any():
        raise ValueError("options['reset_mask'] must select at least one env")
    return mask
