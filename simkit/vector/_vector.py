"""``simkit.vector.VectorEnv``: N single-instance envs in one process, on a thread pool.

The Gymnasium face of :class:`simkit.vector._core.VectorCore` (one agent row per env):
Gymnasium's reset and 5-tuple step under its autoreset modes, the typed ``step_batch``,
and EnvPool-style ``send``/``recv``. Stepping, autoreset, seeding, subset steps and
snapshots are the core's.
"""

from __future__ import annotations

import contextlib
import copy
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from simkit._state import check_observation, state_array
from simkit._types import BatchStep, RowStep, StepFault
from simkit._validation import ActionBounds, check_send_ids
from simkit.errors import ResetNeeded
from simkit.vector._actions import check_batch, split_rows
from simkit.vector._build import build_envs, gather_rows, positive_int
from simkit.vector._core import VECTOR_STATE_FORMAT, VectorCore

__all__ = ["VectorEnv", "make_vec", "VECTOR_STATE_FORMAT", "gather_rows", "info_row"]

_SAME = AutoresetMode.SAME_STEP


class VectorEnv(VectorCore, gym.vector.VectorEnv[Any, Any, Any]):
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

    _state_fields = frozenset({"pending_reset"})
    _env_state_fields = frozenset({"obs"})

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
        self._pool = None
        envs: list[gym.Env[Any, Any]] = build_envs(env_fns, num_envs, params, env_kwargs)
        for i, env in enumerate(envs):
            if not isinstance(env, gym.Env):
                for other in envs:
                    getattr(other, "close", lambda: None)()
                raise TypeError(f"env {i} must be a gymnasium.Env, got {_kind_of(env)}")
        n = len(envs)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        first = envs[0]
        self.metadata = {**first.metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = first.render_mode
        self.spec = None  # RecordEpisodes takes spec.id without its kwargs: see docs/vector.md
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        for i, env in enumerate(envs):
            for what, space, mine in (
                ("observation", env.observation_space, self.single_observation_space),
                ("action", env.action_space, self.single_action_space),
            ):
                if space != mine:
                    raise ValueError(
                        f"every env must share one {what} space; env 0 has {mine}, "
                        f"env {i} has {space}"
                    )
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.validate_actions = validate_actions
        if validate_actions:
            for env in envs:
                if hasattr(env.unwrapped, "validate_actions"):
                    env.unwrapped.validate_actions = False
        self.num_threads = positive_int(num_threads, "num_threads")
        self.batch_size = n if batch_size is None else positive_int(batch_size, "batch_size")
        if self.batch_size > n:
            raise ValueError(f"batch_size must be <= num_envs={n}, got {self.batch_size}")
        bounds = getattr(first.unwrapped, "action_bounds", ActionBounds.CLIP)
        self._init_core(envs, 1, bounds=bounds, num_threads=self.num_threads, live=True)
        # Async bookkeeping.
        self._ready: deque[int] = deque()
        self._lazy: deque[tuple[int, Any, AutoresetMode]] = deque()
        self._tasks_out = 0
        self._waiting_all = False

    @property
    def root_seeds(self) -> list[int | None]:
        """Each env's root seed; ``None`` for an env reset with an explicit seed."""
        return list(self.seeds.roots)

    # -------------------------------------------------------- one env, one agent row

    def _write_rows(self, i: int, result: tuple[Any, ...]) -> bool:
        obs, reward, terminated, truncated, info = result
        self._final_rows[i] = self._obs_rows[i] = obs
        self._reward[i] = reward
        self._term[i] = terminated
        self._trunc[i] = truncated
        self._info_rows[i] = info
        self._reset_info_rows[i] = None
        return bool(terminated or truncated)

    def _drop_rows(self, i: int) -> None:
        """Nothing: a single agent's row stays live and keeps its last observation."""

    def _reset_rows(
        self, i: int, seed: int | None, options: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        obs, info = self.envs[i].reset(seed=seed, options=options)
        self._obs_rows[i] = obs
        return [info]

    def _action_rows(self, actions: Any, ids: np.ndarray) -> list[Any]:
        if self.validate_actions:
            return check_batch(self.single_action_space, actions, ids, self._bounds)
        return split_rows(self.single_action_space, actions, len(ids))

    def _rows_state(self) -> dict[str, Any]:
        return {"pending_reset": self._pending.copy()}

    def _restore_rows(self, state: Mapping[str, Any]) -> Callable[[], None]:
        pending = state_array(state["pending_reset"], "state['pending_reset']", "b", self.num_envs)

        def apply() -> None:
            self._pending = pending

        return apply

    def _env_rows_state(self, i: int) -> dict[str, Any]:
        return {"obs": copy.deepcopy(self._obs_rows[i])}

    def _restore_env_rows(self, state: Mapping[str, Any]) -> Callable[[int], None]:
        obs = state["obs"]
        check_observation(self.single_observation_space, obs, "state['obs']")

        def apply(i: int) -> None:
            self._obs_rows[i] = self._final_rows[i] = copy.deepcopy(obs)

        return apply

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

        A root seed also seeds the vector's own ``np_random`` (``np_random_seed`` is
        it), as Gymnasium's ``VectorEnv.reset`` does.
        """
        self._require_idle("reset()")
        ids = self._reset_every(seed, options)
        if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
            # Gymnasium's VectorEnv.reset seeds the vector's own np_random (as BatchEnv)
            self._np_random, self._np_random_seed = seeding.np_random(int(seed))
        infos: dict[str, Any] = {}
        for i in ids:
            infos = self._add_info(infos, self._info_rows[i], int(i))
        return self._gather(self._obs_rows, np.arange(self.num_envs)), infos

    # ------------------------------------------------------------------------- step

    def _every_env(self, actions: Any) -> tuple[np.ndarray, list[Any]]:
        """Every env's id and checked action, for a synchronous step of them all."""
        if not self._has_reset:
            raise ResetNeeded("step() called before reset(); call reset() first")
        self._require_idle("step()")
        ids = np.arange(self.num_envs, dtype=np.int64)
        return ids, self._action_rows(actions, ids)

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
        ids, rows = self._every_env(actions)
        self._dispatch(ids, rows, _SAME)
        return self._batch_step(ids)

    def step_rows(self, actions: Any) -> RowStep:
        """Steps every env as :meth:`step_batch` does; the rows as a rollout reads them
        (:class:`~simkit._types.RowStep`: fresh arrays, every row live, no infos)."""
        ids, rows = self._every_env(actions)
        self._dispatch(ids, rows, _SAME)
        return RowStep(
            obs=np.asarray(self._gather(self._obs_rows, ids)),
            mask=np.ones(self.num_envs, dtype=np.bool_),
            reward=self._reward.copy(),
            terminated=self._term.copy(),
            truncated=self._trunc.copy(),
            final_obs=np.asarray(self._gather(self._final_rows, ids)),
        )

    def reset_rows(self, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`reset` of every env as a rollout reads it: ``(obs, mask)`` of every
        row (fresh arrays; every row live)."""
        obs, _ = self.reset(seed=seed)
        return np.array(obs), np.ones(self.num_envs, dtype=np.bool_)

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
        ids = self._step_ids(env_ids, actions, check_ids)
        faults = sorted(self._faults, key=lambda f: f.env_id)
        return self._batch_step(ids), faults

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Gymnasium's 5-tuple under ``metadata["autoreset_mode"]``, as ``SyncVectorEnv``.

        ``SAME_STEP``: ended envs are reset now; their last observation is in
        ``info["final_obs"]`` (mask ``info["_final_obs"]``), the step's info in
        ``info["final_info"]`` and the reset info merged into ``info``.
        ``NEXT_STEP``: an ended env ignores its next action and is reset instead
        (reward 0, flags False, the reset info). ``DISABLED``: no autoreset; stepping
        an ended env raises :class:`~simkit.errors.ResetNeeded`.
        """
        self._dispatch(*self._every_env(actions), self.autoreset_mode)
        return self._gym_step()

    def _gym_step(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            reset_info = self._reset_info_rows[i]
            if reset_info is not None:
                infos = self._add_info(
                    infos, {"final_obs": self._final_rows[i], "final_info": self._info_rows[i]}, i
                )
                infos = self._add_info(infos, reset_info, i)
            else:
                infos = self._add_info(infos, self._info_rows[i], i)
        everyone = np.arange(self.num_envs)
        return (
            self._gather(self._obs_rows, everyone),
            self._reward.copy(),
            self._term.copy(),
            self._trunc.copy(),
            infos,
        )

    def _batch_step(self, ids: np.ndarray) -> BatchStep:
        return BatchStep(
            obs=self._gather(self._obs_rows, ids),
            reward=self._reward[ids],
            terminated=self._term[ids],
            truncated=self._trunc[ids],
            final_obs=self._gather(self._final_rows, ids),
            env_ids=np.asarray(ids, dtype=np.int64).copy(),
            infos=self._row_infos(ids),
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
        ids = check_send_ids(env_ids, self.num_envs, self._in_flight, allow_empty=False)
        rows = self._action_rows(actions, ids)
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
            self._reset_info_rows[i] = self._info_rows[i]
            self._info_rows[i] = {}
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

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Sets attribute ``name`` of every env, as Gymnasium's vectors do: ``values[i]``
        for env ``i``, or one value (not a list or tuple) for all.

        Raises:
            ValueError: a list or tuple of another length than ``num_envs``.
        """
        self._require_idle("set_attr()")
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                f"set_attr needs one value per env or one for all: {self.num_envs} values, "
                f"got {len(values)}"
            )
        for env, value in zip(self.envs, values, strict=True):
            env.set_wrapper_attr(name, value)

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
        self._close_core()


def info_row(info: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Row ``i``'s info out of a Gymnasium vector info, the inverse of ``_add_info``:
    each key whose ``_key`` mask marks row ``i`` (maps by the same rule, inside). The
    masks, and a key without one (Gymnasium's vectors write none), are left out.

    One function for every reader of a vector info: the recorder, the BatchEnv server's
    rows, the SB3 adapter's reset infos and the conformance kit.
    """
    return {
        key: info_row(value, i) if isinstance(value, Mapping) else value[i]
        for key, value in info.items()
        if not (isinstance(key, str) and key.startswith("_"))
        and (mask := info.get(f"_{key}")) is not None
        and bool(mask[i])
    }


def make_vec(env_id: str, num_envs: int, **kwargs: Any) -> VectorEnv:
    """Builds a :class:`VectorEnv` of ``num_envs`` instances of ``env_id``.

    ``kwargs`` are :class:`VectorEnv`'s keyword arguments (``num_threads``,
    ``autoreset_mode``, ``params``, ``env_kwargs``, ...).
    """
    return VectorEnv(env_id, num_envs, **kwargs)


def _kind_of(env: Any) -> str:
    """What ``env`` is, and where it belongs instead of a VectorEnv."""
    name = type(env).__name__
    if isinstance(env, gym.vector.VectorEnv):
        return f"{name}, a vector itself (a batch env: use it as it is, not in a VectorEnv)"
    if hasattr(env, "possible_agents"):
        return f"{name}, a multi-agent env (simkit.vector.MultiAgentVectorEnv steps those)"
    return name
