"""The per-instance contract of a :class:`simkit.BatchEnv`: seeds, params, counters, snapshots.

Instance ``i`` of a batch behaves bit for bit like a single-instance env reset with
``episode_seed(root, i, k)`` for its ``k``-th episode: that generator's stream as a keyed
stream (keys from :class:`simkit._seeding.EpisodeSeeds`, held in a
:class:`simkit._seeding.StreamTable`), declared randomization sampled from it for all
instances at once, a step counter and time limit, and snapshots restored all or
nothing. The validators are :class:`simkit._contract.ContractCore`'s.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from simkit._batch_queue import LazyRows, RowInfos
from simkit._contract import action_bounds_of, declared_state_attributes
from simkit._seeding import EpisodeSeeds, KeyedStreams, StreamTable
from simkit._state import check_state_attributes
from simkit._validation import ActionBounds
from simkit.errors import InvalidState, ResetNeeded
from simkit.randomization import (
    Distribution,
    LogUniform,
    Params,
    Uniform,
    resolve_overrides,
    sample_params,
)

__all__ = ["BATCH_STATE_FORMAT", "BatchContract"]

BATCH_STATE_FORMAT = 1
"""Version of the snapshot layout produced by :meth:`BatchEnv.get_state`."""


class BatchContract:
    """Seeding, randomization, step counting and snapshots of N instances (a mixin of
    :class:`simkit.BatchEnv`, which initialises the attributes below)."""

    randomization: ClassVar[Mapping[str, Distribution]] = {}
    max_episode_steps: int | None = None
    state_attributes: ClassVar[tuple[str, ...] | None] = None
    metadata: dict[str, Any]
    num_envs: int
    xp: Any
    device: Any
    param_arrays: dict[str, np.ndarray]
    _param_block: tuple[tuple[str, ...], np.ndarray] | None
    _seeds: EpisodeSeeds
    _streams: StreamTable
    _params: dict[int, Params]
    _samplers: list[Sampler]
    _env_overrides: list[Mapping[str, Any]]
    _elapsed: np.ndarray
    _pending_reset: np.ndarray
    _has_reset: bool
    _reset_draws_known: bool
    _obs: Any

    if TYPE_CHECKING:

        def _require_idle(self, what: str) -> None: ...

        def _host_sync(self) -> None: ...

        def _prepare_instances(self, ids: np.ndarray) -> None: ...

    # ------------------------------------------------------------------- properties

    @property
    def params(self) -> list[Params]:
        """Each instance's randomized parameters of its current episode (a copy)."""
        self._host_sync()
        return [self._param_row(i) for i in range(self.num_envs)]

    def _param_row(self, i: int) -> Params:
        """Instance ``i``'s parameters, a new dict: stored for one drawn the slow way,
        else rebuilt from :attr:`param_arrays` and its sampler's fixed values."""
        stored = self._params.get(i)
        if stored is not None:
            return _copy_params(stored)
        sampler = self._samplers[i]
        return sampler.row([float(self.param_arrays[name][i]) for name in sampler.names])

    def _sampler_groups(self) -> tuple[list[Sampler], np.ndarray]:
        """The distinct samplers of the instances and each instance's index among them."""
        cached = getattr(self, "_sampler_cache", None)
        if cached is None:
            unique: dict[int, int] = {}
            index = np.array(
                [unique.setdefault(id(smp), len(unique)) for smp in self._samplers],
                dtype=np.int64,
            )
            by_id = {id(smp): smp for smp in self._samplers}
            cached = ([by_id[key] for key in unique], index)
            self._sampler_cache = cached
        return cached

    @property
    def elapsed_steps(self) -> np.ndarray:
        """Steps taken in each instance's current episode (a copy)."""
        self._host_sync()
        return self._elapsed.copy()

    @property
    def episode_index(self) -> np.ndarray:
        """Each instance's episode number under the current root seed (a copy)."""
        self._host_sync()
        return self._seeds.episode.copy()

    @property
    def root_seed(self) -> int | None:
        """The root seed of the batch; instance seeds derive from it."""
        return self._seeds.roots[0]

    @property
    def action_bounds(self) -> ActionBounds:
        """The declared out-of-bounds policy for continuous actions."""
        return action_bounds_of(self.metadata)

    # ------------------------------------------------------------- the author's hook

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

    def _reset_ids(
        self,
        ids: np.ndarray,
        per_reset: list[Mapping[str, Any]] | None,
        options: dict[str, Any],
    ) -> tuple[Any, RowInfos]:
        """Starts the next episode of ``ids``: keyed streams, parameters, the author's
        hook; returns the first observations and the rows' reset infos (lazy)."""
        scale = self._reset_scale(per_reset)
        states, ahead, scaled = self._seeds.next_states(ids, self._streams.prefetch, scale)
        self._streams.start(ids, states)
        rngs = self._streams.rows(ids, ahead, scaled)
        params = self._sample(ids, rngs, per_reset)
        self._elapsed[ids] = 0
        self._prepare_instances(ids)
        obs_rows, infos = self.reset_instances(ids, rngs, params, options)
        self._streams.prefetch = rngs.taken
        self._reset_draws_known = True
        if infos is not None and len(infos) != len(ids):
            raise ValueError(
                f"{type(self).__name__}.reset_instances must return {len(ids)} info dicts "
                f"or None, got {len(infos)}"
            )
        return obs_rows, RowInfos(len(ids), infos, lambda k: {"params": params[k]})

    def _reset_scale(self, per_reset: list[Mapping[str, Any]] | None) -> Sampler | None:
        """The sampler whose parameters the keyed rows of a reset carry already scaled
        (:meth:`EpisodeSeeds.next_states`): the one sampler of every instance, on its
        fast path, unless the reset overrides parameters."""
        samplers = self._sampler_groups()[0]
        one = samplers[0] if per_reset is None and len(samplers) == 1 else None
        return one if one is not None and one.fast and one.names else None

    def _prepare_next_episodes(self) -> None:
        """Has every instance hold the keys (and first draws) of its next episodes, as
        the autoresets of the coming steps read them, after a reset of the batch: those
        steps then cost what later ones do (:meth:`EpisodeSeeds.prepare`)."""
        self._seeds.prepare(self._streams.prefetch, self._reset_scale(None))

    def _sample(
        self,
        ids: np.ndarray,
        rngs: KeyedStreams,
        per_reset: list[Mapping[str, Any]] | None,
    ) -> ParamRows:
        """Each instance's parameters for its new episode, drawn from its stream: for
        all instances of one sampler at once on the fast path (scalar ``Uniform`` /
        ``LogUniform``), else one instance at a time from its generator."""
        rows = ParamRows(len(ids))
        samplers, index = self._sampler_groups()
        explicit: list[int] = []
        if per_reset is not None:
            mine = np.array([bool(per_reset[i]) for i in ids.tolist()], dtype=np.bool_)
            explicit = np.flatnonzero(mine).tolist()
            shared = np.flatnonzero(~mine)
        else:
            shared = None
        if len(samplers) == 1:
            groups, which = [0], None
        else:
            which = index[ids] if shared is None else index[ids[shared]]
            groups = np.unique(which).tolist()
        for g in groups:
            if len(groups) == 1:
                ks = shared  # every shared row (all rows if None)
            else:
                assert which is not None
                sel = which == g
                ks = shared[sel] if shared is not None else np.flatnonzero(sel)
            sampler = samplers[g]
            sub = rngs if ks is None else KeyedStreams(self._streams, ids[ks])
            if sampler.fast:
                values = sampler.values(sub)
                rows.add(ks, sampler, values)
                stored = self._params
                if stored:  # instances drawn the slow way (or restored) before
                    if len(sub.ids) == self.num_envs:
                        stored.clear()
                    else:
                        for i in sub.ids.tolist():
                            stored.pop(i, None)
                self._update_param_arrays(sub.ids, values, sampler)
            else:
                explicit.extend(range(len(ids)) if ks is None else ks.tolist())
        if explicit:
            explicit.sort()
            for k in explicit:
                i = int(ids[k])
                resolved: Mapping[str, Any]
                if per_reset is not None and per_reset[i]:
                    overrides = {**self._env_overrides[i], **per_reset[i]}
                    resolved = resolve_overrides(self.randomization, overrides)
                else:
                    resolved = self._samplers[i]._resolved
                p = sample_params(resolved, rngs[k])
                rows.set(k, p)
                self._params[i] = p
            self._update_param_arrays(ids[explicit])
        return rows

    def _update_param_arrays(
        self, ids: np.ndarray, values: np.ndarray | None = None, sampler: Sampler | None = None
    ) -> None:
        """Writes the new parameters of ``ids`` into :attr:`param_arrays`; ``values`` are
        those of ``sampler``'s sampled names (:attr:`Sampler.names`), one row per id."""
        if not len(ids):
            return
        columns: dict[str, Any] = {}
        if values is not None and sampler is not None:
            names = sampler.names
            block = self._param_block
            if block is None and not self.param_arrays and names == tuple(self.randomization):
                # every declared parameter is a sampled scalar: one (N, m) array whose
                # columns are the param_arrays, written with one assignment per reset
                block = self._param_block = (
                    names,
                    np.zeros((self.num_envs, len(names)), order="F"),
                )
                self.param_arrays.update({name: block[1][:, j] for j, name in enumerate(names)})
            if block is not None and block[0] == names:
                block[1][ids] = values
                return
            columns = {name: values[:, j] for j, name in enumerate(names)}
            first = sampler.row(values[0].tolist())
        else:
            first = self._param_row(int(ids[0]))
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
                column if column is not None else [self._param_row(i)[name] for i in ids.tolist()]
            )

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

    # -------------------------------------------------------------------- snapshots

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
            setattr(self, name, self._restore_like(getattr(self, name, None), state[name]))

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
        self._host_sync()
        return {
            "format": BATCH_STATE_FORMAT,
            "env": f"{type(self).__module__}:{type(self).__qualname__}",
            "num_envs": self.num_envs,
            "root_seed": self._seeds.roots[0],
            "env_offset": self._seeds.env_offset,
            "episode_index": self._seeds.episode.copy(),
            "rngs": self._streams.to_plain(),
            "params": self.params,
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
        self._host_sync()
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
        params = {
            i: copy.deepcopy(dict(p)) for i, p in enumerate(_per_env_list(state, "params", n))
        }
        streams = StreamTable.parse_plain(state["rngs"], n)
        core = {
            "_params": params,
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
                "env_offset": state.get("env_offset", 0),
            },
            n,
        )
        obs = self._restore_like(self._obs, state["obs"])
        saved = {name: getattr(self, name, None) for name in core}
        saved_streams = (self._streams.states, self._streams.pos, self._streams.live)
        saved_values = {name: arr.copy() for name, arr in self.param_arrays.items()}
        saved_seeds = EpisodeSeeds.parse_state(self._seeds.get_state(), n)
        saved_obs, saved_data = self._obs, self.get_env_state()
        try:
            for name, value in core.items():
                setattr(self, name, value)
            self._seeds.set_state(seeds)
            self._streams.restore(streams)
            self._obs = obs
            self._update_param_arrays(np.arange(n, dtype=np.int64))
            self.set_env_state(state["data"])
        except Exception:
            for name, value in saved.items():
                setattr(self, name, value)
            self._seeds.set_state(saved_seeds)
            table = self._streams
            table.states, table.pos, table.live = saved_streams
            self._obs = saved_obs
            for name, arr in saved_values.items():
                self.param_arrays[name][...] = arr
            self.set_env_state(saved_data)
            raise

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


def _copy_params(params: Params) -> Params:
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in params.items()}


class Sampler:
    """Samples one resolved declaration, equal to ``sample_params(resolved, rng)`` draw
    for draw, bit for bit, for many generators at once (:meth:`rows`).

    When every randomized parameter is a scalar ``Uniform``/``LogUniform``, an
    instance's draws come from one ``rng.random(k)`` call: ``Generator.uniform(lo, hi)``
    is ``lo + (hi - lo) * next_double`` on the same stream, so the values (and the
    clipping into the bounds that :meth:`Distribution.sample` applies) are the same
    doubles, and :meth:`rows` computes them for all instances with array arithmetic.
    Anything else falls back to :func:`sample_params`.
    """

    def __init__(self, resolved: Mapping[str, Distribution | Any]) -> None:
        self._resolved = resolved
        self._order = list(resolved)
        self._fixed: dict[str, Any] = {}
        self.fast = True
        plan: list[tuple[str, float, float, float, float, bool]] = []
        for name, spec in resolved.items():
            if type(spec) is Uniform and spec.shape == ():
                lo, hi = float(spec.low), float(spec.high)  # type: ignore[arg-type]
                plan.append((name, lo, hi - lo, lo, hi, False))
            elif type(spec) is LogUniform and spec.shape == ():
                lo64, hi64 = np.float64(spec.low), np.float64(spec.high)  # type: ignore[arg-type]
                log_lo, log_hi = float(np.log(lo64)), float(np.log(hi64))
                plan.append((name, log_lo, log_hi - log_lo, float(lo64), float(hi64), True))
            elif isinstance(spec, Distribution | np.ndarray):
                self.fast = False
            else:
                self._fixed[name] = spec
        names = [p[0] for p in plan]
        self.names: tuple[str, ...] = tuple(names)
        """The sampled parameters, in declaration order (fast path only)."""
        self._start, self._width, self._low, self._high = (
            np.array([p[k] for p in plan], dtype=np.float64) for k in range(1, 5)
        )
        self._log = [j for j, p in enumerate(plan) if p[5]]
        self._plain = not self._fixed and list(names) == self._order

    def values(self, streams: KeyedStreams) -> np.ndarray:
        """Fast path only: the ``(len(streams), len(names))`` float64 values of every
        row, drawn from the keyed streams at once (what :meth:`rows` gives the same
        rows' generators)."""
        prescaled = streams.prescaled(self, len(self.names))
        if prescaled is not None:
            return prescaled
        return self._scale(streams.random(len(self.names)))

    def prescale(self, doubles: np.ndarray) -> None:
        """Turns the first ``len(names)`` columns of ``doubles`` (uniform draws) into
        parameter values in place, as :meth:`values` would (for
        :meth:`simkit._seeding.EpisodeSeeds.next_states`)."""
        m = len(self.names)
        doubles[:, :m] = self._scale(np.ascontiguousarray(doubles[:, :m]))

    def _scale(self, values: np.ndarray) -> np.ndarray:
        if not len(self.names):
            return values
        values = self._start + self._width * values
        for c in self._log:
            values[:, c] = np.exp(np.ascontiguousarray(values[:, c]))
        np.minimum(np.maximum(values, self._low), self._high, out=values)
        return values

    def row(self, values: Sequence[float]) -> Params:
        """The parameters of one row of :meth:`values`, in the declared order."""
        drawn = dict(zip(self.names, values, strict=True))
        if self._plain:
            return drawn
        merged = {**_copy_params(self._fixed), **drawn}
        return {name: merged[name] for name in self._order}

    def rows(self, rngs: Sequence[np.random.Generator]) -> tuple[list[Params], np.ndarray | None]:
        """Each generator's parameters, and on the fast path their ``(len(rngs),
        len(names))`` float64 values (``None`` otherwise)."""
        if not self.fast:
            return [sample_params(self._resolved, rng) for rng in rngs], None
        count = len(self.names)
        values = np.empty((len(rngs), count))
        if count:
            for j, rng in enumerate(rngs):
                rng.random(out=values[j])
            values = self._scale(values)
        names = self.names
        if self._plain:
            return [dict(zip(names, row, strict=True)) for row in values.tolist()], values
        out = []
        for row in values.tolist():
            drawn = {**self._fixed, **dict(zip(names, row, strict=True))}
            out.append({name: drawn[name] for name in self._order})
        return out, values


class ParamRows(LazyRows[Params]):
    """The parameters of the rows of one reset (what ``reset_instances`` receives as
    ``params``), each dict built when read: from a sampler and its row of drawn values,
    or stored as drawn the slow way."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._explicit: dict[int, Params] = {}
        self._groups: list[tuple[Sampler, np.ndarray]] = []
        self._which: np.ndarray | None = None
        self._at: np.ndarray | None = None

    def add(self, ks: np.ndarray | None, sampler: Sampler, values: np.ndarray) -> None:
        """Rows ``ks`` (all if ``None``) hold ``sampler``'s rows of ``values``, in order."""
        self._groups.append((sampler, values))
        if ks is None:
            return  # the only group: row k is values[k]
        if self._which is None or self._at is None:
            self._which = np.full(self._n, -1, dtype=np.int64)
            self._at = np.zeros(self._n, dtype=np.int64)
        self._which[ks] = len(self._groups) - 1
        self._at[ks] = np.arange(len(ks), dtype=np.int64)

    def set(self, k: int, params: Params) -> None:
        """Row ``k`` holds ``params`` (drawn the slow way)."""
        self._explicit[k] = params

    def _row(self, k: int) -> Params:
        stored = self._explicit.get(k)
        if stored is not None:
            return _copy_params(stored)
        if self._which is None or self._at is None:
            sampler, values = self._groups[0]
            return sampler.row(values[k].tolist())
        sampler, values = self._groups[int(self._which[k])]
        return sampler.row(values[int(self._at[k])].tolist())
