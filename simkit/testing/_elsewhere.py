"""The kit's runs in another process: an env's trace computed in a new Python process
under another hash seed, as a rollout server, a replay worker or a Ray actor runs it,
to compare with the trace the checking process computes.

The request and the reply cross the pipe as :mod:`simkit.snapshot` msgpack (plain data,
no pickle). Run as ``python -m simkit.testing._elsewhere`` it serves one request read
from stdin.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from simkit import snapshot
from simkit.errors import ConformanceError, InvalidState
from simkit.registry import importable_class, make, portable_env
from simkit.testing._batch_driver import BatchSetup, Event, draw_script, run_script
from simkit.testing._driver import CheckNotApplicable, Driver, EnvFactory, Step

__all__ = [
    "HASH_SEEDS",
    "portable",
    "single_trace",
    "batch_trace",
    "trace_elsewhere",
    "traces_elsewhere",
]

HASH_SEEDS = (1, 2)
"""The ``PYTHONHASHSEED`` of each other process: two, so that an order that follows the
hash seed (a set of two str has two) differs from this process's in one of them at
least three times in four."""

TIMEOUT_S = 600.0
"""How long one other-process run may take (it imports simkit, builds the env and runs
the check's steps)."""


def portable(env_fn: EnvFactory | str) -> tuple[str, dict[str, Any]]:
    """The env id and kwargs a new process builds ``env_fn`` from: a registered id
    (:func:`simkit.registry.portable_env`), an importable env class, or a
    ``functools.partial`` of one with keywords only.

    Raises:
        CheckNotApplicable: nothing a new process can import builds it (a lambda, a
            closure, a class of ``__main__`` or of a function), or its kwargs are not
            plain data.
    """
    if isinstance(env_fn, str):
        try:
            env_id, kwargs = portable_env(env_fn, {})
        except ValueError as exc:
            raise CheckNotApplicable(str(exc)) from None
    else:
        target, kwargs = env_fn, {}
        if isinstance(env_fn, functools.partial) and not env_fn.args:
            target, kwargs = env_fn.func, dict(env_fn.keywords)
        path = importable_class(target)
        if path is None:
            name = getattr(target, "__qualname__", type(target).__name__)
            raise CheckNotApplicable(
                f"{name} cannot be rebuilt in a new process (a lambda, a closure, or a class "
                "of __main__ or of a function): pass a registered id or a module-level env "
                "class to check it there"
            )
        env_id = path
    try:
        snapshot.dumps(kwargs)
    except (InvalidState, TypeError, ValueError) as exc:
        raise CheckNotApplicable(f"its kwargs cannot cross to a new process: {exc}") from None
    return env_id, kwargs


def single_trace(factory: EnvFactory, *, seed: int, steps: int) -> list[dict[str, Any]]:
    """The kit's run of a single- or multi-agent env (:meth:`Driver.run`) as plain data."""
    env = factory()
    try:
        return [asdict(step) for step in Driver(env, seed).run(steps, seed=seed)]
    finally:
        env.close()


def steps_of(trace: list[dict[str, Any]]) -> list[Step]:
    """:func:`single_trace`'s plain data as :class:`Step` s again."""
    return [Step(**row) for row in trace]


def batch_trace(
    factory: Callable[..., Any], *, seed: int, steps: int, num_envs: int, device: Any
) -> list[dict[str, Any]]:
    """The batch kit's run of a :class:`simkit.BatchEnv` (:func:`run_script` of the
    script its determinism check draws) as plain data."""
    setup = BatchSetup.of(factory, num_envs, device, steps)
    env = setup.build()
    try:
        script = draw_script(env.single_action_space, env.num_envs, steps, seed)
        return [asdict(event) for event in run_script(env, script, seed)]
    finally:
        env.close()


def events_of(trace: list[dict[str, Any]]) -> list[Event]:
    """:func:`batch_trace`'s plain data as :class:`Event` s again."""
    return [Event(**row) for row in trace]


TRACES: dict[str, Callable[..., Any]] = {"single": single_trace, "batch": batch_trace}
"""The traces another process can compute, by name."""


def trace_elsewhere(
    trace: str, env_id: str, env_kwargs: dict[str, Any], hash_seed: int, **options: Any
) -> Any:
    """``TRACES[trace]`` of ``env_id`` (built with ``env_kwargs``) with ``options``,
    computed in a new Python process with ``PYTHONHASHSEED=hash_seed`` and this
    process's ``sys.path``, as the plain data that crossed back.

    Raises:
        ConformanceError: the other process failed (its last line of error output).
    """
    request = {
        "trace": trace,
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "options": options,
        "sys_path": [p for p in sys.path if isinstance(p, str)],
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "simkit.testing._elsewhere"],
            input=snapshot.dumps(request),
            capture_output=True,
            timeout=TIMEOUT_S,
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
        )
    except subprocess.TimeoutExpired:
        raise ConformanceError(
            f"{env_id} did not finish in a new process within {TIMEOUT_S:g} s"
        ) from None
    if done.returncode != 0:
        said = [line for line in done.stderr.decode(errors="replace").splitlines() if line]
        raise ConformanceError(
            f"{env_id} failed in a new process (PYTHONHASHSEED={hash_seed}, exit "
            f"{done.returncode}): {said[-1] if said else 'no error output'}"
        )
    return snapshot.loads(done.stdout)


def traces_elsewhere(
    trace: str, env_id: str, env_kwargs: dict[str, Any], **options: Any
) -> list[tuple[int, Any]]:
    """``(hash seed, trace)`` of :func:`trace_elsewhere` for each of :data:`HASH_SEEDS`,
    the processes run side by side.

    Raises:
        ConformanceError: one of them failed.
    """

    def one(hash_seed: int) -> tuple[int, Any]:
        return hash_seed, trace_elsewhere(trace, env_id, env_kwargs, hash_seed, **options)

    with ThreadPoolExecutor(len(HASH_SEEDS)) as pool:
        return list(pool.map(one, HASH_SEEDS))


def roundtrip(data: Any) -> Any:
    """``data`` as it comes back from another process (tuples as lists, and so on).

    Raises:
        CheckNotApplicable: it is not plain data, so it cannot cross.
    """
    try:
        return snapshot.loads(snapshot.dumps(data))
    except (InvalidState, TypeError, ValueError) as exc:
        raise CheckNotApplicable(
            f"the env's results cannot cross to a new process: {exc}"
        ) from None


def main() -> int:
    """Serves one request from stdin; the reply goes to stdout, and anything the env
    prints (Python or C) to stderr, so it cannot corrupt the reply."""
    request = snapshot.loads(sys.stdin.buffer.read())
    sys.path[:] = request["sys_path"]
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    env_id, env_kwargs = request["env_id"], request["env_kwargs"]

    def factory(**kwargs: Any) -> Any:
        return make(env_id, **{**env_kwargs, **kwargs})

    result = TRACES[request["trace"]](factory, **request["options"])
    with os.fdopen(reply_fd, "wb") as reply:
        reply.write(snapshot.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
