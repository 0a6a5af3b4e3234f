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
import re
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simkit.clients.learners._args import PPOArgs, SACArgs, capped
from simkit.clients.learners._checkpoint import checkpoint_algo, checkpoint_args, load_checkpoint
from simkit.clients.learners._train import TrainResult, evaluate_model, load_model
from simkit.clients.learners._train_cli import (
    claim_logdir,
    died_before_first_checkpoint,
    resumed_logdir,
)
from simkit.models import ActorCritic, numpy_actions

__all__ = ["train", "load_policy", "evaluate", "Policy", "TrainResult"]


def train(
    env_id: str,
    *,
    algo: str | None = None,
    total_steps: int | None = None,
    seed: int | None = None,
    logdir: str | Path | None = None,
    resume: str | Path | None = None,
    servers: int | None = None,
    progress: bool | None = None,
    tensorboard: bool = True,
    record: str | Path | None = None,
    **settings: Any,
) -> TrainResult:
    """Trains a policy on ``env_id`` as ``simkit train`` does; returns when the run ends.

    Args:
        env_id: a registered id, ``gym:<id>`` for an installed Gymnasium env, or
            ``package.module:Class``.
        algo: ``"ppo"`` (on-policy) or ``"sac"`` (off-policy, continuous actions); None:
            PPO, or the checkpoint's algorithm with ``resume``.
        total_steps: env steps to train for (None: the algorithm's default, or the
            checkpoint's with ``resume``; capped by ``$SIMKIT_MAX_TOTAL_STEPS``).
        seed: the run's root seed (None: the algorithm's default).
        logdir: where ``policy.safetensors``, ``checkpoints/``, ``progress.jsonl`` and
            ``tb/`` go (None: the resumed run's, else ``runs/<env>-<seed>-<time>``, as
            the command line).
        resume: continue the run of this checkpoint, its ``checkpoints/`` folder or its
            log directory (``--resume``): its settings, with ``total_steps`` (and the
            other settings a resumed run may change) from this call; the settings given
            must match the checkpoint's otherwise. A run that stopped before its first
            checkpoint has nothing to resume and starts over in its log directory.
        servers: local rollout servers (subprocesses) to stream from; 0 rolls out in this
            process; None as ``simkit train`` (with ``resume``: as the checkpoint's run).
        progress: a live progress bar (a plain line every 10 s without a terminal);
            None: on where standard output is a terminal, as ``simkit train``.
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
        ValueError: an unknown ``algo`` or a value out of range, a SAC run that ends
            before learning starts, a ``logdir`` that holds another run, a checkpoint
            of another env or algorithm (before anything starts). The messages name
            this function's keywords, not the command line's flags.
        simkit.errors.InvalidCheckpoint: ``resume`` holds no valid checkpoint.
        simkit.errors.RecordingLocked: another run writes to ``logdir`` now.
    """
    try:
        return _train(
            env_id,
            algo=algo,
            total_steps=total_steps,
            seed=seed,
            logdir=logdir,
            resume=resume,
            servers=servers,
            progress=progress,
            tensorboard=tensorboard,
            record=record,
            settings=settings,
        )
    except (ValueError, TypeError) as exc:
        words = python_words(str(exc))
        if words == str(exc):
            raise
        try:
            reworded = type(exc)(words)
        except Exception:  # an exception type that takes other arguments: as it came
            raise exc from None
        raise reworded from exc


_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
_FLAG_NUMBER = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*) (-?(?:\d[\d,_.]*\d|\d))\b")


def python_words(text: str) -> str:
    """A refusal worded for the command line, in :func:`train`'s words: each
    ``--flag-name`` becomes the keyword ``flag_name`` (``--num-envs must be >= 1`` reads
    ``num_envs must be >= 1``), ``--servers 0`` becomes ``servers=0`` and ``--algo sac``
    ``algo='sac'``."""
    text = re.sub(r"(?<![\w-])--algo (ppo|sac)\b", r"algo='\1'", text)
    text = _FLAG_NUMBER.sub(lambda m: f"{m.group(1).replace('-', '_')}={m.group(2)}", text)
    return _FLAG.sub(lambda m: m.group(1).replace("-", "_"), text)


def _train(
    env_id: str,
    *,
    algo: str | None,
    total_steps: int | None,
    seed: int | None,
    logdir: str | Path | None,
    resume: str | Path | None,
    servers: int | None,
    progress: bool | None,
    tensorboard: bool,
    record: str | Path | None,
    settings: dict[str, Any],
) -> TrainResult:
    """:func:`train`, in the command line's words (which :func:`train` rewords)."""
    if algo not in (None, "ppo", "sac"):
        raise ValueError(f"algo must be 'ppo' or 'sac', got {algo!r}")
    if resume is not None and died_before_first_checkpoint(resumed_logdir(resume)):
        scratch, resume = resume, None  # nothing to resume: the run starts over there
        logdir = logdir if logdir is not None else resumed_logdir(scratch)
        print(
            f"simkit.train: resume={str(scratch)!r}: its run stopped before its first "
            f"checkpoint, so there is nothing to resume; starting it from scratch in {logdir}",
            file=sys.stderr,
        )
    ckpt = None
    if resume is not None:
        ckpt = load_checkpoint(resume)
        saved_algo = checkpoint_algo(ckpt)
        if algo not in (None, saved_algo):
            raise ValueError(
                f"resume={str(resume)!r} is a {saved_algo} checkpoint; pass "
                f"algo={saved_algo!r}, or no algo"
            )
        algo = saved_algo
    algo = algo or "ppo"
    cls: type[PPOArgs] | type[SACArgs] = SACArgs if algo == "sac" else PPOArgs
    names = {f.name for f in dataclasses.fields(cls)} - {"env_id"}
    for name in settings:
        if name not in names:
            raise TypeError(
                f"unknown setting {name!r} for algo={algo!r}; expected one of {sorted(names)}"
            )
    given = dict(settings)
    if total_steps is not None:
        given["total_steps"] = total_steps
    if seed is not None:
        given["seed"] = seed
    if "hidden" in given:
        given["hidden"] = tuple(given["hidden"])
    if ckpt is not None:
        parse: Callable[[Any], PPOArgs | SACArgs] = cls.from_plain
        saved = checkpoint_args(ckpt, parse)
        if env_id != saved.env_id:
            raise ValueError(
                f"resume={str(resume)!r}: the checkpoint trains {saved.env_id!r}, this call "
                f"names {env_id!r}"
            )
        args = dataclasses.replace(saved, **given)
    else:
        args = dataclasses.replace(cls(env_id=env_id), **given)
    if isinstance(args, SACArgs):
        args.check_learning_starts()  # as asked: the cap shortens runs for the docs' tests
    args = capped(args)  # $SIMKIT_MAX_TOTAL_STEPS, where set
    args.check()
    if servers is not None and servers < 0:
        raise ValueError(f"servers must be >= 0, got {servers}")
    if servers is not None and servers > args.num_envs:
        raise ValueError(
            f"{servers} server(s) need at least one env slot each: num_envs must be >= "
            f"{servers}, got {args.num_envs}"
        )
    if logdir is None and resume is not None:
        logdir = resumed_logdir(resume)
    if logdir is None:
        name = env_id.replace("/", "_").replace(":", "_")
        tag = "-sac" if algo == "sac" else ""
        logdir = Path(f"runs/{name}{tag}-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    if progress is None:  # as the command line: a live line where someone watches
        progress = sys.stdout.isatty()
    common: dict[str, Any] = {
        "logdir": logdir,
        "servers": servers,
        "progress": progress,
        "tensorboard": tensorboard,
        "record": record,
        "resume": None if resume is None else str(resume),
    }
    if isinstance(args, SACArgs):
        from simkit.clients.learners._train_sac import check_env

        check_env(env_id)
    lock = claim_logdir(Path(logdir), None if resume is None else str(resume), python=True)
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
