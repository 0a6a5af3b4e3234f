"""Evaluating a saved policy: the Python API behind ``simkit eval`` (and
:func:`simkit.evaluate`, :func:`simkit.load_policy`)."""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Collection, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any, TypedDict, Unpack

import gymnasium
import numpy as np

from simkit._contract import EnvKind
from simkit.clients.learners._checkpoint import check_tensors, load_policy, resolve_checkpoint
from simkit.clients.learners.ppo import spaces_of
from simkit.errors import InvalidCheckpoint, MissingDependency
from simkit.models import ActorCritic, ModelSpec, numpy_actions
from simkit.models import build_model as build_from_spec
from simkit.registry import check_trusted, make, spec
from simkit.vector import MultiAgentVectorEnv, VectorEnv

__all__ = ["EvalKeywords", "evaluate_model", "evaluate_policy", "load_model", "make_vector"]


class EvalKeywords(TypedDict, total=False):
    """:func:`evaluate_model`'s keywords (its defaults), which :func:`evaluate_policy`
    passes on as they are."""

    episodes: int
    seed: int
    render: str | Path | None
    fps: int
    on_frame: Callable[[int, int], None] | None


def evaluate_policy(
    path: str | Path, *, trust: Collection[str] = (), **options: Unpack[EvalKeywords]
) -> np.ndarray:
    """Returns of ``episodes`` deterministic episodes of the policy at ``path``.

    ``path`` is a policy snapshot (``policy.safetensors``) or a checkpoint. For
    multi-agent envs every agent's episode counts as one. ``render`` writes a video
    (``.mp4``, ``.gif``: whatever ``imageio`` writes) of those episodes, rendered with
    ``render_mode="rgb_array"``, at ``fps`` frames per second; the returns are the same
    as without it (same envs, same seeds). ``options`` are :func:`evaluate_model`'s
    (:class:`EvalKeywords`).

    Raises:
        InvalidCheckpoint: ``path`` holds no valid policy.
        MissingDependency: ``render`` and imageio is not installed (``simkit[bench]``).
        RenderUnavailable: ``render`` and no OpenGL backend (MuJoCo envs; set
            ``MUJOCO_GL=egl`` or ``osmesa``).
        ValueError: ``render`` and the env is multi-agent or renders no RGB frames.
    """
    if options.get("render") is not None:
        from simkit._optional import require

        require("imageio", extra="bench", purpose="simkit eval --render")
    model, env_id, env_kwargs = load_model(path, trust=trust)
    return evaluate_model(model, env_id, env_kwargs=env_kwargs, **options)


def load_model(
    path: str | Path, *, trust: Collection[str] = ()
) -> tuple[ActorCritic, str, dict[str, Any]]:
    """The model saved at ``path`` (a policy snapshot, a checkpoint, or a run's log directory:
    its ``policy.safetensors``), the id of the env it acts in and that env's constructor
    arguments (the run's ``env_kwargs``). That id is data read from the file: one naming
    code to import (``package.module:Class``) is refused unless ``trust`` names it
    (:func:`simkit.registry.check_trusted`). The kwargs are data too: the env checks them
    as it would a command line's (sizes against the memory free).

    Raises:
        InvalidCheckpoint: ``path`` holds no valid policy, or env_kwargs its env refuses.
    """
    path = Path(path)
    is_logdir = (path / "policy.safetensors").is_file() and not (path / "manifest.json").exists()
    if path.is_dir() and is_logdir:  # a checkpoint directory holds a manifest
        path = path / "policy.safetensors"
    tensors, meta = load_policy(path)
    env_id = meta.get("env_id") if isinstance(meta, dict) else None
    if not isinstance(env_id, str):
        raise InvalidCheckpoint(f"{path}: the policy metadata names no env_id")
    check_trusted(env_id, trust, source=str(path))
    env_kwargs = meta.get("env_kwargs", {})
    if not isinstance(env_kwargs, dict) or not all(isinstance(k, str) for k in env_kwargs):
        raise InvalidCheckpoint(f"{path}: the policy metadata's env_kwargs is no str-keyed map")
    try:
        obs_space, act_space = spaces_of(env_id, env_kwargs)
    except (TypeError, ValueError, MemoryError) as exc:
        if not env_kwargs:
            raise
        shown = reprlib.repr(env_kwargs)
        raise InvalidCheckpoint(
            f"{path}: {env_id} cannot be made with the policy metadata's env_kwargs {shown}: {exc}"
        ) from exc
    try:
        model = build_from_spec(ModelSpec.from_plain(meta["model"]), obs_space, act_space)
    except (KeyError, TypeError, ValueError) as exc:  # UnknownModel is a KeyError
        raise InvalidCheckpoint(f"{path}: the policy metadata's model spec: {exc}") from exc
    # a checkpoint's tensors are its model.safetensors: name that file, not the folder given
    tensors_file = path if path.is_file() else resolve_checkpoint(path) / "model.safetensors"
    check_tensors(tensors_file, tensors, model.state_dict())
    model.load_state_dict(tensors)
    return model, env_id, env_kwargs


def _video_writer(env_id: str) -> Any:
    """imageio, for ``--render`` of ``env_id``, once it is known that the env can render
    RGB frames (single-agent, ``rgb_array`` among its ``render_modes``) before any is built.

    Raises:
        MissingDependency: imageio is not installed.
        ValueError: a multi-agent env, or one without ``rgb_array``.
    """
    from simkit._optional import require

    imageio = require("imageio", extra="bench", purpose="simkit eval --render")
    if spec(env_id).kind is EnvKind.MULTI_AGENT:
        raise ValueError(f"--render supports single-agent envs, got the multi-agent env {env_id!r}")
    metadata = getattr(spec(env_id).load(), "metadata", None)
    modes = metadata.get("render_modes") if isinstance(metadata, dict) else None
    if modes is not None and "rgb_array" not in modes:
        raise ValueError(
            f"env {env_id!r} cannot render RGB frames: its render_modes are {list(modes)}, "
            "without 'rgb_array'"
        )
    return imageio


def evaluate_model(
    model: ActorCritic,
    env_id: str,
    *,
    episodes: int = 10,
    seed: int = 0,
    render: str | Path | None = None,
    fps: int = 30,
    on_frame: Callable[[int, int], None] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """:func:`evaluate_policy` of a model in memory that acts in ``env_id`` (built with
    ``env_kwargs``, the run's); with ``render``,
    ``on_frame(frames, episodes_done)`` after every rendered frame (a progress report:
    software OpenGL renders a 1000-step episode in minutes)."""
    imageio = None if render is None else _video_writer(env_id)
    try:
        vector: Any = (
            make(env_id, num_envs=1, **dict(env_kwargs or {}))  # steps as a vector does
            if render is None and spec(env_id).kind is EnvKind.BATCH
            else make_vector(
                env_id,
                1,
                render_mode=None if render is None else "rgb_array",
                env_kwargs=env_kwargs,
            )
        )
    except ValueError as exc:
        if render is None:
            raise
        raise ValueError(f"env {env_id!r} cannot render RGB frames: {exc}") from exc
    with closing(vector):
        multi = isinstance(vector, MultiAgentVectorEnv)
        if isinstance(vector, MultiAgentVectorEnv):
            obs, mask, _ = vector.reset(seed=seed)
        else:
            obs, _ = vector.reset(seed=seed)
            mask = np.ones(1, dtype=np.bool_)
        frames: list[np.ndarray] = []

        def grab() -> None:
            try:
                frame = vector.envs[0].render()
            except NotImplementedError as exc:  # gymnasium's Env.render: no renderer
                raise ValueError(f"env {env_id!r} does not render (no render())") from exc
            except gymnasium.error.DependencyNotInstalled as exc:  # e.g. pygame
                raise MissingDependency(f"env {env_id!r} cannot render: {exc}") from exc
            if not isinstance(frame, np.ndarray) or frame.ndim != 3:
                raise ValueError(
                    f"env {env_id!r} renders no RGB frames with render_mode='rgb_array' "
                    f"(render() returned {type(frame).__name__})"
                )
            frames.append(frame)
            if on_frame is not None:
                on_frame(len(frames), len(out))

        ep = np.zeros(len(mask))
        out: list[float] = []
        if render is not None:
            grab()
        while len(out) < episodes:
            actions = numpy_actions(model.act(np.asarray(obs), deterministic=True).actions)
            if multi:
                step: Any = vector.step(actions)
                acted = step.acted
            else:
                step = vector.step_batch(actions)  # a single-agent vector or a BatchEnv
                acted = np.ones(1, dtype=np.bool_)
            ep += np.where(acted, step.reward, 0.0)
            for row in np.flatnonzero((step.terminated | step.truncated) & acted):
                out.append(float(ep[row]))
                ep[row] = 0.0
            obs = step.obs
            if render is not None and len(out) < episodes:
                grab()
            elif render is not None and on_frame is not None:
                on_frame(len(frames), len(out))  # the last episode's end
    if render is not None:
        _write_video(imageio, render, frames, fps)
    return np.asarray(out[:episodes])


def _write_video(imageio: Any, path: str | Path, frames: list[np.ndarray], fps: int) -> None:
    """Writes ``frames`` as the video ``path``.

    Raises:
        MissingDependency: imageio has no plugin for the format (for .mp4: ffmpeg).
    """
    try:
        from simkit.recording._cli import video_options

        imageio.mimwrite(str(path), frames, **video_options(path, fps))
    except ValueError as exc:  # imageio: no plugin writes this format
        first = str(exc).splitlines()[0]
        raise MissingDependency(
            f"{path}: imageio cannot write this video format ({first}); for .mp4 "
            "install the ffmpeg plugin: pip install 'simkit[bench]' (imageio[ffmpeg])"
        ) from exc


def make_vector(
    env_id: str,
    num_envs: int,
    num_threads: int = 1,
    *,
    render_mode: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> VectorEnv | MultiAgentVectorEnv:
    """The local vector of ``env_id`` (``gym:<id>`` builds the installed Gymnasium env).

    ``env_kwargs`` and ``render_mode`` (e.g. ``"rgb_array"``) are passed to every env's
    constructor.
    """
    kwargs: dict[str, Any] = dict(env_kwargs or {})
    kwargs |= {} if render_mode is None else {"render_mode": render_mode}
    kind = spec(env_id).kind
    if kind is EnvKind.MULTI_AGENT:
        return MultiAgentVectorEnv(env_id, num_envs, env_kwargs=kwargs)
    if kind is EnvKind.BATCH:
        raise ValueError(
            f"{env_id!r} is a batch env: a vector of single envs cannot hold it (it steps "
            f"as one: simkit.make({env_id!r}, num_envs=N))"
        )
    return VectorEnv(env_id, num_envs, num_threads=num_threads, env_kwargs=kwargs)
