"""The conformance checks. Each raises ConformanceError naming the likely cause."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from simkit import snapshot
from simkit._state import check_observation
from simkit.errors import ConformanceError, InvalidParameter, InvalidState
from simkit.randomization import (
    Choice,
    Distribution,
    Normal,
    Uniform,
    _Interval,
    resolve_overrides,
)
from simkit.testing._driver import (
    CheckNotApplicable,
    Driver,
    EnvFactory,
    Step,
    as_factory,
    plain,
)

__all__ = [
    "check_spaces",
    "check_determinism",
    "check_reset_reuse",
    "check_snapshot",
    "check_randomization",
    "check_no_global_rng",
    "check_other_process",
    "CHECKS",
    "Check",
    "check_env",
]

Check = Callable[..., None]


def _diff(a: Step, b: Step) -> str | None:
    for name in ("kind", "obs", "reward", "terminated", "truncated", "info"):
        if not snapshot.states_equal(plain(getattr(a, name)), plain(getattr(b, name))):
            return name
    return None


def _compare(a: list[Step], b: list[Step], what: str, cause: str) -> None:
    if len(a) != len(b):
        raise ConformanceError(
            f"{what}: trajectories have different lengths {len(a)} vs {len(b)}; {cause}"
        )
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        field = _diff(x, y)
        if field is not None:
            raise ConformanceError(
                f"{what}: {field} differs at {x.kind} #{i} ({getattr(x, field)!r} vs "
                f"{getattr(y, field)!r}); {cause}"
            )


def check_spaces(env_fn: EnvFactory | str, *, seed: int = 0, steps: int = 100) -> None:
    """Observations lie in their space, rewards are finite floats, flags are bools."""
    env = as_factory(env_fn)()
    driver = Driver(env, seed)
    for i, step in enumerate(driver.run(steps, seed=seed)):
        if driver.multi:
            for agent, obs in step.obs.items():
                where = f"observation of {agent!r} at {step.kind} #{i}"
                _check_observation(env.observation_space(agent), obs, where)
                if not env.observation_space(agent).contains(obs):
                    raise ConformanceError(
                        f"spaces: observation of {agent!r} at {step.kind} #{i} is outside "
                        f"observation_space({agent!r}); check its dtype, shape and bounds"
                    )
            values = list((step.reward or {}).values())
            flags = list((step.terminated or {}).values()) + list((step.truncated or {}).values())
        else:
            _check_observation(env.observation_space, step.obs, f"observation at {step.kind} #{i}")
            if not env.observation_space.contains(step.obs):
                raise ConformanceError(
                    f"spaces: observation at {step.kind} #{i} is outside observation_space "
                    f"({step.obs!r}); check its dtype, shape and bounds"
                )
            values = [] if step.reward is None else [step.reward]
            flags = [] if step.kind == "reset" else [step.terminated, step.truncated]
        for value in values:
            if not isinstance(value, float) or not np.isfinite(value):
                raise ConformanceError(
                    f"spaces: reward at step #{i} must be a finite float, got {value!r}"
                )
        for flag in flags:
            if not isinstance(flag, bool):
                raise ConformanceError(f"spaces: terminated/truncated must be bool, got {flag!r}")
        infos = step.info.values() if driver.multi else [step.info]
        if not all(isinstance(info, dict) for info in infos):
            raise ConformanceError(f"spaces: info at {step.kind} #{i} must be a dict")
        for info in infos:
            check_plain_info(info, f"{step.kind} #{i}")
    env.close()


def check_plain_info(info: Any, where: str) -> None:
    """Raises ConformanceError unless ``info`` is plain data by the rule a recorder
    stores infos with (:func:`simkit.snapshot.to_plain`)."""
    try:
        snapshot.to_plain(info, "info")
    except InvalidState as exc:
        raise ConformanceError(
            f"spaces: info at {where} is not plain data ({exc}); a recorder and a server's "
            "clients take infos of str keys and dicts, lists, numbers, str, bytes and "
            "numeric arrays"
        ) from None


def _check_observation(space: Any, obs: Any, what: str, rows: int | None = None) -> None:
    """Raises ConformanceError unless ``obs`` is exactly of ``space`` by the rule a
    snapshot's observation is checked on restore (``simkit._state.check_observation``):
    the space's dtype and shape, not merely castable to it as ``Space.contains`` allows."""
    try:
        check_observation(space, obs, what, rows)
    except InvalidState as exc:
        raise ConformanceError(
            f"spaces: {exc}; return observations of exactly the space's dtype and shape "
            "(Space.contains accepts a castable dtype, but a VectorEnv or BatchEnv refuses "
            "to restore its own snapshot holding such an observation)"
        ) from None


def check_determinism(env_fn: EnvFactory | str, *, seed: int = 0, steps: int = 100) -> None:
    """Two fresh instances, same seed and actions: bit-identical, across episode ends."""
    factory = as_factory(env_fn)
    a = Driver(factory(), seed).run(steps, seed=seed)
    b = Driver(factory(), seed).run(steps, seed=seed)
    _compare(
        a,
        b,
        f"determinism (two fresh instances, seed {seed})",
        "the env probably draws randomness outside the generator it is handed "
        "(global np.random/random, an unseeded Generator) or keeps state across instances",
    )


def check_reset_reuse(env_fn: EnvFactory | str, *, seed: int = 0, steps: int = 100) -> None:
    """reset(seed) after arbitrary history equals a fresh reset(seed) and its continuation."""
    factory = as_factory(env_fn)
    used = Driver(factory(), seed + 1)
    used.run(steps, seed=seed + 12345)
    used._rng = np.random.default_rng(seed)
    _compare(
        used.run(steps, seed=seed),
        Driver(factory(), seed).run(steps, seed=seed),
        f"reset reuse (reset(seed={seed}) after history vs fresh instance)",
        "reset_episode probably leaves some state from the previous episode "
        "(a counter, a position, a cached value) instead of setting it anew",
    )


def check_snapshot(env_fn: EnvFactory | str, *, seed: int = 0, steps: int = 100) -> None:
    """get_state mid-episode; set_state on the same and a fresh instance continue bit-identically.

    Raises:
        CheckNotApplicable: the env has no ``get_state`` (a Gymnasium env: ``gym:<id>``).
    """
    factory = as_factory(env_fn)
    env = factory()
    if not callable(getattr(getattr(env, "unwrapped", env), "get_state", None)):
        env.close()
        raise CheckNotApplicable(
            f"{type(getattr(env, 'unwrapped', env)).__name__} has no get_state(): snapshots "
            "are a simkit env's (a gym: env has none)"
        )
    driver = Driver(env, seed)
    warm_up = driver.run(max(1, steps // 3), seed=seed)
    if warm_up[-1].ended or (driver.multi and not env.agents):
        driver.reset()  # the snapshot is taken mid-episode, never after an episode's end
    state, frozen = freeze(env)
    action_seed = seed + 7
    driver._rng = np.random.default_rng(action_seed)
    original = driver.continue_for(steps)
    check_unchanged(state, frozen, LIVE_STATE)
    cause = (
        "the snapshot is incomplete: some state the env uses is not in get_env_state() "
        "(or state_attributes), or set_env_state() does not restore it"
    )
    given = snapshot.loads(frozen)
    env.set_state(given)
    again = Driver(env, action_seed).continue_for(steps)
    _compare(original, again, "snapshot (set_state on the same instance)", cause)
    check_unchanged(given, frozen, KEPT_STATE)
    fresh = factory()
    fresh.set_state(snapshot.loads(frozen))
    _compare(
        original,
        Driver(fresh, action_seed).continue_for(steps),
        "snapshot (set_state on a fresh instance)",
        cause,
    )


LIVE_STATE = (
    "stepping changed a snapshot taken earlier; get_state() must return copies, not live "
    "arrays of the env"
)
KEPT_STATE = (
    "stepping changed a snapshot given to set_state(); set_env_state() must copy what it "
    "keeps (np.array(state['x']), not state['x']) and not write into the snapshot, or a "
    "snapshot restored twice gives two states"
)


def freeze(env: Any) -> tuple[Any, bytes]:
    """``env.get_state()`` and its :func:`simkit.snapshot.dumps` form, after checking
    that the state round-trips through ``dumps``/``loads`` with every type kept."""
    state = env.get_state()
    frozen = snapshot.dumps(state)
    _check_round_trip(state, snapshot.loads(frozen))
    return state, frozen


def check_unchanged(state: Any, frozen: bytes, why: str) -> None:
    """Raises ConformanceError (``why``) if ``state``, a snapshot whose
    :func:`simkit.snapshot.dumps` form is ``frozen``, changed since: the env holds arrays
    of it that later steps rewrote (:data:`LIVE_STATE`, :data:`KEPT_STATE`)."""
    if snapshot.dumps(state) != frozen:
        raise ConformanceError(f"snapshot: {why}")


def _check_round_trip(state: Any, restored: Any) -> None:
    """Raises ConformanceError naming the first value of ``state`` (``get_state()``)
    that ``restored`` (``simkit.snapshot.loads(dumps(state))``) does not equal, both
    values and what to store instead."""
    diff = snapshot.first_difference(state, restored)
    if diff is None:
        return
    where = f"snapshot: get_state(){diff.path}"
    if type(diff.a) is not type(diff.b) and not isinstance(diff.a, np.ndarray | Mapping):
        was, now = snapshot.describe(diff.a), snapshot.describe(diff.b)
        if isinstance(diff.a, np.generic):
            fix = (
                "store plain Python numbers (int(...), float(...), bool(...)) or numpy "
                "arrays, not numpy scalars (rng.integers(...), x[0] and np.sum(...) return them)"
            )
        else:
            fix = _PLAIN_STATE
        raise ConformanceError(
            f"{where}: {was} {_shown(diff.a)} becomes {now} {_shown(diff.b)} through simkit.snapshot "
            f"(dumps/loads), so a restored env would hold another type; {fix}"
        )
    raise ConformanceError(
        f"{where} does not round-trip through simkit.snapshot (dumps/loads): {diff.reason}; "
        f"{_PLAIN_STATE}"
    )


def _shown(value: Any) -> str:
    return repr(value.item() if isinstance(value, np.generic) else value)


_PLAIN_STATE = (
    "keep the state plain data: numpy arrays, Python int/float/bool, str, bytes, None, "
    "lists and dicts with str keys"
)


def _narrowed(dist: Distribution, rng: np.random.Generator) -> tuple[Any, Distribution]:
    fixed = dist.sample(rng)
    if isinstance(dist, Choice):
        return fixed, Choice(dist.options[:1])
    if isinstance(dist, _Interval | Normal):
        lo, hi = (dist._interval() if isinstance(dist, Normal) else dist)._bounds()
        mid = (lo + hi) / 2
        if dist.shape:
            return fixed, Uniform(tuple(mid.tolist()), tuple(hi.tolist()))
        return fixed, Uniform(float(mid), float(hi))
    return fixed, dist


def check_randomization(
    env_fn: EnvFactory | str, *, seed: int = 0, steps: int = 100, seeds: int = 20
) -> None:
    """Same seed ⇒ same params; params stay in domain and vary; overrides are honoured.

    ``steps`` is accepted for a uniform signature; the check resets ``seeds`` times.
    """
    del steps
    factory = as_factory(env_fn)
    env = factory()
    declared: Mapping[str, Distribution] = getattr(env, "randomization", {})
    if not declared:
        return

    def params_of(e: Any, s: int, options: dict[str, Any] | None = None) -> dict[str, Any]:
        e.reset(seed=s, options=options)
        return dict(e.params)

    first = params_of(env, seed)
    if not snapshot.states_equal(first, params_of(factory(), seed)):
        raise ConformanceError(
            f"randomization: two fresh instances reset with seed {seed} sampled different "
            "parameters; randomization probably ignores the seed (draws from its own or a global RNG)"
        )
    # What each parameter is drawn from in this instance (its per-env overrides applied),
    # and how many draws make "all alike" a one-in-a-billion event for it.
    fixed = getattr(getattr(env, "unwrapped", env), "_env_overrides", None)
    drawn = resolve_overrides(declared, fixed or None)
    draws = {name: _draws_to_vary(d, seeds) for name, d in drawn.items()}
    samples = [params_of(env, seed + k) for k in range(max(draws.values(), default=seeds))]
    for name, dist in declared.items():
        values = [s[name] for s in samples]
        bad = [v for v in values if not dist.contains(v)]
        if bad:
            raise ConformanceError(
                f"randomization: {name!r} left its declared domain {dist.describe()}: {bad[0]!r}"
            )
        some = values[: draws[name]]
        if some and all(snapshot.states_equal(plain(v), plain(some[0])) for v in some):
            raise ConformanceError(
                f"randomization: {name!r} took the same value {some[0]!r} for {len(some)} "
                "different seeds; randomization probably ignores the seed"
            )
    rng = np.random.default_rng(seed)
    for name, dist in declared.items():
        fixed, narrow = _narrowed(dist, rng)
        got = params_of(env, seed, {"params": {name: fixed}})[name]
        if not snapshot.states_equal(plain(np.asarray(got)), plain(np.asarray(fixed))):
            raise ConformanceError(
                f"randomization: override {name}={fixed!r} was not honoured (got {got!r})"
            )
        for k in range(5):
            got = params_of(env, seed + k, {"params": {name: narrow}})[name]
            if not narrow.contains(got):
                raise ConformanceError(
                    f"randomization: narrowed override {narrow!r} for {name!r} not honoured (got {got!r})"
                )
    try:
        env.reset(seed=seed, options={"params": {"__simkit_kit_unknown__": 1.0}})
    except InvalidParameter:
        pass
    else:
        raise ConformanceError("randomization: an unknown parameter name was accepted silently")
    env.close()


_MAX_DRAWS = 2000
"""The most resets check_randomization spends on seeing one parameter vary."""


def _draws_to_vary(dist: Any, seeds: int) -> int:
    """Resets after which a parameter drawn from ``dist`` that never varied means the
    seed is ignored: ``seeds`` for continuous ones, enough that a correct Choice draws
    one option every time with probability below 1e-9; 0 where it cannot vary (a value
    fixed per env, zero-weight options, an empty range) or would need more than
    :data:`_MAX_DRAWS`."""
    if isinstance(dist, Choice):
        weights = dist.weights or (1.0,) * len(dist.options)
        p = [w / sum(weights) for w in weights if w > 0]
        if len(p) < 2:
            return 0
        need = max(seeds, 1 + math.ceil(math.log(1e-9) / math.log(max(p))))
        return need if need <= _MAX_DRAWS else 0
    if isinstance(dist, Normal):
        lo, hi = dist._interval()._bounds()
        return seeds if np.any(np.asarray(dist.std) > 0) and np.any(hi > lo) else 0
    if isinstance(dist, _Interval):
        lo, hi = dist._bounds()
        return seeds if np.any(hi > lo) else 0
    return seeds if isinstance(dist, Distribution) else 0


def check_no_global_rng(env_fn: EnvFactory | str, *, seed: int = 0, steps: int = 100) -> None:
    """Perturbing global ``random``, ``np.random`` and torch RNGs changes nothing."""
    factory = as_factory(env_fn)

    def run(global_seed: int) -> list[Step]:
        _seed_globals(global_seed)
        env = factory()
        driver = Driver(env, seed)
        trace = [driver.reset(seed)]
        for _ in range(steps):
            _seed_globals(global_seed + len(trace))
            trace.append(driver.reset() if trace[-1].ended else driver.step(driver.action()))
        env.close()
        return trace

    # The kit perturbs the legacy global state on purpose, and puts it back after.
    state = (random.getstate(), np.random.get_state())  # noqa: NPY002
    try:
        _compare(
            run(1),
            run(2),
            "global RNG (global random/np.random/torch seeded differently)",
            "the env draws from a global RNG (random, np.random or torch) instead of the "
            "generator passed to its hooks",
        )
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])  # noqa: NPY002


def _seed_globals(value: int) -> None:
    random.seed(value)
    np.random.seed(value % 2**32)  # noqa: NPY002
    try:
        import torch
    except ImportError:  # torch is optional for the kit's users
        return
    torch.manual_seed(value)


def check_other_process(env_fn: EnvFactory | str, *, seed: int = 0, steps: int = 100) -> None:
    """A new Python process (as a rollout server, a replay worker or a Ray actor runs
    the env), with another hash seed, gives the bits this process gives: same seed, same
    actions. It applies where a new process can build the env: a registered id, an
    importable env class, or a ``functools.partial`` of one (else it is skipped).
    """
    from simkit.testing._elsewhere import (
        portable,
        roundtrip,
        single_trace,
        steps_of,
        traces_elsewhere,
    )

    env_id, kwargs = portable(env_fn)
    here = steps_of(roundtrip(single_trace(as_factory(env_fn), seed=seed, steps=steps)))
    for hash_seed, there in traces_elsewhere("single", env_id, kwargs, seed=seed, steps=steps):
        _compare(
            here,
            steps_of(there),
            f"other process (a new Python process with PYTHONHASHSEED={hash_seed}, seed {seed})",
            "the env depends on its process: it iterates a set (or a dict keyed by "
            "objects) whose order follows the hash seed, uses hash(), id() or addresses, or "
            "reads module state that earlier code in this process changed",
        )


CHECKS: list[Check] = [
    check_spaces,
    check_determinism,
    check_reset_reuse,
    check_snapshot,
    check_randomization,
    check_no_global_rng,
    check_other_process,
]


def check_env(env_fn: EnvFactory | str, *, seed: int = 0, steps: int = 100) -> None:
    """Runs every check on ``env_fn`` (a registered id or zero-argument env factory);
    those that do not apply (:class:`CheckNotApplicable`) are skipped.

    Raises:
        ConformanceError: on the first check that fails, naming the likely cause.
    """
    for check in CHECKS:
        try:
            check(env_fn, seed=seed, steps=steps)
        except CheckNotApplicable:
            continue
