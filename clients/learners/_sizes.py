"""What a run's settings will allocate, checked against the memory this machine has free
before anything is built (one line instead of a ``MemoryError`` once the run started).

:func:`check_run_memory` makes one env of the run (with its ``env_kwargs``: a constructor
argument the env refuses is one line here, before any server starts), reads its
spaces, and checks the rollout's fragment arrays (PPO), the replay buffer (SAC) and the
in-process envs against :func:`~simkit._limits.available_memory`. The networks are
checked where they are built (``simkit.models``).
"""

from __future__ import annotations

import math
from contextlib import closing
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit._limits import ENV_BYTES, check_memory

__all__ = [
    "space_bytes",
    "probe_env",
    "check_run_memory",
    "FRAGMENT_COPIES",
    "SAMPLE_COPIES",
    "STEP_SCALARS",
]

FRAGMENT_COPIES = 3
"""A PPO fragment's arrays exist about three times at once: the rollout's buffer, the
learner's tensors of the batch, and its minibatch and gradient copies."""

SAMPLE_COPIES = 4
"""A SAC batch exists about four times at once: sampled, as tensors, on the device, and
the targets computed from it."""

STEP_SCALARS = 48
"""Bytes per step and row beside the observation and action: reward, flags, value,
log-probability, advantage, return, policy version."""


def space_bytes(space: spaces.Space[Any]) -> int:
    """Bytes of one sample of ``space`` as arrays (nested spaces summed)."""
    if isinstance(space, spaces.Dict):
        return sum(space_bytes(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return sum(space_bytes(s) for s in space.spaces)
    if isinstance(space, spaces.Discrete):
        return 8
    shape = getattr(space, "shape", None) or ()
    dtype = getattr(space, "dtype", None)
    itemsize = np.dtype(dtype).itemsize if dtype is not None else 8
    return max(1, math.prod(shape)) * itemsize


def probe_env(env_id: str, env_kwargs: dict[str, Any]) -> tuple[Any, Any, int]:
    """``(observation space, action space, policy rows per env)`` of one env of
    ``env_id`` made with ``env_kwargs`` (then closed).

    Raises:
        ValueError: the env refuses ``env_kwargs`` (or its constructor fails on them):
            one line naming the id and the arguments.
    """
    from simkit.rollout._rows import make_env_rows

    try:
        rows = make_env_rows(env_id, 1, env_kwargs=env_kwargs)
    except (TypeError, ValueError) as exc:
        if not env_kwargs:
            raise
        shown = ", ".join(f"{k}={v!r}" for k, v in env_kwargs.items())
        if len(shown) > 200:
            shown = shown[:200] + "..."
        raise ValueError(f"--env-kwarg {shown}: {env_id} cannot be made with it: {exc}") from exc
    with closing(rows):
        return rows.observation_space, rows.action_space, rows.num_rows


def check_run_memory(args: Any, *, in_process: bool) -> None:
    """Refuses settings whose arrays do not fit the memory available now: PPO's
    fragments (``num_envs x num_steps`` steps of every policy row, :data:`FRAGMENT_COPIES`
    times), SAC's replay buffer (``buffer_size`` transitions) and its fragments, and the
    envs themselves where they run in this process.

    Raises:
        ValueError: one line with the flags, what they need and what is free; or the env
            refuses its ``env_kwargs`` (:func:`probe_env`).
    """
    obs_space, act_space, per_env = probe_env(args.env_id, dict(args.env_kwargs))
    rows = args.num_envs * per_env
    step = space_bytes(obs_space) + space_bytes(act_space) + STEP_SCALARS
    fragments = rows * args.num_steps * step * FRAGMENT_COPIES
    envs = args.num_envs * ENV_BYTES if in_process else 0
    buffer_size = getattr(args, "buffer_size", None)
    if buffer_size is None:
        check_memory(
            fragments + envs,
            f"--num-envs {args.num_envs:,} x --num-steps {args.num_steps:,} ({rows:,} policy "
            f"rows, {step:,} B a step, {FRAGMENT_COPIES} copies"
            + (", and the envs in process)" if in_process else ")"),
            "fewer envs or steps per update",
        )
        return
    transition = 2 * space_bytes(obs_space) + space_bytes(act_space) + 24
    batches = args.batch_size * transition * SAMPLE_COPIES
    check_memory(
        buffer_size * transition + batches + fragments + envs,
        f"--buffer-size {buffer_size:,} ({transition:,} B a transition), --batch-size "
        f"{args.batch_size:,} and --num-envs {args.num_envs:,} x --num-steps {args.num_steps:,}",
        "a smaller buffer or batch",
    )
