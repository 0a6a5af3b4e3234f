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

import numbers
import re
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simkit._kernels import is_pinned
from simkit.clients.learners._args import PPOArgs, SACArgs
from simkit.clients.learners._evaluate import evaluate_model, load_model
from simkit.clients.learners._logdir import (
    claim_logdir,
    died_before_first_checkpoint,
    resumed_logdir,
)
from simkit.clients.learners._run import TrainResult
from simkit.clients.learners._train import execute, plan, resumed_kernels
from simkit.models import ActorCritic, numpy_actions

__all__ = ["train", "load_policy", "evaluate", "Policy", "TrainResult"]


def train(env: str | PPOArgs | SACArgs, /, **keywords: Any) -> TrainResult:
    """Trains a policy as ``simkit train`` does; returns when the run ends.

    Every ``simkit train`` flag is a keyword of the same name (``--checkpoint-every 5``
    is ``checkpoint_every=5``, ``--env-kwarg k=v`` is ``env_kwargs={"k": v}``,
    ``--no-progress`` is ``progress=False``), and so is every field of
    :class:`simkit.clients.PPOArgs` (or ``SACArgs`` with ``algo="sac"``): ``num_envs=8,
    num_steps=128, learning_rate=2.5e-4, hidden=(64, 64)``. A misspelt keyword is refused
    with the nearest names.

    Args:
        env: a registered id, ``gym:<id>`` for an installed Gymnasium env, or
            ``package.module:Class``; or a ``PPOArgs`` / ``SACArgs`` (its fields, the
            keywords over them).
        algo: ``"ppo"`` (on-policy) or ``"sac"`` (off-policy, continuous actions); None:
            PPO, or the checkpoint's with ``resume``.
        logdir: where ``policy.safetensors``, ``checkpoints/``, ``progress.jsonl`` and
            ``tb/`` go (None: the resumed run's, else ``runs/<env>-<seed>-<time>``).
        resume: continue the run of this checkpoint, its ``checkpoints/`` folder or its
            log directory: its settings, with ``total_steps`` (and the other settings a
            resumed run may change) from this call; the settings given must match the
            checkpoint's otherwise. A run that stopped before its first checkpoint has
            nothing to resume and starts over in its log directory.
        servers: local rollout servers (subprocesses) to stream from; 0 rolls out in this
            process; None as ``simkit train`` (with ``resume``: as the checkpoint's run).
        connect: running ``simkit serve ENV --policy`` endpoints to stream from.
        progress: a live progress bar (a plain line every ``print_every`` s without a
            terminal); default: on where standard output is a terminal.
        reproducible: the kernels are pinned (``simkit train --reproducible`` re-executes
            itself so); a process whose kernels are not pinned is refused.
        max_rounds: stop after this many rounds (PPO updates, SAC weight pushes).
        handle_signals: SIGINT/SIGTERM stop the run after the round, with a checkpoint.

    Returns:
        The run's :class:`TrainResult`: ``logdir``, ``checkpoint`` (the last checkpoint's
        directory), ``policy`` (the policy file), ``mean_return`` (of the last 20 episodes),
        ``global_step``, ``steps_per_s`` and the time split.

    Raises:
        TypeError: an unknown keyword (the nearest ones named).
        ValueError: an unknown ``algo`` or a value out of range, a SAC run that ends
            before learning starts, a ``logdir`` that holds another run, a checkpoint
            of another env or algorithm (before anything starts). The messages name
            this function's keywords, not the command line's flags.
        simkit.errors.InvalidCheckpoint: ``resume`` holds no valid checkpoint.
        simkit.errors.RecordingLocked: another run writes to ``logdir`` now.
    """
    try:
        return _train(env, keywords)
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
    return _FLAG.sub(lambda m: _KEYWORDS.get(m.group(1), m.group(1).replace("-", "_")), text)


_KEYWORDS = {"env-kwarg": "env_kwargs", "no-progress": "progress=False"}
"""The flags whose keyword is not their name in Python's spelling."""


def _train(env: str | PPOArgs | SACArgs, keywords: dict[str, Any]) -> TrainResult:
    """:func:`train`, in the command line's words (which :func:`train` rewords)."""
    resume = keywords.get("resume")
    if resume is not None and died_before_first_checkpoint(resumed_logdir(resume)):
        logdir = keywords.get("logdir") or resumed_logdir(resume)
        keywords = {**keywords, "resume": None, "logdir": logdir}  # nothing to resume there
        print(
            f"simkit.train: resume={str(resume)!r}: its run stopped before its first "
            f"checkpoint, so there is nothing to resume; starting it from scratch in {logdir}",
            file=sys.stderr,
        )
    if keywords.get("progress") is None:  # as the command line: a live line where one watches
        keywords = {**keywords, "progress": sys.stdout.isatty()}
    run = plan(env, **keywords)
    keep, said = resumed_kernels(run)
    if keep and not is_pinned():
        if run.options.reproducible:
            raise ValueError(
                "--reproducible pins the numeric kernels as numpy and torch load, so this "
                "process cannot: run `simkit train ... --reproducible`, which re-executes "
                "itself pinned"
            )
        said = (
            "the checkpoint was trained with --reproducible and this process's kernels "
            "are not pinned: the continuation's bits may differ from the run's"
        )
    if said:
        print(f"simkit.train: resume: {said}", file=sys.stderr)
    resumed = run.options.resume
    lock = claim_logdir(run.logdir, None if resumed is None else str(resumed), python=True)
    try:
        return execute(run)
    finally:
        lock.release()


class Policy:
    """A saved policy, loaded to act: :func:`load_policy`.

    Attributes:
        env_id: the env it was trained on.
        env_kwargs: that env's constructor arguments in the run (``{}``: none).
        model: the :class:`simkit.models.ActorCritic` (a ``torch.nn.Module``).
        observation_space, action_space: the spaces of one env (one agent, multi-agent).
    """

    def __init__(
        self,
        model: ActorCritic,
        env_id: str,
        *,
        seed: int = 0,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.observation_space = model.obs_space
        self.action_space = model.action_space
        self._generator = torch.Generator().manual_seed(seed)

    def act(self, obs: Any, *, deterministic: bool = True) -> Any:
        """The action for ``obs``: one observation gives one action, a batch ``(B, ...)``
        gives ``B`` actions. ``deterministic`` (the default) takes the mean action (the
        most likely one for discrete actions); else it samples from the policy's own
        seeded generator.

        Raises:
            ValueError: ``obs`` is neither one observation nor a batch of them, or not
                numbers.
        """
        batch = np.asarray(obs)
        shape = tuple(self.observation_space.shape or ())
        single = batch.shape == shape
        if (not single and batch.shape[1:] != shape) or batch.dtype.kind not in "biuf":
            batched = ", ".join(["B", *map(str, shape)])
            got = f"shape {batch.shape}" if batch.dtype.kind in "biuf" else f"dtype {batch.dtype}"
            raise ValueError(
                f"Policy.act takes one observation of shape {shape} or a batch of shape "
                f"({batched}) of numbers, got {got}"
            )
        if single:
            batch = batch[None]
        elif not len(batch):  # no rows: no forward pass (torch cannot reshape them)
            return np.zeros((0, *(self.action_space.shape or ())), self.action_space.dtype)
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
    model, env_id, env_kwargs = load_model(path, trust=trust)
    return Policy(model, env_id, seed=seed, env_kwargs=env_kwargs)


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
        TypeError: ``episodes`` or ``fps`` not an int (a float, a str, a bool).
        ValueError: ``episodes`` or ``fps`` below 1; ``render`` of an env without frames.
        simkit.errors.InvalidCheckpoint: a path that holds no valid policy.
    """
    for name, value in (("episodes", episodes), ("fps", fps)):
        whole = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
        if not whole or value < 1:
            error = ValueError if whole else TypeError
            raise error(f"{name} must be a whole number >= 1, got {value!r}")
    loaded = policy if isinstance(policy, Policy) else load_policy(policy, trust=trust)
    return evaluate_model(
        loaded.model,
        loaded.env_id,
        episodes=episodes,
        seed=seed,
        render=render,
        fps=fps,
        env_kwargs=loaded.env_kwargs,
    )
