"""What SAC's run (:func:`simkit.clients.learners.sac.learn`) builds before it learns,
torch-light and without the learner: the env check (continuous, bounded actions), the
actor, the resumed settings, and the replay buffer (its memory stated before it is
allocated; from a checkpoint, checked, or filled from recordings)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from simkit.clients.learners._args import SACArgs
from simkit.clients.learners._checkpoint import Checkpoint
from simkit.clients.learners._evaluate import make_vector
from simkit.clients.learners._replay import ReplayBuffer
from simkit.errors import InvalidCheckpoint
from simkit.models import ActorCritic, ModelSpec
from simkit.models import build_model as build_from_spec
from simkit.registry import EnvKind, spec

__all__ = [
    "SAC_RESUME_FREE",
    "build_actor",
    "check_env",
    "fill_from_recording",
    "open_buffer",
    "sac_spec",
]

SAC_RESUME_FREE = ("total_steps", "device", "env_threads", "torch_threads", "cuda_graph")
""":class:`SACArgs` fields a resumed run may change; the rest must match the checkpoint."""

REPLAY_FILE = "replay.safetensors.zst"
SAC_DEFAULT_SERVERS = 0
"""SAC rolls out in process unless told otherwise: with CleanRL's one env a sync round
is a single env step, which a server process would turn into a round trip per step."""


def sac_spec(args: SACArgs) -> ModelSpec:
    """The servable actor of ``args`` (``"sac_mlp"``)."""
    return ModelSpec("sac_mlp", {"hidden_sizes": list(args.hidden)})


def check_env(
    env_id: str, env_kwargs: Mapping[str, Any] | None = None
) -> tuple[spaces.Box, spaces.Box]:
    """The spaces of the env (built with ``env_kwargs``, the run's), if SAC can learn it.

    Raises:
        ValueError: multi-agent, or a discrete / unbounded action space (one line,
            naming ``--algo ppo`` where PPO can).
    """
    if spec(env_id).kind is EnvKind.MULTI_AGENT:
        raise ValueError(f"--algo sac learns single-agent envs; {env_id!r} is multi-agent")
    with closing(make_vector(env_id, 1, env_kwargs=env_kwargs)) as vector:
        obs_space, act_space = vector.single_observation_space, vector.single_action_space
    if not isinstance(act_space, spaces.Box) or not np.issubdtype(act_space.dtype, np.floating):
        raise ValueError(
            f"--algo sac needs continuous (Box) actions; {env_id!r} has {act_space}: use --algo ppo"
        )
    if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        raise ValueError(f"--algo sac needs a bounded action box; {env_id!r} has {act_space}")
    if not isinstance(obs_space, spaces.Box):
        raise ValueError(f"--algo sac needs Box observations; {env_id!r} has {obs_space}")
    return obs_space, act_space


def build_actor(args: SACArgs) -> ActorCritic:
    """The initial actor, from ``args.seed`` (global RNG untouched)."""
    obs_space, act_space = check_env(args.env_id, args.env_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        return build_from_spec(sac_spec(args), obs_space, act_space)


def fill_from_recording(
    buffer: ReplayBuffer,
    directory: str | Path,
    env_id: str,
    obs_space: spaces.Box,
    act_space: spaces.Box,
) -> tuple[int, int]:
    """Adds every complete recorded episode of ``directory`` to ``buffer``; returns
    ``(episodes, transitions)``.

    Episodes recorded without final observations (``--record`` of a fragment stream
    before they were carried) lose only their last transition where it was truncated
    (its bootstrap target is unknown); terminated ones need none.

    Raises:
        FileNotFoundError: no such directory.
        ValueError: an episode of another env, or whose observations or actions do not
            fit the spaces (expected and actual named), or no episode at all.
    """
    from simkit.recording import Episode, RecordingReader

    reader = RecordingReader(directory)
    if len(reader) == 0:
        raise ValueError(f"--buffer-from {directory}: no complete episode recorded there")
    episodes = transitions = 0
    for i in range(len(reader)):
        ep = reader.load(i)
        if not isinstance(ep, Episode) or ep.env_id != env_id:
            what = "a multi-agent env" if not isinstance(ep, Episode) else repr(ep.env_id)
            raise ValueError(
                f"--buffer-from {directory}: episode {i} was recorded on {what}, "
                f"this run trains {env_id!r}"
            )
        obs = np.asarray(ep.obs)
        actions = np.asarray(ep.actions)
        t = ep.length
        if obs.shape[1:] != obs_space.shape or actions.shape[1:] != act_space.shape:
            raise ValueError(
                f"--buffer-from {directory}: episode {i} has observations {obs.shape[1:]} and "
                f"actions {actions.shape[1:]}, the env's spaces are {obs_space.shape} and "
                f"{act_space.shape}"
            )
        if t == 0:
            continue
        keep = np.ones(t, dtype=np.bool_)
        if obs.shape[0] == t + 1:
            next_obs = obs[1:]
        else:
            next_obs = np.concatenate([obs[1:], np.zeros_like(obs[:1])])
            keep[-1] = bool(np.asarray(ep.terminated)[-1])
        n = int(keep.sum())
        buffer.add(
            obs[:t][keep],
            actions[keep],
            np.asarray(ep.rewards)[keep],
            next_obs[keep],
            np.asarray(ep.terminated)[keep],
            np.asarray(ep.truncated)[keep],
            np.zeros(n, dtype=np.int64),
        )
        episodes += 1
        transitions += n
    return episodes, transitions


def open_buffer(
    args: SACArgs,
    obs_space: spaces.Box,
    act_space: spaces.Box,
    ckpt: Checkpoint | None,
    buffer_from: str | Path | None,
) -> ReplayBuffer:
    """The run's replay buffer, its memory stated first: the checkpoint's (what the run
    expects bounds what is inflated), or a new one, filled from ``buffer_from``."""
    need = ReplayBuffer.describe_needed(args.buffer_size, obs_space.shape, act_space.shape)
    print(f"simkit train: replay buffer of {need}", file=sys.stderr)
    if ckpt is not None and REPLAY_FILE in ckpt.extra:
        buffer = ReplayBuffer.load(
            ckpt.extra[REPLAY_FILE],
            capacity=args.buffer_size,
            obs_shape=obs_space.shape,
            action_shape=act_space.shape,
            obs_dtype=np.float32,
            action_dtype=np.float32,
        )
        # A stored action outside the env's box (beyond float32 rounding): no actor of
        # this env chose it, so the buffer was made for another env or crafted.
        actions = buffer.actions[: len(buffer)]
        low = np.asarray(act_space.low, np.float32)
        high = np.asarray(act_space.high, np.float32)
        slack = 1e-5 * (1.0 + np.maximum(np.abs(low), np.abs(high)))
        outside = np.any(
            (actions < low - slack) | (actions > high + slack), axis=tuple(range(1, actions.ndim))
        )
        if outside.any():
            raise InvalidCheckpoint(
                f"{ckpt.extra[REPLAY_FILE]}: {int(outside.sum())} stored action(s) outside the "
                f"env's action box [{act_space.low.tolist()}, {act_space.high.tolist()}] (the "
                f"first at row {int(np.flatnonzero(outside)[0])}); not a buffer of this env"
            )
        return buffer
    buffer = ReplayBuffer(args.buffer_size, obs_shape=obs_space.shape, action_shape=act_space.shape)
    if ckpt is None and buffer_from is not None:
        episodes, added = fill_from_recording(
            buffer, buffer_from, args.env_id, obs_space, act_space
        )
        print(
            f"simkit train: --buffer-from {buffer_from}: {added:,} transitions of "
            f"{episodes:,} episodes in the buffer",
            file=sys.stderr,
        )
    return buffer
