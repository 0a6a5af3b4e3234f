"""The one vector core: N envs as rows, stepped, autoreset, seeded and snapshotted once.

Every env owns ``agents_per_env`` consecutive rows: a single-agent env is an env with
one agent row, a multi-agent env has one row per possible agent (row ``i * A + s`` is
agent ``s`` of env ``i``). :class:`VectorCore` holds each row's slots (observation,
final observation, reward, flags, info, reset info, whether its agent is live) and owns
what both vectors do the same way: the per-env step with fault isolation and same-step
or next-step autoreset, the thread pool, subset steps and array-form resets, seeding
through :class:`~simkit._seeding.EpisodeSeeds`, and whole and per-env snapshots.

A face (``VectorEnv``, ``MultiAgentVectorEnv``) supplies how one env maps onto its rows
(``_write_rows``, ``_reset_rows``, ``_drop_rows``), how a batch of actions is checked and
shaped into each env's ``step`` argument (``_action_rows``), the extra fields of its
snapshots, and its public API.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker

from simkit._seeding import EpisodeSeeds
from simkit._state import check_envelope, is_tag, restore_all
from simkit._types import StepFault
from simkit._validation import ActionBounds, check_send_ids, checked_env_ids
from simkit.errors import InvalidState, ResetNeeded
from simkit.vector._build import check_mask, check_overrides, gather_rows, plan_env_resets
from simkit.vector._pool import WorkerPool

__all__ = ["VectorCore", "VECTOR_STATE_FORMAT"]

VECTOR_STATE_FORMAT = 1
"""Version of the snapshot layout produced by the vectors' ``get_state``."""

_SAME, _NEXT = AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP

_Work = list[tuple[int, Any, AutoresetMode]]


def snapshot_env(env: Any, i: int) -> Any:
    """The env that a snapshot of env ``i`` reads and restores: the env under
    ``gymnasium.make``'s checks (``OrderEnforcing``, ``PassiveEnvChecker``: no state of
    the episode), a PettingZoo env's ``unwrapped``.

    Raises:
        TypeError: another Gymnasium wrapper, which keeps state of its own (running
            statistics, step counts, ...) that no snapshot holds: a restored vector would
            not continue bit for bit, so it is refused, naming the wrapper and the fix.
    """
    inner, wrapper = env.unwrapped, env
    if not hasattr(inner, "get_state"):
        return inner  # no simkit env: the caller says so, whatever wraps it
    while isinstance(wrapper, gym.Wrapper):
        if not isinstance(wrapper, OrderEnforcing | PassiveEnvChecker):
            raise TypeError(
                f"env {i} is wrapped in {type(wrapper).__name__}, whose own state (running "
                "statistics, step counts, ...) a snapshot does not hold, so a restored "
                "vector would not continue bit for bit: snapshot vectors of unwrapped "
                "envs and wrap the vector instead (gymnasium.wrappers.vector), and give "
                "a time limit as the env's max_episode_steps"
            )
        wrapper = wrapper.env
    return inner


class VectorCore(abc.ABC):
    """The rows, stepping, autoreset, seeding and snapshots both vectors share.

    Not a public class: ``VectorEnv`` and ``MultiAgentVectorEnv`` derive from it and call
    :meth:`_init_core` from their constructors.
    """

    envs: list[Any]
    num_envs: int
    agents_per_env: int
    single_observation_space: Any
    single_action_space: Any
    isolate_faults: bool
    validate_actions: bool
    autoreset_mode: AutoresetMode
    _state_fields: frozenset[str] = frozenset()
    """The face's fields of a whole snapshot, beside the core's."""
    _env_state_fields: frozenset[str] = frozenset()
    """The face's fields of a per-env snapshot, beside ``env`` and the seeding."""
    _undoes_autoresets = False
    """Whether :meth:`reset_envs` can replace an autoreset: the face clears
    ``_env_reset`` of the envs each step steps, so it says whether an env's last step
    autoreset it."""

    def _init_core(
        self,
        envs: list[Any],
        agents_per_env: int,
        *,
        bounds: Any,
        num_threads: int,
        live: bool,
        first_obs: Callable[[], Any] | None = None,
    ) -> None:
        """Sets up the rows of ``envs`` (``agents_per_env`` each) and the worker threads.

        Args:
            bounds: the envs' ``action_bounds`` (anything else reads as ``CLIP``).
            num_threads: worker threads (1: inline).
            live: whether rows start live (a single-agent row always is).
            first_obs: each row's observation before the first reset (default ``None``).
        """
        self.envs = envs
        n = self.num_envs = len(envs)
        a = self.agents_per_env = agents_per_env
        rows = n * a
        self._bounds = bounds if isinstance(bounds, ActionBounds) else ActionBounds.CLIP
        self.seeds = EpisodeSeeds(n)
        self._has_reset = False
        self._pending = np.zeros(n, dtype=np.bool_)
        self._broken = np.zeros(n, dtype=np.bool_)
        self._env_reset = np.zeros(n, dtype=np.bool_)
        self._in_flight = np.zeros(n, dtype=np.bool_)
        self._undo: dict[int, tuple[int, Mapping[str, Any] | None]] = {}
        """Per env an autoreset started the episode of: its episode counter and generator
        state before that autoreset (:meth:`reset_envs` ``replace_autoreset``)."""
        self._faults: list[StepFault] = []
        # Per-row slots, written by whichever thread steps the row's env.
        self._obs_rows: list[Any] = [first_obs() if first_obs else None for _ in range(rows)]
        self._final_rows: list[Any] = [None] * rows
        self._reward = np.zeros(rows, dtype=np.float64)
        self._term = np.zeros(rows, dtype=np.bool_)
        self._trunc = np.zeros(rows, dtype=np.bool_)
        self._info_rows: list[dict[str, Any]] = [{} for _ in range(rows)]
        self._reset_info_rows: list[dict[str, Any] | None] = [None] * rows
        self._mask = np.full(rows, live, dtype=np.bool_)
        workers = min(num_threads, n)
        self._chunks = [c.astype(np.int64) for c in np.array_split(np.arange(n), workers)]
        self._owner = np.empty(n, dtype=np.int64)
        for w, chunk in enumerate(self._chunks):
            self._owner[chunk] = w
        self._pool: WorkerPool | None = WorkerPool(workers) if workers > 1 else None

    @property
    def episode_index(self) -> np.ndarray:
        """Each env's current episode number (a copy; -1 before the first reset)."""
        return self.seeds.episode.copy()

    def _global_rows(self, env_ids: np.ndarray) -> np.ndarray:
        """The rows of ``env_ids``, each env's agent rows in order."""
        a = self.agents_per_env
        if a == 1:
            return env_ids
        return (env_ids[:, None] * a + np.arange(a)).reshape(-1)

    # ------------------------------------------------------------- the face's part

    @abc.abstractmethod
    def _write_rows(self, i: int, result: tuple[Any, ...]) -> bool:
        """Writes env ``i``'s ``step`` result into its rows; True if its episode ended."""

    @abc.abstractmethod
    def _reset_rows(
        self, i: int, seed: int | None, options: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        """Resets env ``i``, writes its rows' observations (and liveness); its row infos."""

    @abc.abstractmethod
    def _drop_rows(self, i: int) -> None:
        """After env ``i``'s step raised: what its rows show until the restart."""

    @abc.abstractmethod
    def _action_rows(self, actions: Any, ids: np.ndarray) -> list[Any]:
        """The checked actions of ``ids``, one per env, as its ``step`` takes them."""

    # --------------------------------------------------------------------- stepping

    def _step_env(self, i: int, action: Any, mode: AutoresetMode) -> None:
        """Steps (or autoresets) env ``i`` and writes its rows; runs on any thread."""
        if self._pending[i]:
            self._reset_pending(i, mode)
            return
        if self._broken[i]:
            self._faults.append(StepFault(i, None, "broken"))
            self._end_rows(i, truncate=True)
            return
        try:
            ended = self._write_rows(i, self.envs[i].step(action))
        except Exception as exc:
            if not self.isolate_faults:
                raise
            self._faults.append(StepFault(i, exc, "step"))
            self._end_rows(i, truncate=True)
            self._drop_rows(i)
            ended = True
        if not ended:
            return
        if mode is not _SAME:
            self._pending[i] = True
            return
        self._env_reset[i] = True
        if self._undoes_autoresets:
            rng = self._generator(i)
            state = None if rng is None else rng.bit_generator.state
            self._undo[i] = (int(self.seeds.episode[i]), state)
        try:
            infos = self._reset_rows(i, self.seeds.next_one(i), None)
        except Exception as exc:
            if not self.isolate_faults:
                raise
            self._faults.append(StepFault(i, exc, "reset"))
            self._broken[i] = True
            return
        base = i * self.agents_per_env
        for s, info in enumerate(infos):
            self._reset_info_rows[base + s] = info

    def _generator(self, i: int) -> np.random.Generator | None:
        """Env ``i``'s own generator (a simkit or Gymnasium env's), if it has one."""
        rng = getattr(self.envs[i].unwrapped, "_np_random", None)
        return rng if isinstance(rng, np.random.Generator) else None

    def _reset_pending(self, i: int, mode: AutoresetMode) -> None:
        """An env that ended under ``NEXT_STEP``: its reset replaces this step."""
        if mode is not _NEXT:
            raise ResetNeeded(
                f"env {i} ended its episode and was not reset; with autoreset_mode "
                f"{self.autoreset_mode.name} reset it with reset(options={{'reset_mask': mask}})"
            )
        infos = self._reset_rows(i, self.seeds.next_one(i), None)
        base = i * self.agents_per_env
        for s, info in enumerate(infos):
            r = base + s
            self._final_rows[r] = self._obs_rows[r]
            self._reward[r] = 0.0
            self._term[r] = self._trunc[r] = False
            self._info_rows[r] = info
            self._reset_info_rows[r] = None
        self._pending[i] = False

    def _end_rows(self, i: int, *, truncate: bool) -> None:
        """Env ``i``'s rows without a step: reward 0, last observation, no info; with
        ``truncate`` the live rows end truncated (a failed or broken env)."""
        base = i * self.agents_per_env
        for r in range(base, base + self.agents_per_env):
            self._final_rows[r] = self._obs_rows[r]
            self._reward[r] = 0.0
            self._term[r] = False
            self._trunc[r] = truncate and bool(self._mask[r])
            self._info_rows[r] = {}
            self._reset_info_rows[r] = None

    def _run_steps(self, part: _Work) -> list[int]:
        for i, action, mode in part:
            self._step_env(i, action, mode)
        return [i for i, _, _ in part]

    def _dispatch(self, ids: np.ndarray, actions: list[Any], mode: AutoresetMode) -> None:
        """Steps ``ids`` (``actions[k]`` for ``ids[k]``) now, one task per thread chunk."""
        self._faults = []
        if self._pool is None:
            for k, i in enumerate(ids.tolist()):
                self._step_env(i, actions[k], mode)
            return
        parts: list[_Work] = [[] for _ in self._chunks]
        for k, i in enumerate(ids.tolist()):
            parts[int(self._owner[i])].append((i, actions[k], mode))
        self._fan_out(self._run_steps, parts)

    def _fan_out(self, fn: Callable[[Any], Any], parts: list[Any]) -> None:
        """Runs ``fn(parts[w])`` on worker ``w``, the last part on the calling thread."""
        assert self._pool is not None
        sent = 0
        for w in range(len(parts) - 1):
            if parts[w]:
                self._pool.submit(w, fn, parts[w], None)
                sent += 1
        error: BaseException | None = None
        if parts[-1]:
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

    def _step_ids(self, env_ids: Any, actions: Any, check_ids: bool) -> np.ndarray:
        """Checks ``env_ids`` and their actions, then steps them with same-step autoreset."""
        ids = (
            check_send_ids(env_ids, self.num_envs, self._in_flight, allow_empty=False)
            if check_ids
            else env_ids
        )
        if not self._has_reset:  # every env has started an episode: nothing to scan
            never = ids[self.seeds.episode[ids] < 0]
            if never.size:
                raise ResetNeeded(f"envs {never.tolist()} were never reset; send reset first")
        self._dispatch(ids, self._action_rows(actions, ids), _SAME)
        return ids

    def _gather(self, slots: list[Any], rows: np.ndarray) -> Any:
        return gather_rows(self.single_observation_space, [slots[r] for r in rows.tolist()])

    def _row_infos(self, rows: np.ndarray) -> list[dict[str, Any]]:
        """Each row's step info, with the next episode's under ``"reset_info"``."""
        infos: list[dict[str, Any]] = []
        for r in rows.tolist():
            info, reset_info = self._info_rows[r], self._reset_info_rows[r]
            infos.append(info if reset_info is None else {**info, "reset_info": reset_info})
        return infos

    # ----------------------------------------------------------------------- resets

    def _reset_env(
        self, i: int, seed: int | None, options: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        """Resets env ``i`` outside a step: its rows start over, nothing pending."""
        self._undo.pop(i, None)
        infos = self._reset_rows(i, seed, options)
        base = i * self.agents_per_env
        for s, info in enumerate(infos):
            self._final_rows[base + s] = self._obs_rows[base + s]
            self._info_rows[base + s] = info
            self._reset_info_rows[base + s] = None
        return infos

    def _reset_every(self, seed: Any, options: Mapping[str, Any] | None) -> np.ndarray:
        """A Gymnasium-style reset of every env, or of ``options["reset_mask"]``'s, with
        the other options for all; returns the ids reset. Every env's overrides are
        checked (:func:`check_overrides`) before the seeds are planned, so a refused
        reset advances no episode counter."""
        opts = dict(options) if options is not None else None
        ids = np.arange(self.num_envs)
        if opts is not None and "reset_mask" in opts:
            mask = check_mask(opts.pop("reset_mask"), self.num_envs)
            if not self._has_reset and not mask.all():
                raise ResetNeeded("the first reset() must reset every env")
            ids = np.flatnonzero(mask)
        for i in ids.tolist():
            check_overrides(self.envs[i], opts)
        self._reset_many(ids, self.seeds.plan(ids, seed), opts)
        return ids

    def _reset_many(
        self, ids: np.ndarray, seeds: list[int | None], options: dict[str, Any] | None
    ) -> None:
        """Resets ``ids`` with ``seeds`` on the worker threads; each env gets its own
        copy of ``options``."""

        def run(part: list[tuple[int, int | None]]) -> None:
            for i, s in part:
                self._reset_env(i, s, copy.deepcopy(options))

        work = list(zip(ids.tolist(), seeds, strict=True))
        if self._pool is None:
            run(work)
        else:
            parts: list[list[tuple[int, int | None]]] = [[] for _ in self._chunks]
            for i, s in work:
                parts[int(self._owner[i])].append((i, s))
            self._fan_out(run, parts)
        self._has_reset = True
        self._pending[ids] = self._broken[ids] = False

    def reset_envs(
        self,
        env_ids: Any,
        *,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        options: Mapping[str, Any] | None = None,
        params: Sequence[Mapping[str, Any] | None] | None = None,
        replace_autoreset: bool = False,
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets only ``env_ids`` (in that order): the array form of ``reset``.

        Args:
            env_ids: ``(k,)`` distinct env indices.
            seed: a root seed for these envs (see :class:`simkit._seeding.EpisodeSeeds`).
            seeds: ``k`` explicit seeds, ``seeds[j]`` for ``env_ids[j]``.
            options: reset options for every env.
            params: ``k`` randomization overrides (or ``None``), merged over
                ``options["params"]`` for each env.
            replace_autoreset: for each env whose last step autoreset it, this reset
                replaces that autoreset: its episode counter and generator go back to
                where they were before it, so the reset draws what a single env reset
                after its episode's end would (a remote PettingZoo env's
                ``reset(options=...)`` after its agents finished).

        Returns:
            The observation rows of those envs and their reset infos (one per row).
        """
        self._require_idle("reset()")
        ids = check_send_ids(env_ids, self.num_envs, self._in_flight, allow_empty=False)
        undo = self._take_undo(ids) if replace_autoreset else {}
        now = {i: int(self.seeds.episode[i]) for i in undo}
        for i, (episode, _) in undo.items():
            self.seeds.episode[i] = episode
        try:
            plan = plan_env_resets(
                self.seeds,
                ids,
                seed=seed,
                seeds=seeds,
                options=options,
                params=params,
                envs=self.envs,
            )
        except BaseException:  # a refused reset changes nothing
            for i, episode in now.items():
                self.seeds.episode[i] = episode
            self._undo.update(undo)
            raise
        for i, (_, state) in undo.items():
            rng = self._generator(i)
            if rng is not None and state is not None:
                rng.bit_generator.state = state
        infos: list[dict[str, Any]] = []
        for i, env_seed, opts in plan:
            infos.extend(self._reset_env(i, env_seed, opts))
            self._pending[i] = self._broken[i] = False
        self._has_reset = bool((self.seeds.episode >= 0).all())
        return self._gather(self._obs_rows, self._global_rows(ids)), infos

    def _take_undo(self, ids: np.ndarray) -> dict[int, tuple[int, Mapping[str, Any] | None]]:
        """The undo records of the envs of ``ids`` whose last step autoreset them."""
        return {
            i: self._undo.pop(i) for i in ids.tolist() if i in self._undo and self._env_reset[i]
        }

    def _require_idle(self, what: str) -> None:
        if self._in_flight.any():
            raise RuntimeError(
                f"{what} called with envs {np.flatnonzero(self._in_flight).tolist()} in flight; "
                "recv() them first"
            )

    # -------------------------------------------------------------------- snapshots

    def _env_snapshot(self, i: int) -> Any:
        inner = snapshot_env(self.envs[i], i)
        getter = getattr(inner, "get_state", None)
        if getter is None:
            raise TypeError(
                f"env {i} ({type(inner).__name__}) has no get_state(); "
                "vector snapshots need simkit envs"
            )
        return getter()

    def _restore_envs(self, ids: Sequence[int], states: Sequence[Any]) -> None:
        """``set_state`` of envs ``ids``, all or nothing; ``gymnasium.make``'s wrappers
        then count them as reset and checked, as the envs of the vector the snapshot came
        from were (a fresh vector's were never reset through them, and its order check
        refused the first step, its checker failed on it)."""
        restore_all([snapshot_env(self.envs[i], i) for i in ids], states)
        for i in ids:
            wrapper = self.envs[i]
            while isinstance(wrapper, gym.Wrapper):
                if isinstance(wrapper, OrderEnforcing):
                    wrapper._has_reset = True
                elif isinstance(wrapper, PassiveEnvChecker):
                    wrapper.checked_reset = wrapper.checked_step = True
                    wrapper.checked_data_reuse = True
                wrapper = wrapper.env

    def _rows_state(self) -> dict[str, Any]:
        """The face's fields of a whole snapshot."""
        return {}

    def _restore_rows(self, state: Mapping[str, Any]) -> Callable[[], None]:
        """Checks the face's fields of ``state``; returns what applies them."""
        return lambda: None

    def get_state(self) -> dict[str, Any]:
        """A snapshot of the whole vector: per-env snapshots, seeds and counters.

        Plain data: round-trips through :func:`simkit.snapshot.dumps`/``loads``;
        ``set_state`` on this or a fresh vector of the same env and size continues
        bit-identically.

        Raises:
            ResetNeeded: before the first reset.
            RuntimeError: envs are in flight.
            TypeError: an env has no ``get_state`` (not a simkit env).
        """
        if not self._has_reset:
            raise ResetNeeded("get_state() called before reset(); call reset() first")
        self._require_idle("get_state()")
        envs = [self._env_snapshot(i) for i in range(self.num_envs)]
        return {
            "format": VECTOR_STATE_FORMAT,
            "num_envs": self.num_envs,
            **self.seeds.get_state(),
            **self._rows_state(),
            "envs": envs,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a snapshot from :meth:`get_state`, all or nothing.

        Raises:
            InvalidState: malformed, or taken from a vector of another size.
        """
        fields = {"format", "num_envs", "root_seeds", "episode_index", "envs"}
        check_envelope(state, fields | self._state_fields, VECTOR_STATE_FORMAT)
        n, envs = self.num_envs, state["envs"]
        if not isinstance(envs, list | tuple):
            raise InvalidState(
                f"state['envs'] must be a list of {n} env states, got {type(envs).__name__}"
            )
        if not is_tag(state["num_envs"], n):
            raise InvalidState(f"state holds {state['num_envs']!r} envs, this vector has {n}")
        if len(envs) != n:
            raise InvalidState(f"state['envs'] holds {len(envs)} env states, this vector has {n}")
        self._require_idle("set_state()")
        seeds = EpisodeSeeds.parse_state(state, n)
        apply_rows = self._restore_rows(state)
        self._restore_envs(range(n), state["envs"])
        self._undo.clear()
        self._broken[:] = False  # every env holds a restored state: none is broken
        self.seeds.set_state(seeds)
        apply_rows()
        self._has_reset = True

    @abc.abstractmethod
    def _env_rows_state(self, i: int) -> dict[str, Any]:
        """The face's fields of env ``i``'s snapshot."""

    @abc.abstractmethod
    def _restore_env_rows(self, state: Mapping[str, Any]) -> Callable[[int], None]:
        """Checks the face's fields of a per-env snapshot; returns what applies them to an env."""

    def get_env_states(self, env_ids: Any) -> list[dict[str, Any]]:
        """Per-env snapshots: ``env``, ``root_seed``, ``episode_index`` and the rows.

        Raises:
            ValueError: ``env_ids`` are not distinct ids in ``[0, num_envs)``.
            ResetNeeded: an env was never reset.
            TypeError: an env is not a simkit env.
        """
        out = []
        for i in checked_env_ids(env_ids, self.num_envs).tolist():
            if self.seeds.episode[i] < 0:
                raise ResetNeeded(f"env {i}: get_state before reset; reset first")
            env = self._env_snapshot(i)
            out.append({"env": env, **self.seeds.env_state(i), **self._env_rows_state(i)})
        return out

    def set_env_states(self, env_ids: Any, states: Sequence[Mapping[str, Any]]) -> None:
        """Restores :meth:`get_env_states` snapshots, all or nothing.

        Raises:
            ValueError: ``env_ids`` are not distinct ids in ``[0, num_envs)``, or not one
                per state (nothing changes).
            InvalidState: a malformed snapshot, or one an env rejects (nothing changes).
        """
        ids = checked_env_ids(env_ids, self.num_envs).tolist()
        if len(states) != len(ids):
            raise ValueError(
                f"set_env_states needs one state per env id: {len(ids)} ids, "
                f"got {len(states)} states"
            )
        need = {"env", "root_seed", "episode_index"} | self._env_state_fields
        parsed = []
        for state in states:
            if not isinstance(state, Mapping) or need - set(state):
                got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
                raise InvalidState(f"a host snapshot holds {sorted(need)}, got {got}")
            apply_rows = self._restore_env_rows(state)
            parsed.append((EpisodeSeeds.parse_env_state(state), apply_rows))
        self._restore_envs(ids, [s["env"] for s in states])
        for i, (seeding, apply_rows) in zip(ids, parsed, strict=True):
            self.seeds.set_env_state(i, seeding)
            self._undo.pop(i, None)
            apply_rows(i)
            self._pending[i] = self._broken[i] = False
        self._has_reset = bool((self.seeds.episode >= 0).all())

    def _close_core(self) -> None:
        """Stops the worker threads and closes every env."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for env in getattr(self, "envs", []):
            env.close()
