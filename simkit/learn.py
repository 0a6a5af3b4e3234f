"""Training, loading and evaluating policies from Python: what ``simkit train`` and
``simkit eval`` do, as three calls in the shape stable-baselines3 and CleanRL users know.

>>> import simkit
>>> result = simkit.train("simkit/CartPole-v0", total_steps=50_000, num_envs=8, num_steps=128)
>>> result.logdir, result.checkpoint, result.mean_return       # doctest: +SKIP
>>> policy = simkit.load_policy(result.logdir)                  # a run, a checkpoint or a file
>>> action = policy.act(obs)                                    # doctest: +SKIP
>>> returns = simkit.evaluate(policy, episodes=10)              # doctest: +SKIP

The names are also attributes of ``simkit`` itself (``simkit.train``), imported on first use
(they load torch, which the SDK alone does not need).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simkit.clients.learners._args import PPOArgs, SACArgs, capped
from simkit.clients.learners._train import TrainResult, evaluate_model, load_model
from simkit.clients.learners._train_cli import claim_logdir
from simkit.models import ActorCritic, numpy_actions

__all__ = ["train", "load_policy", "evaluate", "Policy", "TrainResult"]


def train(
    env_id: str,
    *,
    algo: str = "ppo",
    total_steps: int | None = None,
    seed: int | None = None,
    logdir: str | Path | None = None,
    servers: int | None = None,
    progress: bool = False,
    tensorboard: bool = True,
    record: str | Path | None = None,
    **settings: Any,
) -> TrainResult:
    """Trains a policy on ``env_id`` as ``simkit train`` does; returns when the run ends.

    Args:
        env_id: a registered id, ``gym:<id>`` for an installed Gymnasium env, or
            ``package.module:Class``.
        algo: ``"ppo"`` (on-policy) or ``"sac"`` (off-policy, continuous actions).
        total_steps: env steps to train for (None: the algorithm's default; capped by
            ``$SIMKIT_MAX_TOTAL_STEPS``).
        seed: the run's root seed (None: the algorithm's default).
        logdir: where ``policy.safetensors``, ``checkpoints/``, ``progress.jsonl`` and
            ``tb/`` go (None: ``runs/<env>-<seed>-<time>``, as the command line).
        servers: local rollout servers (subprocesses) to stream from; 0 rolls out in this
            process; None as ``simkit train``.
        progress: a live progress bar (a plain line every 10 s without a terminal).
        tensorboard: write TensorBoard scalars under ``logdir/tb``.
        record: keep every episode in this recording directory (``--record``).
        **settings: any field of :class:`simkit.clients.PPOArgs` (or ``SACArgs`` with
            ``algo="sac"``), named as the ``simkit train`` flags without dashes:
            ``num_envs=8, num_steps=128, learning_rate=2.5e-4, hidden=(64, 64)``.

    Returns:
        The run's :class:`TrainResult`: ``logdir``, ``checkpoint`` (the last checkpoint's
        directory), ``policy`` (the policy file), ``mean_return`` (of the last 20 episodes),
        ``global_step``, ``steps_per_s`` and the time split.

    Raises:
        TypeError: a setting that is no field of the algorithm's settings.
        ValueError: an unknown ``algo`` or a value out of range, or a ``logdir`` that
            holds another run (before anything starts).
        simkit.errors.RecordingLocked: another run writes to ``logdir`` now.
    """
    if algo not in ("ppo", "sac"):
        raise ValueError(f"algo must be 'ppo' or 'sac', got {algo!r}")
    cls: type[PPOArgs] | type[SACArgs] = SACArgs if algo == "sac" else PPOArgs
    names = {f.name for f in dataclasses.fields(cls)} - {"env_id"}
    for name in settings:
        if name not in names:
            raise TypeError(
                f"unknown setting {name!r} for --algo {algo}; expected one of {sorted(names)}"
            )
    given = dict(settings)
    if total_steps is not None:
        given["total_steps"] = total_steps
    if seed is not None:
        given["seed"] = seed
    if "hidden" in given:
        given["hidden"] = tuple(given["hidden"])
    args = dataclasses.replace(cls(env_id=env_id), **given)
    args = capped(args)  # $SIMKIT_MAX_TOTAL_STEPS, where set
    args.check()
    if servers is not None and servers < 0:
        raise ValueError(f"servers must be >= 0, got {servers}")
    if servers is not None and servers > args.num_envs:
        raise ValueError(
            f"{servers} server(s) need at least one env slot each: num_envs must be >= "
            f"{servers}, got {args.num_envs}"
        )
    if logdir is None:
        name = env_id.replace("/", "_").replace(":", "_")
        tag = "-sac" if algo == "sac" else ""
        logdir = Path(f"runs/{name}{tag}-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    common: dict[str, Any] = {
        "logdir": logdir,
        "servers": servers,
        "progress": progress,
        "tensorboard": tensorboard,
        "record": record,
    }
    if isinstance(args, SACArgs):
        from simkit.clients.learners._train_sac import check_env

        check_env(env_id)
    lock = claim_logdir(Path(logdir))
    try:
        if isinstance(args, SACArgs):
            from simkit.clients.learners._train_sac import run_sac

            return run_sac(args, given=list(given), **common)
        from simkit.clients.learners._train import run_training

        return run_training(args, **common)
    finally:
        lock.release()


class Policy:
    """A saved policy, loaded to act: :func:`load_policy`.

    Attributes:
        env_id: the env it was trained on.
        model: the :class:`simkit.models.ActorCritic` (a ``torch.nn.Module``).
        observation_space, action_space: the spaces of one env (one agent, multi-agent).
    """

    def __init__(self, model: ActorCritic, env_id: str, *, seed: int = 0) -> None:
        self.model = model
        self.env_id = env_id
        self.observation_space = model.obs_space
        self.action_space = model.action_space
        self._generator = torch.Generator().manual_seed(seed)

    def act(self, obs: Any, *, deterministic: bool = True) -> Any:
        """The action for ``obs``: one observation gives one action, a batch ``(B, ...)``
        gives ``B`` actions. ``deterministic`` (the default) takes the mean action (the
        most likely one for discrete actions); else it samples from the policy's own
        seeded generator."""
        batch = np.asarray(obs)
        single = batch.shape == self.observation_space.shape
        if single:
            batch = batch[None]
        out = self.model.act(batch, generator=self._generator, deterministic=deterministic)
        actions = numpy_actions(out.actions)
        if not single:
            return actions
        action = actions[0]
        return action.item() if action.ndim == 0 else action

    def predict(
        self, obs: Any, state: Any = None, episode_start: Any = None, deterministic: bool = True
    ) -> tuple[Any, None]:
        """stable-baselines3's ``model.predict``: ``(action, None)`` (no recurrent state)."""
        return self.act(obs, deterministic=deterministic), None

    def __repr__(self) -> str:
        return f"Policy(env_id={self.env_id!r}, action_space={self.action_space})"


def load_policy(path: str | Path, *, seed: int = 0, trust: Collection[str] = ()) -> Policy:
    """The policy saved at ``path``: a run's log directory (its latest policy), its
    ``policy.safetensors`` or a checkpoint directory. ``seed`` seeds stochastic acting.
    ``trust``: the ``package.module:Class`` env ids the file may name (an id read from
    a file never imports code nobody named).

    Raises:
        simkit.errors.InvalidCheckpoint: ``path`` holds no valid policy.
    """
    model, env_id = load_model(path, trust=trust)
    return Policy(model, env_id, seed=seed)


def evaluate(
    policy: Policy | str | Path,
    *,
    episodes: int = 10,
    seed: int = 0,
    render: str | Path | None = None,
    fps: int = 30,
    trust: Collection[str] = (),
) -> np.ndarray:
    """Returns of ``episodes`` deterministic episodes of ``policy`` (a :class:`Policy` or a
    path :func:`load_policy` reads, with ``trust``) in its env, as ``simkit eval``;
    ``render`` also writes a video of them (``.mp4``, ``.gif``).

    Raises:
        ValueError: ``episodes`` or ``fps`` below 1; ``render`` of an env without frames.
        simkit.errors.InvalidCheckpoint: a path that holds no valid policy.
    """
    for name, value in (("episodes", episodes), ("fps", fps)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    loaded = policy if isinstance(policy, Policy) else load_policy(policy, trust=trust)
    return evaluate_model(
        loaded.model, loaded.env_id, episodes=episodes, seed=seed, render=render, fps=fps
    )
