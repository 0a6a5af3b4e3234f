"""The ``record``, ``replay`` and ``export`` subcommands (registered by :mod:`simkit.cli`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import warnings
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from simkit.registry import add_trust_argument

__all__ = ["COMMANDS", "existing_recording", "export_minari", "render_episode"]


def _record_configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help="a registered env id (see `simkit list`)")
    parser.add_argument(
        "--policy",
        default="random",
        help="'random' (uniform actions from a seeded space) or a PPO checkpoint / "
        "policy.safetensors path (actions sampled with a seeded torch generator)",
    )
    parser.add_argument("--episodes", type=int, required=True, help="episodes to record")
    parser.add_argument("--out", required=True, help="recording directory")
    parser.add_argument(
        "--num-envs", type=int, default=8, help="envs stepped together (8; all agents of each)"
    )
    parser.add_argument("--seed", type=int, default=0, help="root seed (0)")
    parser.add_argument(
        "--snapshot-every", type=int, default=0, help="env snapshot every K steps (0: none)"
    )
    parser.add_argument("--compression", choices=["zstd", "zlib", "none"], default=None)
    parser.add_argument(
        "--append",
        action="store_true",
        help="add the episodes to the recording already in --out (without it, an existing "
        "recording is refused)",
    )
    parser.add_argument(
        "--reproducible",
        action="store_true",
        help="pin the numeric kernels (OpenBLAS, numpy SIMD, MKL, oneDNN, PyTorch) to their "
        "AVX2 paths, so that the recording verifies on any x86-64 CPU (docs/recording.md)",
    )


def existing_recording(out: Path) -> str | None:
    """What ``out`` already holds, in words (``"3 episodes"``), or None when it holds no
    recording."""
    from simkit.errors import SimkitError
    from simkit.recording._format import chunk_paths
    from simkit.recording._io import RecordingReader

    if not out.is_dir() or not chunk_paths(out):
        return None
    try:
        return f"{len(RecordingReader(out))} episodes"
    except (SimkitError, OSError):
        return "chunk files"


def _record_run(args: argparse.Namespace) -> int:
    from simkit._kernels import is_pinned, reexec_pinned
    from simkit.errors import RecordingLocked, SimkitError
    from simkit.recording._wrapper import RecordEpisodes, RecordMultiAgentEpisodes
    from simkit.registry import EnvKind, make
    from simkit.registry import spec as env_spec
    from simkit.vector import MultiAgentVectorEnv, VectorEnv

    if args.reproducible and not is_pinned():
        reexec_pinned()  # the kernels are chosen when numpy (and torch) load
    if args.episodes <= 0:
        print("simkit record: --episodes must be > 0", file=sys.stderr)
        return 2
    if not 0 <= args.seed < 2**63:
        print(f"simkit record: --seed must be in [0, 2**63), got {args.seed}", file=sys.stderr)
        return 2
    try:
        _check_record_sizes(args)
    except ValueError as exc:
        print(f"simkit record: {exc}", file=sys.stderr)
        return 2
    held = None if args.append else existing_recording(Path(args.out))
    if held is not None:
        print(
            f"simkit record: --out {args.out} already holds a recording ({held}); add "
            "--append to add episodes to it, or choose another --out",
            file=sys.stderr,
        )
        return 2
    spec = env_spec(args.env_id)
    multi = spec.kind is EnvKind.MULTI_AGENT
    record: dict[str, Any] = {
        "env_id": args.env_id,
        "snapshot_every": args.snapshot_every,
        "max_episodes": args.episodes,
        "compression": args.compression,
    }
    env: Any
    if multi:  # (env, agent) rows; each env's episode is one multi-agent record
        vec: Any = MultiAgentVectorEnv(args.env_id, args.num_envs)
        rows = vec.num_rows
    elif spec.kind is EnvKind.BATCH:
        vec = make(args.env_id, num_envs=args.num_envs)
        rows = vec.num_envs
    else:
        vec = VectorEnv(args.env_id, args.num_envs)
        rows = vec.num_envs
    if args.policy == "random":
        space = vec.single_action_space
        space.seed(args.seed)

        def policy(obs: Any) -> Any:
            return np.stack([np.asarray(space.sample()) for _ in range(rows)])
    else:
        try:  # before the recording directory exists: nothing is left behind
            policy = _checkpoint_policy(args.policy, args.env_id, vec, args.seed)
        except (SimkitError, KeyError, ValueError) as exc:
            vec.close()
            print(f"simkit record: --policy {args.policy}: {exc}", file=sys.stderr)
            return 2
    try:
        wrapper = RecordMultiAgentEpisodes if multi else RecordEpisodes
        env = wrapper(vec, args.out, **record)
    except (RecordingLocked, OSError) as exc:  # locked, a read-only folder, a full disk
        vec.close()
        print(f"simkit record: {_write_error(args.out, exc)}", file=sys.stderr)
        return 1
    except ValueError as exc:  # settings the env cannot record (--snapshot-every, batch)
        vec.close()
        print(f"simkit record: {exc}", file=sys.stderr)
        return 2
    failed: BaseException | None = None
    interrupted = False
    try:
        obs = env.reset(seed=args.seed)[0]
        while env.writer.episodes_written < args.episodes:
            obs = (env.step(policy(obs)) if multi else env.step_batch(policy(obs))).obs
    except KeyboardInterrupt:  # Ctrl-C: close() below keeps every complete episode
        interrupted = True
    except OSError as exc:  # the writer's: every episode before it is kept whole
        failed = exc
    finally:
        try:
            env.close()
        except OSError as exc:
            failed = failed or exc
    if failed is not None:
        print(f"simkit record: {_write_error(args.out, failed)}", file=sys.stderr)
        return 1
    if interrupted:
        print(
            f"simkit record: interrupted; {env.writer.episodes_on_disk} complete episodes "
            f"kept in {args.out}",
            file=sys.stderr,
        )
        return 130
    print(
        f"recorded {env.writer.episodes_written} episodes of {args.env_id} into {args.out} "
        f"({env.writer.bytes_written / 1e6:.2f} MB)"
    )
    return 0


def _check_record_sizes(args: argparse.Namespace) -> None:
    """``--num-envs`` and ``--snapshot-every`` in range, and ``--num-envs`` envs within the
    memory available (``--num-envs 10**9`` grew by gigabytes before).

    Raises:
        ValueError: one line naming the flag.
    """
    from simkit._limits import ENV_BYTES, Range, check_memory, check_ranges

    check_ranges(
        [
            (Range("--num-envs", 1), args.num_envs),
            (Range("--snapshot-every", 0), args.snapshot_every),
        ]
    )
    check_memory(
        args.num_envs * ENV_BYTES,
        f"--num-envs {args.num_envs:,} (envs stepped together, at least "
        f"{ENV_BYTES >> 10} KiB each)",
        "fewer envs",
    )


def _write_error(out: str, exc: BaseException) -> str:
    """One line for a recording that could not be written (naming the path and errno)."""
    from simkit.errors import WriteFailed

    if isinstance(exc, OSError) and not isinstance(exc, WriteFailed):
        return str(WriteFailed(exc.filename or out, exc))
    return str(exc)


def _checkpoint_policy(path: str, env_id: str, vec: Any, seed: int) -> Any:
    """Sampled actions of the PPO policy at ``path`` (a checkpoint or ``policy.safetensors``)
    for ``vec`` of ``env_id``; another env's policy that does not fit is named as such."""
    import torch

    from simkit.clients.learners._checkpoint import check_tensors, load_policy
    from simkit.errors import SimkitError
    from simkit.models import ModelSpec, build_model, numpy_actions

    tensors, meta = load_policy(path)
    model = build_model(
        ModelSpec.from_plain(meta["model"]), vec.single_observation_space, vec.single_action_space
    )
    try:
        check_tensors(Path(path), tensors, model.state_dict())
    except SimkitError as exc:
        trained = meta.get("env_id")
        if isinstance(trained, str) and trained != env_id:
            raise type(exc)(f"a policy of {trained}, which does not fit {env_id}: {exc}") from exc
        raise
    model.load_state_dict(tensors)
    generator = torch.Generator().manual_seed(seed)

    def policy(obs: Any) -> Any:
        return numpy_actions(model.act(np.asarray(obs), generator=generator).actions)

    return policy


def _replay_configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="recording directory")
    parser.add_argument("--verify", action="store_true", help="re-simulate and check bit for bit")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="processes (default: cores)"
    )
    parser.add_argument("--render", metavar="OUT.mp4", help="render one episode to a video")
    parser.add_argument("--episode", type=int, default=0, help="episode to render (0)")
    parser.add_argument(
        "--recover", action="store_true", help="skip corrupted records instead of failing"
    )
    add_trust_argument(parser)


def _kernels_note(error: str | None, kernels: dict[str, Any] | None) -> str:
    """What follows a divergence on its ``FAIL`` line: that bits made under other kernels
    (``kernels``, the record's) may differ here, and how to record portably; ``""`` for
    a divergence the kernels do not explain (or another failure)."""
    from simkit._kernels import RECORD_PORTABLY, why_bits_may_differ

    why = why_bits_may_differ(kernels)
    if (
        why is None
        or error is None
        or not error.startswith("ReplayDivergence")
        or (" differs" not in error)
    ):
        return ""
    return f" -- bits may differ on this CPU: the recording was {why}; {RECORD_PORTABLY}"


def _replay_run(args: argparse.Namespace) -> int:
    from simkit._kernels import is_pinned, reexec_pinned
    from simkit.errors import CorruptRecording, MissingDependency, RenderUnavailable
    from simkit.recording._io import RecordingReader
    from simkit.recording._replay import verify_recording

    if not (args.verify or args.render):
        print("simkit replay: give --verify and/or --render OUT.mp4", file=sys.stderr)
        return 2
    from simkit._limits import Range, check_ranges, max_threads

    try:
        check_ranges(
            [
                (Range("--workers", 1, max_threads()), args.workers),
                (Range("--episode", 0), args.episode),
            ]
        )
    except ValueError as exc:
        print(f"simkit replay: {exc}", file=sys.stderr)
        return 2
    try:
        reader = RecordingReader(args.directory, recover=args.recover)
    except (CorruptRecording, FileNotFoundError) as exc:
        print(f"simkit replay: {exc}", file=sys.stderr)
        return 1
    for s in reader.skipped:
        print(f"skipped {s.nbytes} bytes of {s.path} at offset {s.offset}: {s.reason}")
    if len(reader) == 0:
        print(
            f"simkit replay: {args.directory} holds no recorded episode (not a recording, "
            "or nothing complete was written)",
            file=sys.stderr,
        )
        return 1
    status = 0
    if args.verify:
        stats = reader.stats()
        if any(s.kernels and s.kernels["reproducible"] for s in stats) and not is_pinned():
            reexec_pinned()  # recorded under the pinned kernels: replayed under them
        results = verify_recording(reader, workers=args.workers, trust=args.trust)
        failed = [r for r in results if r.error is not None]
        for r in failed:
            print(f"FAIL {r.error}{_kernels_note(r.error, stats[r.position].kernels)}")
        steps = sum(r.length for r in results if r.error is None)
        print(
            f"{len(results) - len(failed)}/{len(results)} episodes replayed bit for bit "
            f"({steps} steps)"
        )
        status = 1 if failed else 0
    if args.render:
        try:
            frames = render_episode(reader, args.episode, args.render, trust=args.trust)
        except (MissingDependency, RenderUnavailable, IndexError, ValueError, KeyError) as exc:
            print(f"simkit replay: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {frames} frames of episode {args.episode} to {args.render}")
    return status


def render_episode(
    reader: Any, position: int, out: str, *, fps: int = 30, trust: Collection[str] = ()
) -> int:
    """Re-simulates episode ``position`` with ``render_mode="rgb_array"`` into a video.

    Raises:
        MissingDependency: imageio (or, for a video file, imageio-ffmpeg) is not
            installed (``simkit[bench]``).
        RenderUnavailable: no OpenGL backend.
        ValueError: the episode has no seed or is not of a single-instance env (batch
            and multi-agent episodes are not rendered).
    """
    import gymnasium

    from simkit._optional import require
    from simkit.errors import MissingDependency
    from simkit.recording._tracker import row_of as _row
    from simkit.registry import trusted_make

    imageio = require("imageio", extra="bench", purpose="simkit replay --render")
    if out.lower().endswith((".mp4", ".mkv", ".mov", ".avi", ".webm")):
        # imageio writes video containers through its ffmpeg plugin only.
        require("imageio_ffmpeg", extra="bench", purpose=f"simkit replay --render {out}")
    if not 0 <= position < len(reader):
        raise IndexError(f"--episode must be in [0, {len(reader)}), got {position}")
    from simkit.recording._episode import Episode

    episode = reader.load(position)
    if (
        not isinstance(episode, Episode)
        or episode.seed is None
        or episode.origin.get("kind") == "batch"
    ):
        raise ValueError("rendering needs a seeded single-instance episode")
    kwargs = {"render_mode": "rgb_array", **episode.env_kwargs}
    env = trusted_make(episode.env_id, trust, source="the recording", **kwargs)
    env.reset(seed=episode.seed, options=episode.options)
    try:
        frames = [env.render()]
    except NotImplementedError as exc:  # gymnasium's Env.render: no renderer
        env.close()
        raise ValueError(f"{episode.env_id} does not render (no render())") from exc
    except gymnasium.error.DependencyNotInstalled as exc:  # e.g. pygame
        env.close()
        raise MissingDependency(f"{episode.env_id} cannot render: {exc}") from exc
    for t in range(episode.length):
        env.step(_row(episode.actions, t))
        frames.append(env.render())
    env.close()
    imageio.mimwrite(out, frames, **video_options(out, fps))
    return len(frames)


def video_options(out: str | Path, fps: int) -> dict[str, Any]:
    """imageio's writer options for ``fps`` frames per second: a GIF (Pillow's writer) takes
    the time per frame in ms and refuses ``fps``; the video containers take ``fps``."""
    if str(out).lower().endswith(".gif"):
        return {"duration": 1000.0 / fps, "loop": 0}
    return {"fps": fps}


def _export_configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--minari",
        nargs=2,
        metavar=("DIR", "NAME"),
        required=True,
        help="export recording DIR as the Minari dataset NAME (e.g. simkit/cartpole-random-v0)",
    )
    add_trust_argument(parser)


def _export_run(args: argparse.Namespace) -> int:
    from simkit.errors import CorruptRecording, MissingDependency

    directory, name = args.minari
    try:
        count, where = export_minari(directory, name, trust=args.trust)
    except (MissingDependency, ValueError, FileNotFoundError, CorruptRecording, KeyError) as exc:
        print(f"simkit export: {exc}", file=sys.stderr)
        return 1
    print(f"exported {count} episodes to the Minari dataset {name!r} in {where}")
    return 0


def export_minari(
    directory: str, dataset_id: str, *, trust: Collection[str] = ()
) -> tuple[int, Path]:
    """Writes every episode of ``directory`` as the Minari dataset ``dataset_id``.

    Observations, actions, rewards and flags are exported with each episode's seed and
    reset options; infos stay in the recording. Everything is checked before the
    dataset is created, and a dataset half made by a failure is removed. Returns the
    number of episodes and the dataset's directory.

    Raises:
        MissingDependency: minari is not installed (``simkit[minari]``).
        FileNotFoundError: ``directory`` does not exist.
        ValueError: a dataset id Minari refuses (``[namespace/]name-vN``) or one that
            exists already; a recording that is empty, mixes env ids or holds
            multi-agent episodes (a Minari dataset holds single-agent episodes).
    """
    from simkit._optional import require
    from simkit.recording._episode import Episode
    from simkit.recording._io import RecordingReader

    minari = require("minari", extra="minari", purpose="simkit export --minari")
    from minari.data_collector import EpisodeBuffer  # type: ignore[import-untyped, import-not-found, unused-ignore]  # optional, no stubs
    from minari.dataset.minari_dataset import DATASET_ID_RE  # type: ignore[import-untyped, import-not-found, unused-ignore]  # optional, no stubs
    from minari.storage import get_dataset_path  # type: ignore[import-untyped, import-not-found, unused-ignore]  # optional, no stubs

    from simkit._version import __version__
    from simkit.registry import check_trusted, make

    if not re.fullmatch(r"(?:[\w-]+/)?[\w-]+-v\d+", dataset_id) or not DATASET_ID_RE.fullmatch(
        dataset_id
    ):
        raise ValueError(
            f"Minari dataset ids look like [namespace/]name-vN (e.g. cartpole/random-v0), "
            f"got {dataset_id!r}"
        )
    target = Path(get_dataset_path(dataset_id))
    if target.exists():
        raise ValueError(f"the Minari dataset {dataset_id!r} exists already ({target})")
    reader = RecordingReader(directory)
    if len(reader) == 0:
        raise ValueError(f"{directory} holds no recorded episode (not a recording?)")
    ids = {s.env_id for s in reader.stats()}
    if len(ids) != 1:
        raise ValueError(f"a Minari dataset holds one env; {directory} holds {sorted(ids)}")
    env_id = ids.pop()
    check_trusted(env_id, trust, source=f"the recording {directory}")
    buffers = []
    for k, ep in enumerate(reader):
        if not isinstance(ep, Episode):
            raise ValueError(
                f"a Minari dataset holds single-agent episodes; episode {k} of {directory} "
                f"is a multi-agent episode of {ep.env_id}"
            )
        buffers.append(
            EpisodeBuffer(
                id=k,
                seed=ep.seed,
                options=ep.options,
                observations=_to_lists(ep.obs),
                actions=_to_lists(ep.actions),
                rewards=ep.rewards.tolist(),
                terminations=ep.terminated.tolist(),
                truncations=ep.truncated.tolist(),
                infos={},
            )
        )
    probe = make(env_id, **(reader.load(0).env_kwargs if len(reader) else {}))
    try:
        obs_space = getattr(probe, "single_observation_space", probe.observation_space)
        act_space = getattr(probe, "single_action_space", probe.action_space)
    finally:
        probe.close()
    gym_spec = _gymnasium_spec(env_id)
    with warnings.catch_warnings(), _removed_on_failure(target):
        # minari nags about missing author e-mail / permalinks; the dataset is complete.
        warnings.filterwarnings("ignore", category=UserWarning, module="minari")
        minari.create_dataset_from_buffers(
            dataset_id,
            buffers,
            env=gym_spec,
            eval_env=gym_spec,
            observation_space=obs_space,
            action_space=act_space,
            algorithm_name="simkit record",
            code_permalink=f"simkit {__version__}: simkit export --minari",
            author="simkit",
            description=f"{env_id} exported from the simkit recording {directory}",
        )
    return len(buffers), target


def _gymnasium_spec(env_id: str) -> Any:
    """Gymnasium's spec of the env ``env_id`` names, for the dataset to recover it: ``gym:<id>``
    is Gymnasium's ``<id>``, a single-agent simkit id is registered there too; None for an env
    Gymnasium does not know (multi-agent, batched, an unregistered ``module:Class``)."""
    import gymnasium as gym

    from simkit.registry import GYM_PREFIX, EnvKind, spec

    if env_id.startswith(GYM_PREFIX):
        return gym.spec(env_id[len(GYM_PREFIX) :])
    if spec(env_id).kind is not EnvKind.SINGLE:
        return None
    try:
        return gym.spec(env_id)
    except gym.error.Error:
        return None


@contextlib.contextmanager
def _removed_on_failure(path: Path) -> Iterator[None]:
    """Removes ``path`` (which did not exist) if the block fails: nothing half made."""
    try:
        yield
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def _to_lists(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_lists(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_to_lists(v) for v in tree)
    return np.array(tree)


#: ``(name, help, configure, run)`` of each subcommand, for :func:`simkit.cli.add_command`.
COMMANDS: list[tuple[str, str, Any, Any]] = [
    ("record", "record episodes of an env into a directory", _record_configure, _record_run),
    (
        "replay",
        "verify (bit for bit) or render a recording (see docs/recording.md)",
        _replay_configure,
        _replay_run,
    ),
    ("export", "export a recording (to Minari)", _export_configure, _export_run),
]
