"""Drives a :class:`simkit.BatchEnv` through a script and compares what it did, bit for bit.

A :class:`Script` is what the kit asks of a batch: whole-batch steps (one action row
per instance) and masked resets, drawn once from a seed, so the same script runs on two
fresh batches, on a used one, on a restored snapshot, on a batch of one seeded as
instance ``i``, or beside N single-instance envs. Running it gives a list of
:class:`Event` s (host arrays, one row per instance), and :func:`compare` names the first
difference: the event, the field, the instance and the element, with both values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit import registry, snapshot
from simkit._batch_rows import to_numpy
from simkit.errors import ConformanceError
from simkit.testing._driver import plain, sample

__all__ = [
    "BatchFactory",
    "BatchSetup",
    "Event",
    "Script",
    "as_batch_factory",
    "compare",
    "draw_script",
    "run_script",
    "instance_view",
]

BatchFactory = Callable[..., Any]
"""Builds a batch env: called with ``num_envs=N`` (and ``device=...`` where one is given)."""

FIELDS = ("obs", "final_obs", "reward", "terminated", "truncated", "params", "info")
"""The fields an event may hold, in the order they are compared."""


def as_batch_factory(env_fn: BatchFactory | str) -> BatchFactory:
    """Turns a registered id (or ``package.module:Class``) or a callable taking
    ``num_envs=`` (a ``BatchEnv`` class) into a batch factory."""
    if isinstance(env_fn, str):
        env_id = env_fn
        return lambda **kwargs: registry.make(env_id, **kwargs)
    if not callable(env_fn):
        raise TypeError(
            f"env_fn must be a batch env id or a callable taking num_envs=, got {env_fn!r}"
        )
    return env_fn


@dataclass(frozen=True)
class BatchSetup:
    """How the kit builds the batches of one check: the factory, N, the device, and the
    time limit it gives every batch (short, so that autoresets happen in the script)."""

    factory: BatchFactory
    num_envs: int
    device: Any
    limit: int

    @classmethod
    def of(cls, env_fn: BatchFactory | str, num_envs: int, device: Any, steps: int) -> BatchSetup:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
            raise ValueError(f"steps must be an int >= 2, got {steps!r}")
        return cls(as_batch_factory(env_fn), num_envs, device, max(2, steps // 4))

    def build(self, num_envs: int | None = None, *, device: Any = ..., offset: int = 0) -> Any:
        """A fresh batch of ``num_envs`` (default N) on ``device`` (default the setup's),
        seeded as instances ``offset..`` of a larger batch, its time limit the kit's."""
        kwargs: dict[str, Any] = {"num_envs": self.num_envs if num_envs is None else num_envs}
        device = self.device if device is ... else device
        if device is not None:
            kwargs["device"] = device
        env = self.factory(**kwargs)
        if not hasattr(env, "step_batch") or not hasattr(env, "seeds"):
            raise TypeError(
                f"the batch factory must build a simkit.BatchEnv, got {type(env).__name__}"
            )
        limit(env, self.limit)
        env.seeds.env_offset = offset
        return env


def limit(env: Any, steps: int) -> None:
    """Shortens ``env``'s time limit to ``steps`` (kept where it is shorter already)."""
    own = env.max_episode_steps
    if own is None or own > steps:
        env.max_episode_steps = steps


@dataclass(frozen=True)
class Script:
    """Steps and masked resets for N instances: ``("step", rows)`` with one action per
    instance, or ``("reset", mask)`` with an ``(N,)`` bool mask."""

    num_envs: int
    events: tuple[tuple[str, Any], ...]

    def __len__(self) -> int:
        return len(self.events)

    def head(self, k: int) -> Script:
        return Script(self.num_envs, self.events[:k])

    def tail(self, k: int) -> Script:
        return Script(self.num_envs, self.events[k:])

    def steps_only(self) -> Script:
        return Script(self.num_envs, tuple(e for e in self.events if e[0] == "step"))

    def project(self, i: int) -> Script:
        """What instance ``i`` sees, as a script for a batch of one."""
        out: list[tuple[str, Any]] = []
        for kind, payload in self.events:
            if kind == "step":
                out.append(("step", [payload[i]]))
            elif payload[i]:
                out.append(("reset", np.ones(1, dtype=np.bool_)))
            else:
                out.append(("skip", None))  # keeps the event numbers of the batch
        return Script(1, tuple(out))


def draw_script(
    space: spaces.Space[Any], num_envs: int, length: int, seed: int, *, resets: bool = True
) -> Script:
    """``length`` events drawn from ``seed``: steps with actions drawn from ``space`` (one
    row per instance), and, where ``resets``, a masked reset about one event in eight."""
    rng = np.random.default_rng(seed)
    events: list[tuple[str, Any]] = []
    for _ in range(length):
        if resets and rng.random() < 0.125:
            mask = rng.random(num_envs) < 0.5
            mask[rng.integers(num_envs)] = True
            events.append(("reset", mask))
        else:
            events.append(("step", [sample(space, rng) for _ in range(num_envs)]))
    return Script(num_envs, tuple(events))


def stack(rows: Sequence[Any]) -> Any:
    """A batch of actions from one action per instance: an array where the rows are
    arrays or numbers, else the list (Dict and Tuple spaces)."""
    if all(isinstance(r, np.ndarray | int | float | np.generic) for r in rows):
        return np.stack([np.asarray(r) for r in rows])
    return list(rows)


@dataclass
class Event:
    """What one reset or step did, on the host: ``fields[name][k]`` is the row of
    instance ``ids[k]``."""

    kind: str
    index: int
    ids: np.ndarray
    fields: dict[str, list[Any]] = field(default_factory=dict)


def host(x: Any) -> Any:
    """``x`` (numpy, torch, or a dict/tuple of them) as numpy arrays."""
    if isinstance(x, Mapping):
        return {k: host(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(host(v) for v in x)
    return to_numpy(x)


def rows_of(x: Any, n: int) -> list[Any]:
    """The ``n`` rows of a batched tree (arrays, dicts and tuples of arrays)."""
    if isinstance(x, Mapping):
        parts = {k: rows_of(v, n) for k, v in x.items()}
        return [{k: parts[k][j] for k in parts} for j in range(n)]
    if isinstance(x, tuple):
        cols = [rows_of(v, n) for v in x]
        return [tuple(c[j] for c in cols) for j in range(n)]
    arr = np.asarray(x)
    return [arr[j] for j in range(n)]


def _reset_event(env: Any, obs: Any, ids: np.ndarray, index: int) -> Event:
    rows = rows_of(host(obs), env.num_envs)
    params = env.params
    return Event(
        "reset",
        index,
        ids,
        {"obs": [rows[i] for i in ids.tolist()], "params": [params[i] for i in ids.tolist()]},
    )


def step_event(res: Any, index: int, *, infos: bool = True) -> Event:
    """The event of a :class:`simkit.BatchStep` (rows as its ``env_ids``)."""
    ids = np.asarray(res.env_ids, dtype=np.int64)
    n = len(ids)
    reward = to_numpy(res.reward)
    terminated, truncated = to_numpy(res.terminated), to_numpy(res.truncated)
    fields: dict[str, list[Any]] = {
        "obs": rows_of(host(res.obs), n),
        "final_obs": rows_of(host(res.final_obs), n),
        "reward": list(reward),
        "terminated": list(terminated),
        "truncated": list(truncated),
    }
    done = np.flatnonzero(terminated | truncated).tolist()
    params: list[Any] = [None] * n
    for k in done:
        params[k] = res.infos[k].get("reset_info", {}).get("params")
    fields["params"] = params
    if infos:
        fields["info"] = [plain(dict(res.infos[k])) for k in range(n)]
    return Event("step", index, ids, fields)


def run_script(
    env: Any,
    script: Script,
    seed: int | None,
    *,
    infos: bool = True,
    step: Callable[[Any, Any], Any] | None = None,
    before: Callable[[int], None] | None = None,
) -> list[Event]:
    """Runs ``script`` on ``env``: ``reset(seed=seed)`` first unless ``seed`` is None,
    then each event; ``step(env, actions)`` replaces ``env.step_batch(actions)`` and
    ``before(t)`` runs before event ``t`` (-1: the seeded reset)."""
    events: list[Event] = []
    all_ids = np.arange(env.num_envs, dtype=np.int64)
    if seed is not None:
        if before is not None:
            before(-1)
        obs, _ = env.reset(seed=seed)
        events.append(_reset_event(env, obs, all_ids, -1))
    for t, (kind, payload) in enumerate(script.events):
        if before is not None:
            before(t)
        if kind == "step":
            actions = stack(payload)
            res = env.step_batch(actions) if step is None else step(env, actions)
            events.append(step_event(res, t, infos=infos))
        elif kind == "reset":
            obs, _ = env.reset(options={"reset_mask": np.asarray(payload, dtype=np.bool_)})
            events.append(_reset_event(env, obs, np.flatnonzero(payload), t))
    return events


def instance_view(events: Sequence[Event], i: int, *, row: int | None = None) -> list[Event]:
    """Instance ``i``'s part of ``events``: the events it took part in, its row only
    (``row``: read that instance's rows as instance ``i``'s, for a batch of one)."""
    me = i if row is None else row
    out = []
    for ev in events:
        hits = np.flatnonzero(ev.ids == me)
        if len(hits):
            k = int(hits[0])
            fields = {name: [values[k]] for name, values in ev.fields.items()}
            out.append(Event(ev.kind, ev.index, np.array([i], dtype=np.int64), fields))
    return out


def _leaves(tree: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(tree, Mapping):
        return [x for k, v in tree.items() for x in _leaves(v, f"{path}[{k!r}]")]
    if isinstance(tree, tuple):
        return [x for j, v in enumerate(tree) for x in _leaves(v, f"{path}[{j}]")]
    return [(path, tree)]


def _ulps(a: Any, b: Any) -> str:
    """``", N ulp apart"`` for two finite floats of one dtype that differ."""
    x, y = np.asarray(a), np.asarray(b)
    if x.dtype != y.dtype or x.dtype.kind != "f" or not (np.isfinite(x) and np.isfinite(y)):
        return ""
    ints = {2: np.int16, 4: np.int32, 8: np.int64}[x.dtype.itemsize]
    ix, iy = int(x.view(ints)), int(y.view(ints))
    if (ix < 0) != (iy < 0):
        return ""
    return f", {abs(ix - iy)} ulp apart"


def _element(a: Any, b: Any) -> tuple[str, Any, Any] | None:
    """Where two values differ: ``(element, a's value, b's value)``, None if they are
    bit for bit the same."""
    for (path, x), (_, y) in zip(_leaves(a, ""), _leaves(b, ""), strict=False):
        x, y = _numeric(x), _numeric(y)
        if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype != y.dtype or x.shape != y.shape:
                return path, f"{x.dtype}{list(x.shape)}", f"{y.dtype}{list(y.shape)}"
            if x.tobytes() == y.tobytes():
                continue
            if x.ndim == 0:
                return path, x[()], y[()]
            flat = np.flatnonzero(
                (x.reshape(-1).view(np.uint8).reshape(x.size, -1) != _bytes(y)).any(axis=1)
            )[0]
            at = np.unravel_index(int(flat), x.shape)
            return f"{path}[{', '.join(str(int(j)) for j in at)}]", x[at], y[at]
        if not snapshot.states_equal(plain(x), plain(y)):
            return path, x, y
    if len(_leaves(a, "")) != len(_leaves(b, "")):
        return "", a, b
    return None


def _numeric(x: Any) -> Any:
    """Numbers as 0-d arrays (a Python float and a float64 compare by their bits)."""
    if isinstance(x, bool | int | float | np.generic):
        return np.asarray(x)
    return x


def _bytes(y: np.ndarray) -> np.ndarray:
    return y.reshape(-1).view(np.uint8).reshape(y.size, -1)


def _show(value: Any) -> str:
    if isinstance(value, np.generic):
        return repr(value.item())
    return repr(value)


def compare(
    a: Sequence[Event],
    b: Sequence[Event],
    what: str,
    cause: str,
    *,
    names: tuple[str, str] = ("first", "second"),
    fields: Sequence[str] = FIELDS,
) -> None:
    """Raises ConformanceError at the first difference between two runs of events.

    The message names ``what``, the event (``step #t``, ``reset #t``, ``reset`` for
    the seeded one), the field, the instance and the element, both values (as
    ``names`` say) and ``cause``.
    """
    for ev_a, ev_b in zip(a, b, strict=False):
        where = "the seeded reset" if ev_a.index < 0 else f"{ev_a.kind} #{ev_a.index}"
        same = ev_a.kind == ev_b.kind and ev_a.index == ev_b.index
        if not same or ev_a.ids.tolist() != ev_b.ids.tolist():
            raise ConformanceError(
                f"{what}: the runs parted at {where} ({names[0]}: {ev_a.kind} of instances "
                f"{ev_a.ids.tolist()}, {names[1]}: {ev_b.kind} #{ev_b.index} of instances "
                f"{ev_b.ids.tolist()}); {cause}"
            )
        for name in fields:
            if name not in ev_a.fields or name not in ev_b.fields:
                continue
            for k, (x, y) in enumerate(zip(ev_a.fields[name], ev_b.fields[name], strict=True)):
                found = _element(x, y)
                if found is None:
                    continue
                element, vx, vy = found
                raise ConformanceError(
                    f"{what}: {name}{element} of instance {int(ev_a.ids[k])} differs at "
                    f"{where} ({names[0]} {_show(vx)} vs {names[1]} {_show(vy)}"
                    f"{_ulps(vx, vy)}); {cause}"
                )
    if len(a) != len(b):
        raise ConformanceError(f"{what}: the runs have {len(a)} and {len(b)} events; {cause}")
