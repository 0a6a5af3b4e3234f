"""The conformance checks of batched envs (:class:`simkit.BatchEnv`, numpy and torch).

Each check has the signature ``check(env_fn, *, seed=0, steps=100, num_envs=4,
device=None)``: ``env_fn`` is a registered id, ``package.module:Class``, or a callable
taking ``num_envs=`` (and ``device=`` when one is given), such as the class itself. A
check raises :class:`~simkit.errors.ConformanceError` naming the likely cause, or
:class:`CheckNotApplicable` (a ``unittest.SkipTest``, which pytest reports as a skip)
where it does not apply to the env (no ``step_subset``, no named single counterpart, a
numpy batch for the device check).

Every check runs one :class:`~simkit.testing._batch_driver.Script` of steps and masked
resets (drawn from ``seed``) on batches whose time limit the kit shortens to
``max(2, steps // 4)``, so autoresets happen, and compares runs bit for bit.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

from simkit import registry, snapshot
from simkit._seeding import episode_seed
from simkit.errors import ConformanceError
from simkit.testing._batch_driver import (
    BatchFactory,
    BatchSetup,
    Event,
    Script,
    as_batch_factory,
    compare,
    draw_script,
    host,
    instance_view,
    limit,
    rows_of,
    run_script,
    stack,
    step_event,
)
from simkit.testing._checks import (
    KEPT_STATE,
    _check_observation,
    _seed_globals,
    check_plain_info,
    check_unchanged,
    freeze,
)
from simkit.testing._driver import CheckNotApplicable

__all__ = [
    "BATCH_CHECKS",
    "CheckNotApplicable",
    "check_batch_determinism",
    "check_batch_device",
    "check_batch_env",
    "check_batch_independence",
    "check_batch_no_global_rng",
    "check_batch_other_process",
    "check_batch_reset_reuse",
    "check_batch_singles",
    "check_batch_snapshot",
    "check_batch_spaces",
    "check_batch_subsets",
]


NONDETERMINISM = (
    "the batch probably draws randomness outside the streams it is handed (the global "
    "np.random/random/torch RNG, an unseeded np.random.default_rng()), reads the clock "
    "(time.time(), perf_counter) or keeps state across instances of the class"
)
GLOBAL_RNG = (
    "the batch draws from a global RNG (random, np.random or torch): with the global "
    "generators seeded alike the two runs agree; draw from the hooks' rngs instead"
)
NOT_GLOBAL = (
    "the runs differ even with the global RNGs seeded alike, so the cause is not the "
    "global RNG: the clock (time.time(), perf_counter), an unseeded generator "
    "(np.random.default_rng() without a seed, torch.Generator() not seeded from rngs) "
    "or state kept across instances of the class (a mutable class attribute)"
)
LEAK = (
    "reset_instances probably leaves state of the previous episode in the rows it "
    "resets (a counter, a velocity, a cached value, a running sum): set every "
    "per-instance state of the rows ids anew"
)
INCOMPLETE = (
    "the snapshot is incomplete: some per-instance state the hooks use is not in "
    "state_attributes (or get_env_state()), or set_env_state() does not restore it"
)
LIVE_ARRAYS = (
    "stepping changed a snapshot taken earlier; get_env_state() must return copies, not "
    "the live arrays of the batch"
)
DEPENDENT = (
    "instance rows depend on the other instances or on which instances reset "
    "together: a reduction over the whole batch (np.sum(x), np.linalg.norm(x) without "
    "axis=), draws made for the batch instead of per instance (draw rows from rngs), "
    "state reset for every instance instead of the rows ids, or parameters read for "
    "the wrong rows (replay relies on this: it replays instance i as a batch of one)"
)
SUBSET = (
    "step_subset(ids, actions, rngs) must give each instance exactly what "
    "step_instances gives it: index the per-instance state and parameters with ids "
    "(self.param_arrays[name][ids]), write back only those rows, and return len(ids) "
    "rows in the order of ids"
)
SINGLES = (
    "the batch must do the single env's arithmetic in the same order and draw in the "
    "same order: a reduction per instance vs on the batch (np.linalg.norm(d) vs "
    "np.linalg.norm(d, axis=1)), a sum in another order, float32 vs float64, "
    "another draw order, or another time limit or parameter"
)
DEVICE = (
    "the device path must compute what the host path computes: reset_masked must draw "
    "what reset_instances draws (same calls, same order) and set the same state, and "
    "the step hooks must not depend on where the tensors live (transcendental "
    "functions can differ between a GPU and the CPU: keep them out of what must match, "
    "or accept a device-only batch)"
)


def _setup(env_fn: BatchFactory | str, num_envs: int, device: Any, steps: int) -> BatchSetup:
    return BatchSetup.of(env_fn, num_envs, device, steps)


def _script(env: Any, steps: int, seed: int, *, resets: bool = True) -> Script:
    return draw_script(env.single_action_space, env.num_envs, steps, seed, resets=resets)


def check_batch_spaces(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """Observation rows (and final observations) lie in ``single_observation_space``;
    rewards are finite float64 of shape ``(N,)``; flags are bool ``(N,)``; one info dict
    per row."""
    setup = _setup(env_fn, num_envs, device, steps)
    env = setup.build()
    n = env.num_envs
    space = env.single_observation_space
    obs, info = env.reset(seed=seed)
    _rows_in_space(space, host(obs), n, "reset")
    _plain_rows(info, range(n), "reset")
    for t, (kind, payload) in enumerate(_script(env, steps, seed).events):
        if kind == "reset":
            obs, info = env.reset(options={"reset_mask": payload})
            _rows_in_space(space, host(obs), n, f"reset #{t}")
            _plain_rows(info, np.flatnonzero(payload).tolist(), f"reset #{t}")
            continue
        res = env.step_batch(stack(payload))
        _no_shared_state(env, res, t)
        _rows_in_space(space, host(res.obs), n, f"step #{t} obs")
        _rows_in_space(space, host(res.final_obs), n, f"step #{t} final_obs")
        reward = np.asarray(host(res.reward))
        if reward.dtype != np.float64 or reward.shape != (n,) or not np.isfinite(reward).all():
            raise ConformanceError(
                f"spaces: reward at step #{t} must be finite float64 of shape ({n},), got "
                f"{reward.dtype} of shape {reward.shape}: {reward!r}"
            )
        for name in ("terminated", "truncated"):
            flags = np.asarray(host(getattr(res, name)))
            if flags.dtype != np.bool_ or flags.shape != (n,):
                raise ConformanceError(
                    f"spaces: {name} at step #{t} must be bool of shape ({n},), got "
                    f"{flags.dtype} of shape {flags.shape}"
                )
        if len(res.infos) != n or not all(isinstance(i, dict) for i in res.infos):
            raise ConformanceError(f"spaces: step #{t} must give one info dict per instance")
        for i, row in enumerate(res.infos):
            check_plain_info(row, f"step #{t}, instance {i}")
    env.close()


def _no_shared_state(env: Any, res: Any, t: int) -> None:
    """Raises ConformanceError where a step's observations are a numpy state attribute's
    memory: a reset writing that attribute in place rewrites observations handed out
    (an ended row's ``final_obs`` then shows the next episode's first observation)."""
    for name in getattr(env, "state_attributes", None) or ():
        live = getattr(env, name, None)
        if not isinstance(live, np.ndarray):
            continue
        for field in ("obs", "final_obs"):
            value = getattr(res, field)
            if isinstance(value, np.ndarray) and np.shares_memory(value, live):
                raise ConformanceError(
                    f"spaces: step #{t}'s {field} shares memory with state attribute "
                    f"{name!r}; return a copy (self.{name}.copy()), or a reset writing "
                    f"self.{name} in place rewrites observations already handed out"
                )


def _plain_rows(info: Any, ids: Any, where: str) -> None:
    """Checks the rows ``ids`` of a Gymnasium vector ``info`` (a reset's) as plain data."""
    from simkit.vector._vector import info_row

    for i in ids:
        check_plain_info(info_row(info, i), f"{where}, instance {i}")


def _rows_in_space(space: Any, obs: Any, n: int, where: str) -> None:
    _check_observation(space, obs, f"observations at {where}", rows=n)
    for i, row in enumerate(rows_of(obs, n)):
        if not space.contains(row):
            raise ConformanceError(
                f"spaces: observation of instance {i} at {where} is outside "
                f"single_observation_space ({row!r}); check its dtype, shape and bounds"
            )


def _two_runs(
    setup: BatchSetup, script: Script, seed: int, pin: Callable[[int], None] | None = None
) -> tuple[list[Event], list[Event]]:
    runs = []
    for _ in range(2):
        if pin is not None:
            pin(-2)
        env = setup.build()
        runs.append(run_script(env, script, seed, before=pin))
        env.close()
    return runs[0], runs[1]


def check_batch_determinism(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """Two fresh batches, same seed, actions and masked resets: bit-identical
    observations, rewards, flags, parameters and infos, across autoresets.

    On a failure the check runs both again with the global RNGs seeded alike before
    every event, and says whether the global RNG is the cause.
    """
    setup = _setup(env_fn, num_envs, device, steps)
    probe = setup.build()
    script = _script(probe, steps, seed)
    probe.close()
    what = f"determinism (two fresh batches of {setup.num_envs}, seed {seed})"
    try:
        compare(*_two_runs(setup, script, seed), what, NONDETERMINISM)
    except ConformanceError as first:
        state = random.getstate(), np.random.get_state()  # noqa: NPY002
        try:
            compare(*_two_runs(setup, script, seed, lambda t: _seed_globals(t + 7)), what, "")
        except ConformanceError:
            raise ConformanceError(f"{first}. {NOT_GLOBAL}") from None
        finally:
            random.setstate(state[0])
            np.random.set_state(state[1])  # noqa: NPY002
        raise ConformanceError(str(first).replace(NONDETERMINISM, GLOBAL_RNG)) from None


def check_batch_reset_reuse(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """``reset(seed)`` after any history (steps, masked resets, another root) equals a
    fresh batch's ``reset(seed)``, and so does everything after it."""
    setup = _setup(env_fn, num_envs, device, steps)
    used = setup.build()
    run_script(used, _script(used, steps, seed + 1), seed + 12345)
    script = _script(used, steps, seed)
    again = run_script(used, script, seed)
    fresh = setup.build()
    compare(
        again,
        run_script(fresh, script, seed),
        f"reset reuse (reset(seed={seed}) of a used batch vs a fresh batch)",
        LEAK,
        names=("used", "fresh"),
    )
    used.close()
    fresh.close()


def check_batch_snapshot(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """``get_state()`` mid-run round-trips through :mod:`simkit.snapshot`, is not changed
    by later steps, and ``set_state`` on the same and on a fresh batch continue bit for
    bit (autoresets and masked resets included)."""
    setup = _setup(env_fn, num_envs, device, steps)
    env = setup.build()
    script = _script(env, steps, seed)
    k = max(1, len(script) // 3)
    run_script(env, script.head(k), seed)
    state, frozen = freeze(env)
    rest = script.tail(k)
    original = run_script(env, rest, None)
    check_unchanged(state, frozen, LIVE_ARRAYS)
    given = snapshot.loads(frozen)
    env.set_state(given)
    compare(
        original,
        run_script(env, rest, None),
        f"snapshot (set_state on the same batch, after {k} events)",
        INCOMPLETE,
        names=("original", "restored"),
    )
    check_unchanged(given, frozen, KEPT_STATE)
    fresh = setup.build()
    fresh.set_state(snapshot.loads(frozen))
    compare(
        original,
        run_script(fresh, rest, None),
        f"snapshot (set_state on a fresh batch, after {k} events)",
        INCOMPLETE,
        names=("original", "restored"),
    )
    env.close()
    fresh.close()


def check_batch_independence(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """Keyed resets: instance ``i`` of a batch of N, whichever instances step and reset
    with it, equals a batch of one seeded as instance ``i`` (``seeds.env_offset = i``)
    given instance ``i``'s actions and resets, bit for bit (what replay relies on)."""
    setup = _setup(env_fn, num_envs, device, steps)
    env = setup.build()
    script = _script(env, steps, seed)
    whole = run_script(env, script, seed)
    env.close()
    for i in range(setup.num_envs):
        alone = setup.build(1, offset=i)
        mine = run_script(alone, script.project(i), seed)
        alone.close()
        compare(
            instance_view(whole, i),
            instance_view(mine, i, row=0),
            f"independence (instance {i} of a batch of {setup.num_envs} vs a batch of one "
            f"seeded as instance {i})",
            DEPENDENT,
            names=(f"batch of {setup.num_envs}", "batch of one"),
        )


def check_batch_subsets(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """Where the class has ``step_subset``: stepping random subsets of the instances
    (``step_batch(actions, env_ids)``) gives each instance the trajectory whole-batch
    steps give it, autoresets included."""
    setup = _setup(env_fn, num_envs, device, steps)
    env = setup.build()
    if not env.subset_steps:
        env.close()
        raise CheckNotApplicable(
            f"{type(env).__name__} has no step_subset: subset steps (step_batch with "
            "env_ids, send() of a subset, batch_size < num_envs) are refused; recording "
            "and replay do not need them"
        )
    script = _script(env, steps, seed, resets=False)
    whole = run_script(env, script, seed)
    env.close()
    split = setup.build()
    n = setup.num_envs
    parts = run_script(split, Script(n, ()), seed)
    taken = [0] * n
    pick = np.random.default_rng(seed + 3)
    while min(taken) < len(script):
        ids = [int(i) for i in pick.permutation(n)[: pick.integers(1, n + 1)]]
        ids = [i for i in ids if taken[i] < len(script)]
        if not ids:
            continue
        rows = [script.events[taken[i]][1][i] for i in ids]
        res = split.step_batch(stack(rows), ids)
        ev = step_event(res, -1)
        for k, i in enumerate(ids):
            fields = {name: [values[k]] for name, values in ev.fields.items()}
            parts.append(Event("step", taken[i], np.array([i]), fields))
            taken[i] += 1
    split.close()
    for i in range(n):
        compare(
            instance_view(whole, i),
            instance_view(parts, i),
            f"subset steps (instance {i} stepped in random subsets vs whole-batch steps)",
            SUBSET,
            names=("whole batch", "subsets"),
        )


def single_factory(batch: Any) -> Callable[[], Any] | None:
    """The single-instance counterpart the batch's class names (``single_env``): a
    factory of it, or None."""
    named = getattr(type(batch), "single_env", None)
    if named is None:
        return None
    if isinstance(named, str):
        return lambda: registry.make(named)
    if callable(named):
        return named
    raise TypeError(
        f"{type(batch).__name__}.single_env must be an env id, an env class or a factory, "
        f"got {named!r}"
    )


def check_batch_singles(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """Where the class names its single-instance counterpart (``single_env``): instance
    ``i`` equals that env reset with ``episode_seed(seed, i, k)`` for its ``k``-th
    episode: observations, rewards, flags and parameters, bit for bit, autoresets and
    masked resets included; the message names the first differing instance, step and
    element."""
    if device is not None:
        raise CheckNotApplicable(
            "compares the batch without a device with the single envs; the device "
            "check compares the device with the CPU"
        )
    setup = _setup(env_fn, num_envs, device, steps)
    env = setup.build()
    make_single = single_factory(env)
    if make_single is None:
        env.close()
        raise CheckNotApplicable(
            f"{type(env).__name__} names no single-instance counterpart (set the class "
            "attribute single_env to its id or class to compare with it)"
        )
    script = _script(env, steps, seed)
    batch = run_script(env, script, seed, infos=False)
    label = getattr(type(env), "single_env", None)
    label = label if isinstance(label, str) else getattr(label, "__name__", "single")
    for i in range(setup.num_envs):
        single = make_single()
        limit(single, env.max_episode_steps)
        compare(
            instance_view(batch, i),
            _single_run(single, script.project(i), seed, i),
            f"batch == singles (instance {i} vs {label} reset with episode_seed({seed}, {i}, k))",
            SINGLES,
            names=("batch", "single"),
        )
        single.close()
    env.close()


def _single_run(single: Any, script: Script, root: int, i: int) -> list[Event]:
    """A single env through instance ``i``'s script, as events of instance ``i``."""
    ids = np.array([i], dtype=np.int64)
    k = 0
    obs, info = single.reset(seed=episode_seed(root, i, k))
    events = [Event("reset", -1, ids, {"obs": [obs], "params": [info.get("params")]})]
    for t, (kind, payload) in enumerate(script.events):
        if kind == "reset":
            k += 1
            obs, info = single.reset(seed=episode_seed(root, i, k))
            events.append(Event("reset", t, ids, {"obs": [obs], "params": [info.get("params")]}))
        elif kind == "step":
            final, reward, terminated, truncated, _ = single.step(payload[0])
            params = None
            obs = final
            if terminated or truncated:
                k += 1
                obs, info = single.reset(seed=episode_seed(root, i, k))
                params = info.get("params")
            fields = {
                "obs": [obs],
                "final_obs": [final],
                "reward": [np.float64(reward)],
                "terminated": [np.bool_(terminated)],
                "truncated": [np.bool_(truncated)],
                "params": [params],
            }
            events.append(Event("step", t, ids, fields))
    return events


def check_batch_device(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """A torch batch on its device (whole-batch steps: device-resident where the class
    has ``reset_masked``) equals the same batch on the CPU stepped through the host path
    (``reset_instances`` for every reset), bit for bit: observations, rewards, flags."""
    setup = _setup(env_fn, num_envs, device, steps)
    env = setup.build()
    if env.xp is np:
        env.close()
        raise CheckNotApplicable(
            "a numpy batch; give a device (device='cpu' or 'cuda', simkit check --device) "
            "to check a torch batch"
        )
    where = env.device
    script = _script(env, steps, seed, resets=False)
    env.reset(seed=seed)
    env.prepare_device_steps(max(1, len(script)))
    on_device = run_script(env, script, None, infos=False)
    env.close()
    cpu = setup.build(device="cpu")
    cpu.reset(seed=seed)
    ids = np.arange(cpu.num_envs, dtype=np.int64)
    on_host = run_script(cpu, script, None, infos=False, step=lambda e, a: e.step_batch(a, ids))
    cpu.close()
    compare(
        on_device,
        on_host,
        f"device ({where}, whole-batch steps vs cpu, host path)",
        DEVICE,
        names=(str(where), "cpu host path"),
        fields=("obs", "final_obs", "reward", "terminated", "truncated"),
    )


def check_batch_no_global_rng(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """Seeding the global ``random``, ``np.random`` and torch RNGs differently between
    two runs (and again before every event) changes nothing."""
    setup = _setup(env_fn, num_envs, device, steps)
    probe = setup.build()
    script = _script(probe, steps, seed)
    probe.close()
    state = random.getstate(), np.random.get_state()  # noqa: NPY002
    try:
        runs = []
        for base in (1, 2):

            def reseed(t: int, base: int = base) -> None:
                _seed_globals(base + t + 1)

            reseed(-1)
            env = setup.build()
            runs.append(run_script(env, script, seed, before=reseed))
            env.close()
        compare(
            runs[0],
            runs[1],
            "global RNG (random/np.random/torch seeded differently)",
            "the batch draws from a global RNG (random, np.random or torch) instead of "
            "the rngs passed to its hooks",
            names=("globals seeded 1", "globals seeded 2"),
        )
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])  # noqa: NPY002


def check_batch_other_process(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """A new Python process (as a rollout server or a Ray actor runs the batch), with
    another hash seed, gives the bits this process gives: same seed, actions and masked
    resets. It applies where a new process can build the batch: a registered id, an
    importable ``BatchEnv`` class, or a ``functools.partial`` of one (else it is skipped).
    """
    from simkit.testing._elsewhere import (
        batch_trace,
        events_of,
        portable,
        roundtrip,
        traces_elsewhere,
    )

    env_id, kwargs = portable(env_fn)
    options: dict[str, Any] = {"seed": seed, "steps": steps, "num_envs": num_envs}
    options["device"] = None if device is None else str(device)
    here = events_of(roundtrip(batch_trace(as_batch_factory(env_fn), **options)))
    for hash_seed, there in traces_elsewhere("batch", env_id, kwargs, **options):
        compare(
            here,
            events_of(there),
            f"other process (a new Python process with PYTHONHASHSEED={hash_seed}, seed {seed})",
            "the batch depends on its process: it iterates a set (or a dict keyed by "
            "objects) whose order follows the hash seed, uses hash(), id() or addresses, or "
            "reads module state that earlier code in this process changed",
            names=("this process", "the new one"),
        )


BATCH_CHECKS: list[Callable[..., None]] = [
    check_batch_spaces,
    check_batch_determinism,
    check_batch_reset_reuse,
    check_batch_snapshot,
    check_batch_independence,
    check_batch_subsets,
    check_batch_singles,
    check_batch_device,
    check_batch_no_global_rng,
    check_batch_other_process,
]
"""Every batch check, in the order :func:`check_batch_env` and ``simkit check`` run
them (the later ones rely on what the earlier ones check)."""


def check_batch_env(
    env_fn: BatchFactory | str,
    *,
    seed: int = 0,
    steps: int = 100,
    num_envs: int = 4,
    device: Any = None,
) -> None:
    """Runs every batch check on ``env_fn``; those that do not apply are skipped.

    Raises:
        ConformanceError: on the first check that fails, naming the check, the first
            difference and the likely cause.
    """
    for check in BATCH_CHECKS:
        try:
            check(env_fn, seed=seed, steps=steps, num_envs=num_envs, device=device)
        except CheckNotApplicable:
            continue
        except ConformanceError as exc:
            raise ConformanceError(f"{check.__name__}: {exc}") from None
