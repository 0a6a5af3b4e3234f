"""``simkit train`` and ``simkit eval``: the command lines over :mod:`simkit.clients.learners._train`.

The PPO flags come from :class:`~simkit.clients.learners.ppo.PPOArgs` itself (one flag per
field, its default shown in ``--help``), and every value is checked before anything
starts (:meth:`PPOArgs.check`, and the run settings here). A flag that is not given is
``None`` here, which is how ``--resume`` tells what the command line asks for from
what the checkpoint holds: only flags given are compared with the checkpoint
(:func:`~simkit.clients.learners._train.resume_args`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simkit._argtypes import ENV_ID_FORMS, integer
from simkit._kernels import is_pinned, reexec_pinned, why_bits_may_differ
from simkit.clients.learners._args import DEFAULT_SERVERS, PPOArgs, SACArgs, capped, refuse_unless
from simkit.errors import (
    InvalidCheckpoint,
    MissingDependency,
    RenderUnavailable,
    ServersLost,
    ServerStartFailed,
    UnknownEnv,
    WriteFailed,
)
from simkit.registry import add_trust_argument

if TYPE_CHECKING:
    from simkit.clients.learners._train import TrainResult
    from simkit.recording._format import DirectoryLock

__all__ = ["add_train_arguments", "run_train", "add_eval_arguments", "run_eval"]

_HELP: dict[str, str] = {
    "total_steps": "env steps to train, in whole updates rounded down (at least one update; "
    "--algo sac: whole rounds, rounded up); the start says where it stops; 0 = until stopped",
    "num_envs": "env slots (multi-agent: rows are slots x agents); unset: at least one per "
    "rollout server (--servers, --connect)",
    "num_steps": "steps per env slot per update, T (the fragment length)",
    "seed": "seeds the model, the envs, the sampling noise and the minibatch order",
    "hidden": "hidden layer sizes of the policy and value MLPs",
    "mode": "sync (on-policy, reproducible) or async (bounded policy lag)",
    "max_lag": "async: drop fragments older than this many policy versions",
    "env_threads": "threads stepping the envs (MuJoCo releases the GIL)",
    "torch_threads": "torch intra-op threads of the learner",
    "compile": "torch.compile the minibatch loss (a one-off compile, then a cheaper update)",
    "cuda_graph": "on a CUDA --device, replay the learner's step as a CUDA graph (off: the "
    "same step eagerly, same bits; no effect on the CPU)",
    "device": "the learner's torch device for the update: cpu, cuda[:k] or auto (the faster "
    "of the CPU and CUDA for this run's update step, timed at start; the CPU without CUDA)",
    "env_kwargs": "constructor argument of the envs of the rollouts the run starts (in "
    "process, --servers, --ray; not --connect), "
    "VALUE as JSON or else a string (repeatable; e.g. backend=mjwarp; on --resume the "
    "checkpoint's)",
    "device_loop": "the whole loop on --device (a batch env with device-resident steps, "
    "--servers 0, sync): on, off, or auto (on where --device is not the CPU and the run can)",
    "buffer_size": "replay buffer capacity in transitions",
    "learning_starts": "transitions in the buffer before the first gradient step "
    "(the servers act uniformly at random until then)",
    "utd": "update-to-data ratio: gradient steps per env step (sync: exact; async: a "
    "target, the achieved ratio is reported)",
    "push_every": "async: gradient steps between weight pushes",
    "policy_frequency": "actor and entropy updates: this many, every this many gradient steps",
    "autotune": "tune the entropy coefficient towards entropy -dim(A)",
}

_SAC_ONLY = [f.name for f in dataclasses.fields(SACArgs) if not hasattr(PPOArgs(), f.name)]
_PPO_ONLY = [f.name for f in dataclasses.fields(PPOArgs) if not hasattr(SACArgs(), f.name)]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """``simkit train`` options: every :class:`PPOArgs` field, then the run's settings."""
    parser.add_argument(
        "env_id", help=f"the env to train on (single-agent, multi-agent or batch): {ENV_ID_FORMS}"
    )
    parser.add_argument(
        "--algo",
        choices=("ppo", "sac"),
        default=None,
        help="ppo (on-policy) or sac (off-policy, replay buffer; continuous actions) "
        "(default: ppo; with --resume the checkpoint's)",
    )
    _add_hyperparameters(parser)
    _add_run_options(parser)
    _add_server_options(parser)


def _add_hyperparameters(parser: argparse.ArgumentParser) -> None:
    """Every :class:`PPOArgs` field (shared with SAC unless PPO's alone), then SAC's own."""
    d = PPOArgs()
    sac_d = SACArgs()
    ppo = parser.add_argument_group(
        "PPO, and shared with SAC (a flag not given keeps the checkpoint's on --resume)"
    )
    sac = parser.add_argument_group("SAC only (--algo sac)")
    sac_fields = [g for g in dataclasses.fields(SACArgs) if g.name in _SAC_ONLY]
    for f in [*dataclasses.fields(PPOArgs), *sac_fields]:
        if f.name == "env_id":
            continue
        group = sac if f.name in _SAC_ONLY else ppo
        default = getattr(sac_d if f.name in _SAC_ONLY else d, f.name)
        help_ = f"{_HELP.get(f.name, 'hyperparameter')} (default: {default}"
        shared = f.name not in _SAC_ONLY and f.name not in _PPO_ONLY
        if shared and getattr(sac_d, f.name) != default:
            help_ += f"; SAC: {getattr(sac_d, f.name)}"
        help_ += ")"
        if isinstance(default, bool):
            group.add_argument(
                _flag(f.name),
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_,
            )
        elif isinstance(default, tuple):
            group.add_argument(_flag(f.name), type=integer, nargs="+", default=None, help=help_)
        elif f.name == "mode":
            group.add_argument(_flag(f.name), choices=("sync", "async"), default=None, help=help_)
        elif f.name == "device_loop":
            group.add_argument(
                _flag(f.name), choices=("auto", "on", "off"), default=None, help=help_
            )
        elif f.name == "env_kwargs":  # simkit serve's flag, parsed by its parser
            group.add_argument(
                "--env-kwarg",
                dest="env_kwargs",
                action="append",
                default=None,
                metavar="KEY=VALUE",
                help=_HELP[f.name] + ")",
            )
        else:  # counts take 1_000_000 and 1e6 too
            kind = integer if isinstance(default, int) else type(default)
            group.add_argument(_flag(f.name), type=kind, default=None, help=help_)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """Checkpoints, resume, log directory, progress and metrics."""
    run = parser.add_argument_group("run")
    run.add_argument(
        "--checkpoint-every",
        type=integer,
        default=10,
        help="checkpoint every K updates; 0: only by time and at the end (default: 10)",
    )
    run.add_argument(
        "--checkpoint-steps",
        type=integer,
        default=100_000,
        help="--algo sac: also checkpoint (with the replay buffer) every N env steps; 0: not "
        "by steps. SAC also checkpoints once learning starts, then by time so that a crash "
        "loses at most about half the run (docs/offpolicy.md) (default: 100000)",
    )
    run.add_argument(
        "--buffer-from",
        default=None,
        metavar="DIR",
        help="--algo sac: fill the replay buffer with the episodes recorded in DIR "
        "(`simkit record` / --record) before the first update",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="--algo sac: serve the learner's Prometheus metrics on this port (0: any free "
        "one; rules: docs/alerts.yml)",
    )
    run.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=5.0,
        help="also checkpoint when this many minutes passed since the last one (--algo "
        "sac: at most this many apart, sooner early in a run); 0: never by time (default: 5)",
    )
    run.add_argument(
        "--resume",
        default=None,
        help="continue the run of this checkpoint, its checkpoints/ folder or its log "
        "directory (in that directory unless --logdir says otherwise)",
    )
    run.add_argument("--logdir", default=None, help="default: runs/<env>-<seed>-<time>")
    run.add_argument(
        "--reproducible",
        action="store_true",
        help="pin the numeric kernels (OpenBLAS, numpy SIMD, MKL, oneDNN, PyTorch) of the "
        "learner and of every server it starts to their AVX2 paths, so the same seed gives "
        "the same parameters on any x86-64 CPU (docs/training.md)",
    )
    run.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress bar (without a terminal: plain lines, see --print-every)",
    )
    run.add_argument(
        "--print-every",
        type=float,
        default=10.0,
        help="seconds between plain progress lines when stdout is not a terminal (default: 10)",
    )


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    """Where the fragments come from: local servers, running ones, Ray; the recorder."""
    servers = parser.add_argument_group("rollout servers")
    servers.add_argument(
        "--connect",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="stream from a running `simkit serve ENV --policy` (repeatable)",
    )
    servers.add_argument(
        "--servers",
        type=integer,
        default=None,
        help="start this many local `simkit serve` processes and stream from them; 0 "
        f"rolls out in process (default: {DEFAULT_SERVERS}, --algo sac: 0; with --resume as "
        "many as the checkpoint streamed from)",
    )
    servers.add_argument(
        "--wait-for-servers",
        action="store_true",
        help="when a server stops answering, wait for it to come back on its endpoint "
        "(instead of going on with the others)",
    )
    servers.add_argument(
        "--record",
        default=None,
        metavar="DIR",
        help="record every episode of the fragment stream, with the policy version of "
        "every step, into DIR (replay with `simkit replay DIR --verify`)",
    )
    servers.add_argument(
        "--server-timeout",
        type=float,
        default=30.0,
        help="seconds before a silent server is dropped (default: 30)",
    )
    servers.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="launch the --servers as Ray actors (pip install 'simkit[ray]') on the cluster "
        "at ADDRESS (none: a local Ray instance); Ray restarts a dead server and the run "
        "continues with it (exactly, in sync mode)",
    )
    servers.add_argument(
        "--server-cpus", type=float, default=1.0, help="--ray: CPUs reserved per server (1)"
    )
    servers.add_argument(
        "--server-gpus",
        type=float,
        default=0.0,
        help="--ray: GPUs reserved per server, fractional allowed (1: one server per GPU) (0)",
    )
    servers.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="--ray: times Ray restarts a dead server; -1: always (default: 3)",
    )


def given_settings(ns: argparse.Namespace, cls: type[Any] = PPOArgs) -> dict[str, Any]:
    """The ``cls`` (PPOArgs or SACArgs) fields the command line set (not None)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "env_id":
            continue
        value = getattr(ns, f.name, None)
        if value is None:
            continue
        if f.name == "env_kwargs":
            from simkit.servers._cli import parse_env_kwargs

            out[f.name] = parse_env_kwargs(value)
        else:
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out


SERVER_BYTES = 256 << 20
"""About what one local ``simkit serve --policy`` process takes (~230 MiB resident with
torch loaded): ``--servers N`` needs N times it free."""
MAX_RAY_SERVERS = 4096
"""The most ``--servers`` on Ray (or ``--connect`` endpoints): a cluster's, not this
machine's, memory holds them."""


def check_run_settings(ns: argparse.Namespace, num_envs: int) -> None:
    """The run's own numeric settings, checked before anything starts.

    Raises:
        ValueError: a value out of range, naming the flag, what it must be and what came.
    """
    from simkit._limits import Range, check_memory, check_ranges, max_threads

    local_servers = MAX_RAY_SERVERS if ns.ray is not None else max_threads()
    check_ranges(
        [
            (Range("--checkpoint-every", 0), ns.checkpoint_every),
            (Range("--checkpoint-minutes", 0, 10**7), ns.checkpoint_minutes),
            (Range("--print-every", 0, 10**7, low_open=True), ns.print_every),
            (Range("--server-timeout", 0, 7 * 24 * 3600, low_open=True), ns.server_timeout),
            (Range("--server-cpus", 0, 1 << 16), ns.server_cpus),
            (Range("--server-gpus", 0, 1 << 10), ns.server_gpus),
            (Range("--max-restarts", -1), ns.max_restarts),
            (Range("--servers", 0, local_servers, optional=True), ns.servers),
            (
                Range("--connect", 0, MAX_RAY_SERVERS, what="given at most 4096 times"),
                len(ns.connect),
            ),
        ]
    )
    if ns.servers and ns.ray is None:
        check_memory(
            ns.servers * SERVER_BYTES,
            f"--servers {ns.servers} (a local process each, about {SERVER_BYTES >> 20} MiB)",
        )
    count = (ns.servers or 0) + len(ns.connect)
    if count > num_envs:
        raise ValueError(
            f"{count} server(s) need at least one env slot each: --num-envs must be >= "
            f"{count}, got {num_envs}"
        )


def resumed_logdir(resume: str | Path) -> Path:
    """The log directory of the run a ``--resume`` path (``resume=`` of
    :func:`simkit.train`) belongs to: the checkpoint's, its folder's, or the path."""
    path = Path(resume)
    for candidate in (path, *path.parents):
        if candidate.name == "checkpoints":
            return candidate.parent
        if (candidate / "checkpoints").is_dir():
            return candidate
    return path


_resumed_logdir = resumed_logdir


def _settings(ns: argparse.Namespace) -> PPOArgs | SACArgs:
    """The run's settings: the command line's flags over the defaults of ``--algo``, or
    over the checkpoint's with ``--resume``; checked.

    Raises:
        ValueError / TypeError / InvalidCheckpoint: one line for the person.
    """
    ckpt = None
    if ns.resume is not None:  # --algo defaults to the checkpoint's
        from simkit.clients.learners._checkpoint import checkpoint_algo, load_checkpoint

        ckpt = load_checkpoint(ns.resume)
        ns.resumed_kernels = ckpt.state.get("kernels")  # None: from before they were kept
        algo = checkpoint_algo(ckpt)
        if ns.algo not in (None, algo):
            raise ValueError(f"--resume {ns.resume}: a {algo} checkpoint; use --algo {algo}")
        ns.algo = algo
    ns.algo = ns.algo or "ppo"
    sac = ns.algo == "sac"
    cls: type[PPOArgs] | type[SACArgs] = SACArgs if sac else PPOArgs
    _refuse_other_algo(ns, _PPO_ONLY if sac else _SAC_ONLY, "ppo" if sac else "sac")
    given = given_settings(ns, cls)
    slots = (ns.servers or 0) + len(ns.connect)  # every server needs an env slot
    if ns.resume is None and "num_envs" not in given and slots > cls.num_envs:
        given["num_envs"] = slots
    args: PPOArgs | SACArgs
    if ckpt is not None:
        from simkit.clients.learners._checkpoint import checkpoint_args

        parse: Callable[[Any], PPOArgs | SACArgs] = cls.from_plain
        saved = checkpoint_args(ckpt, parse)
        if ns.env_id != saved.env_id:
            raise ValueError(
                f"--resume: the checkpoint trains {saved.env_id!r}, the command line "
                f"names {ns.env_id!r}"
            )
        args = dataclasses.replace(saved, **given)
    else:
        args = dataclasses.replace(cls(env_id=ns.env_id), **given)
    if isinstance(args, SACArgs):
        args.check_learning_starts()  # as asked: the cap shortens runs for the docs' tests
    args = capped(args)  # $SIMKIT_MAX_TOTAL_STEPS, where set
    args.check()
    check_run_settings(ns, args.num_envs)
    if sac:
        refuse_unless(
            [
                ("--checkpoint-steps", ns.checkpoint_steps, ns.checkpoint_steps >= 0, ">= 0"),
                (
                    "--metrics-port",
                    ns.metrics_port,
                    ns.metrics_port is None or 0 <= ns.metrics_port < 65536,
                    "a port in [0, 65535]",
                ),
            ]
        )
        from simkit.clients.learners._train_sac import check_env

        check_env(args.env_id)
    return args


def run_train(ns: argparse.Namespace) -> int:
    """Runs ``simkit train``; SIGINT/SIGTERM checkpoint and exit 0; bad input is one line
    on stderr and exit 2 before anything starts. The log directory is locked while the
    run writes it (:func:`claim_logdir`)."""
    locks: list[LogdirLock] = []
    try:
        return _run_train(ns, locks)
    finally:
        for lock in locks:
            lock.release()


_RUN_OUTPUTS = ("progress.jsonl", "checkpoints", "policy.safetensors")
"""What a run that trained leaves in its log directory (a log directory holding none of
them holds no run)."""
_LEFTOVERS = (*_RUN_OUTPUTS, "tb", "prometheus_targets.json")
"""What a run writes into its log directory: cleared when a run that died before its
first checkpoint is started over there."""


class LogdirLock:
    """A claimed log directory (:func:`claim_logdir`): its one-writer lock, and what the
    claim made. :meth:`release` unlocks it and, where the run left no output there
    (refused, failed to start, interrupted before training), removes what the claim
    made: no empty log directory (nor a lone ``LOCK``) is left behind.

    Attributes:
        reused: the directory held a run that died before its first checkpoint; its
            outputs were cleared and this run starts over there.
    """

    def __init__(
        self, lock: DirectoryLock, logdir: Path, made: Path | None, had_lock: bool
    ) -> None:
        self.lock = lock
        self.logdir = logdir
        self.made = made
        self.had_lock = had_lock
        self.reused = False

    def release(self) -> None:
        """Unlocks (idempotent); removes the folders the claim made, or the ``LOCK`` it
        added, when the run left no output there."""
        self.lock.release()
        if any((self.logdir / name).exists() for name in _RUN_OUTPUTS):
            return
        if self.made is not None:
            shutil.rmtree(self.logdir, ignore_errors=True)
            folder = self.logdir.parent  # the parents the claim made, while they are empty
            while self.logdir != self.made and folder != self.made.parent:
                try:
                    folder.rmdir()  # never a sibling another run made meanwhile
                except OSError:
                    break
                folder = folder.parent
        elif not self.had_lock:
            with contextlib.suppress(OSError):
                (self.logdir / "LOCK").unlink()


def _first_missing(path: Path) -> Path | None:
    """The topmost folder of ``path`` that does not exist yet (what ``mkdir -p`` makes)."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def died_before_first_checkpoint(logdir: Path) -> bool:
    """Whether ``logdir`` holds the outputs of a run that was killed before it wrote a
    complete checkpoint: nothing to resume, so a run may start over there."""
    from simkit.clients.learners._checkpoint import resolve_checkpoint

    if not logdir.is_dir() or not any((logdir / name).exists() for name in _RUN_OUTPUTS):
        return False
    try:
        resolve_checkpoint(logdir)
    except InvalidCheckpoint:
        pass
    else:
        return False  # a checkpoint (or its latest pointer) is there
    folder = logdir / "checkpoints"
    return not (
        folder.is_dir()
        and any((d / "manifest.json").is_file() for d in folder.iterdir() if d.is_dir())
    )


def _clear_leftovers(logdir: Path) -> None:
    """Removes what a run that died before its first checkpoint wrote in ``logdir``."""
    for name in _LEFTOVERS:
        path = logdir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def claim_logdir(logdir: Path, resume: str | None = None, *, python: bool = False) -> LogdirLock:
    """Makes and locks the run's log directory (the recorder's one-writer lock), and
    refuses one that holds another run unless this run resumes it: two runs in one
    directory would interleave ``progress.jsonl`` and overwrite each other's checkpoints.
    A directory whose run died before its first checkpoint holds nothing to resume: its
    outputs are cleared and the run starts over there (:attr:`LogdirLock.reused`).

    ``python``: word the refusal of a directory that holds a run for
    :func:`simkit.train` (its ``resume=`` keyword) instead of the command line.

    Raises:
        RecordingLocked: another process writes there.
        ValueError: it holds a run and this one does not ``--resume`` it (or it cannot
            be made, written or locked).
    """
    from simkit.clients.learners._run_parts import prepare_logdir
    from simkit.recording._format import DirectoryLock

    try:
        made = _first_missing(logdir)
        had_lock = (logdir / "LOCK").exists()
    except OSError as exc:  # a name too long for the file system
        raise ValueError(f"--logdir {str(logdir)[:200]}: {WriteFailed.reason(exc)}") from exc
    prepare_logdir(logdir)
    try:
        lock = DirectoryLock(
            logdir,
            what="log directory",
            advice="one run per log directory (pick another --logdir or stop it)",
        )
    except OSError as exc:  # LOCK is a folder, or cannot be opened
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise ValueError(
            f"--logdir {logdir}: cannot lock {logdir / 'LOCK'}: {WriteFailed.reason(exc)}"
        ) from exc
    claim = LogdirLock(lock, logdir, made, had_lock)
    resumes = resume is not None and _resumed_logdir(resume).resolve() == logdir.resolve()
    if not resumes and ((logdir / "checkpoints").is_dir() or (logdir / "progress.jsonl").exists()):
        if died_before_first_checkpoint(logdir):
            try:
                _clear_leftovers(logdir)
            except OSError as exc:
                lock.release()
                raise ValueError(
                    f"--logdir {logdir}: cannot clear the run that died there before its "
                    f"first checkpoint: {WriteFailed.reason(exc)}"
                ) from exc
            claim.reused = True
            return claim
        lock.release()
        if python:
            raise ValueError(
                f"logdir {str(logdir)!r} holds a run already ({_run_in(logdir)}): continue it "
                f"with simkit.train(..., resume={str(logdir)!r}), or choose another logdir"
            )
        raise ValueError(
            f"--logdir {logdir} holds a run already ({_run_in(logdir)}): continue it with "
            f"--resume {logdir}, or choose another --logdir"
        )
    return claim


def _run_in(logdir: Path) -> str:
    """The run a log directory holds, in words: its env and env steps where its latest
    checkpoint says them."""
    from simkit.clients.learners._checkpoint import load_checkpoint

    try:
        state = load_checkpoint(logdir).state
        counters = state.get("counters", state)
        return f"{state['args']['env_id']}, {int(counters['global_step']):,} env steps"
    except (InvalidCheckpoint, FileNotFoundError, KeyError, TypeError, ValueError):
        return "progress.jsonl" if (logdir / "progress.jsonl").exists() else "checkpoints/"


def _start_again(ns: argparse.Namespace, exc: Exception) -> str:
    """What to do about a ``--resume`` of a run that died before its first checkpoint:
    start it again without ``--resume`` (its log directory is reused); else ``""``.
    (Not from scratch under ``--resume``: its settings died with it, and the resume
    command's defaults would train another run.)"""
    if not isinstance(exc, InvalidCheckpoint) or ns.resume is None:
        return ""
    logdir = _resumed_logdir(ns.resume)
    if not died_before_first_checkpoint(logdir):
        return ""
    return (
        "; nothing to resume: start the run again (its command without --resume, with "
        f"--logdir {logdir}: the folder is reused)"
    )


def _run_train(ns: argparse.Namespace, locks: list[LogdirLock]) -> int:
    """:func:`run_train`, holding its log directory's lock in ``locks``."""
    from simkit.errors import RecordingLocked
    from simkit.recording._format import DirectoryLock

    try:
        args = _settings(ns)
        from simkit.clients.learners._sizes import check_run_memory

        # one env made with the run's kwargs, and what the run allocates against free memory
        check_run_memory(args, in_process=not ns.connect and ns.ray is None and not ns.servers)
    except (InvalidCheckpoint, ValueError, TypeError) as exc:
        print(f"simkit train: {exc}{_start_again(ns, exc)}", file=sys.stderr)
        return 2
    _pin_kernels(ns)
    if ns.record is not None and not ns.resume:
        from simkit.recording._cli import existing_recording

        held = existing_recording(Path(ns.record))
        if held is not None:
            print(
                f"simkit train: --record {ns.record} already holds a recording ({held}); "
                "choose another DIR, or --resume the run that wrote it (its episodes go on "
                "there)",
                file=sys.stderr,
            )
            return 2
    logdir = _logdir(ns, args)
    try:
        locks.append(claim_logdir(logdir, ns.resume))
        if ns.record is not None and Path(ns.record).is_dir():  # another writer: now, not
            DirectoryLock(Path(ns.record)).release()  # once the servers run
    except (ValueError, WriteFailed) as exc:
        print(f"simkit train: {exc}", file=sys.stderr)
        return 2
    except RecordingLocked as exc:
        print(f"simkit train: {exc}", file=sys.stderr)
        return 1
    if locks[-1].reused:
        print(
            f"simkit train: --logdir {logdir} held a run that stopped before its first "
            "checkpoint (nothing to resume); starting a new run there",
            file=sys.stderr,
        )
    from simkit.clients.remote._connection import ServerUnavailable

    try:
        result = _train(ns, args, logdir)
    except (InvalidCheckpoint, ValueError, MissingDependency, FileNotFoundError) as exc:
        print(f"simkit train: {exc}", file=sys.stderr)
        return 2
    except (ServersLost, ServerStartFailed, WriteFailed) as exc:
        print(f"simkit train: {exc}", file=sys.stderr)
        return 1
    except RecordingLocked as exc:  # --record DIR: another writer holds it
        print(f"simkit train: {exc}", file=sys.stderr)
        return 1
    except ServerUnavailable as exc:  # at start-up: once training runs, ServersLost
        print(f"simkit train: {_unanswered(exc, ns, args.env_id)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # once training runs, SIGINT checkpoints and stops instead
        print("simkit train: interrupted before training started", file=sys.stderr)
        return 130
    if result.complete:
        print(
            f"simkit train: the run in {result.logdir} is complete ({result.global_step:,} "
            f"env steps, --total-steps {args.total_steps:,}); nothing to do. Resume with a "
            "larger --total-steps to train on."
        )
        return 0
    _print_summary(args.env_id, result, ns.algo)
    return 0


def _pin_kernels(ns: argparse.Namespace) -> None:
    """With ``--reproducible`` (given, or kept by ``--resume``): re-executes this process
    pinned if it is not yet (the kernels are chosen when numpy and torch load), then
    says so, and what ``--resume`` found of the checkpoint's kernels."""
    said = _resumed_kernels(ns)  # --resume keeps --reproducible
    if ns.reproducible and not is_pinned():
        reexec_pinned()
    if ns.reproducible:
        print(
            "simkit train: --reproducible: numeric kernels pinned to their AVX2 paths in the "
            "learner and the servers it starts (the same seed gives the same parameters on "
            "any x86-64 CPU)",
            file=sys.stderr,
        )
    if said:
        print(f"simkit train: --resume: {said}", file=sys.stderr)


def _resumed_kernels(ns: argparse.Namespace) -> str | None:
    """On ``--resume``: keeps ``--reproducible`` where the checkpoint was trained with it
    (its bits are those of the pinned kernels; a run resumed without them would go on
    with other bits); what the person should know about the checkpoint's kernels, in
    words, or None."""
    kernels = getattr(ns, "resumed_kernels", None)
    if not isinstance(kernels, dict):
        return None
    if kernels.get("reproducible"):
        if ns.reproducible:
            return None
        ns.reproducible = True
        return "the checkpoint was trained with --reproducible: kept (as if given)"
    if ns.reproducible:
        return (
            "the checkpoint was trained without --reproducible: the kernels are pinned from "
            "here on, so the run goes on with other bits than it would have without it"
        )
    why = why_bits_may_differ(kernels)
    if why is None:
        return None
    return (
        f"the checkpoint was trained {why.removeprefix('made ')}: the continuation's bits may "
        "differ from the run's on that CPU (train with --reproducible for bits that any "
        "x86-64 CPU repeats)"
    )


def _logdir(ns: argparse.Namespace, args: PPOArgs | SACArgs) -> Path:
    """``--logdir``, the resumed run's, or ``runs/<env>[-sac]-<seed>-<time>``."""
    if ns.logdir is not None:
        return Path(ns.logdir)
    if ns.resume is not None:
        return _resumed_logdir(ns.resume)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag = "-sac" if ns.algo == "sac" else ""
    name = args.env_id.replace("/", "_").replace(":", "_")
    return Path(f"runs/{name}{tag}-{args.seed}-{stamp}")


def _train(ns: argparse.Namespace, args: PPOArgs | SACArgs, logdir: Path) -> TrainResult:
    """The run the command line asks for: the algorithm's part
    (:data:`~simkit.clients.learners._run.ALGORITHMS`, with its own flags) in a
    :class:`~simkit.clients.learners._run.Run` with the run's flags."""
    from simkit.clients.learners._run import Run, RunOptions, algorithm

    cls = SACArgs if isinstance(args, SACArgs) else PPOArgs
    given = list(given_settings(ns, cls))
    part = algorithm("sac" if cls is SACArgs else "ppo").from_namespace(args, ns, given)
    flags = {name: getattr(ns, name) for name in _RUN_FLAGS}
    options = RunOptions(logdir=logdir, progress=not ns.no_progress, handle_signals=True, **flags)
    return Run(part, options).train()


_RUN_FLAGS = (
    "resume",
    "print_every",
    "connect",
    "servers",
    "server_timeout",
    "wait_for_servers",
    "record",
    "ray",
    "server_cpus",
    "server_gpus",
    "max_restarts",
    "metrics_port",
)
"""The run flags whose value is the :class:`~simkit.clients.learners._run.RunOptions` field of
the same name (``--metrics-port`` is ``--algo sac``'s: refused for PPO before the run)."""


def _unanswered(exc: Any, ns: argparse.Namespace, env_id: str) -> str:
    """What to do about a rollout server that did not answer at start-up
    (``ServerUnavailable``; its own text ends in a Python API hint)."""
    if exc.endpoint in ns.connect:
        return (
            f"no rollout server answered at {exc.endpoint} within {exc.timeout:g} s: start "
            f"one there (simkit serve {env_id} --policy --bind {exc.endpoint}) or wait "
            "longer (--server-timeout)"
        )
    return (
        f"the rollout server at {exc.endpoint} did not answer within {exc.timeout:g} s "
        "(wait longer: --server-timeout)"
    )


def _refuse_other_algo(ns: argparse.Namespace, names: list[str], algo: str) -> None:
    """Raises for a flag of the other algorithm ``algo`` (it would be silently ignored)."""
    wrong = [_flag(n) for n in names if getattr(ns, n, None) is not None]
    if algo == "sac":
        wrong += [
            flag
            for flag, value in (
                ("--buffer-from", ns.buffer_from),
                ("--metrics-port", ns.metrics_port),
            )
            if value is not None
        ]
    if wrong:
        here = "ppo" if algo == "sac" else "sac"
        raise ValueError(f"{', '.join(wrong)}: --algo {algo} options, this run is --algo {here}")


def runnable(name: str) -> str:
    """How this shell runs the console script ``name`` (``simkit``, ``tensorboard``) of this
    interpreter's environment: the bare name where PATH finds that one (an activated venv),
    else its full path (``./run main`` does not activate ``.venv``)."""
    import shutil

    here = Path(sys.executable).parent / name
    found = shutil.which(name)
    if not here.exists() or (found is not None and Path(found).absolute() == here.absolute()):
        return name
    return str(here)


def _print_summary(env_id: str, r: TrainResult, algo: str = "ppo", *, console: Any = None) -> None:
    """The end-of-run table of figures, then where things are and the commands to go on,
    one ``name: value`` line each, never broken (a terminal's own wrapping pastes whole);
    without a terminal, all of it as plain lines. Its commands run as printed
    (:func:`runnable`). ``console``: the ``rich`` console to print on (default: stdout's)."""
    simkit, tensorboard = runnable("simkit"), runnable("tensorboard")
    total = sum(r.times.values()) or 1.0
    sac = algo == "sac"
    rows = [
        *((("rollout", r.rollout),) if r.rollout else ()),
        *((("device", r.device),) if r.device else ()),
        ("env steps", f"{r.global_step:,}"),
        ("gradient steps" if sac else "updates (policy version)", str(r.updates)),
        ("wall time", f"{r.elapsed_s:.1f} s"),
        ("steps/s", f"{r.steps_per_s:,.0f}"),
        ("mean return (last 20 episodes)", f"{r.mean_return:.2f}"),
    ]
    if not sac:
        rows += [
            ("time split", " ".join(f"{k} {100 * v / total:.0f}%" for k, v in r.times.items())),
            ("dropped fragments", str(r.dropped)),
        ]
    algo_flag = " --algo sac" if sac else ""
    where = [
        ("checkpoint", str(r.checkpoint)),
        ("policy snapshot", str(r.policy)),
        ("TensorBoard", f"{tensorboard} --logdir {r.logdir / 'tb'}"),
        ("evaluate", f"{simkit} eval {r.policy}"),
        (
            "resume",
            f"{simkit} train {env_id}{algo_flag} --resume {r.logdir}"
            + (" --reproducible" if r.reproducible else ""),
        ),
    ]
    if r.record is not None:
        where.append(("recording", f"{simkit} replay {r.record} --verify"))
    if r.not_exact is not None:
        rows.append(("continuation", f"not exact after a server loss or resume: {r.not_exact}"))
    title = f"simkit train {env_id}" + (" (stopped)" if r.stopped else "")
    if console is None and not sys.stdout.isatty():
        print(title)
        for k, v in [*rows, *where]:
            print(f"  {k}: {v}")
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    table = Table(title=title)
    table.add_column("", style="bold")
    table.add_column("")
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    for k, v in where:
        console.print(Text(f"  {k}: ", style="bold") + Text(v), soft_wrap=True)


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """``simkit eval`` options."""
    parser.add_argument(
        "checkpoint", help="policy.safetensors, a checkpoint or a run's log directory"
    )
    parser.add_argument("--episodes", type=int, default=10, help="episodes (default: 10)")
    parser.add_argument("--seed", type=int, default=0, help="root seed (default: 0)")
    parser.add_argument(
        "--render",
        default=None,
        metavar="OUT",
        help="write a video of the episodes (out.mp4; needs imageio and, for MuJoCo "
        "envs, an OpenGL backend: MUJOCO_GL=egl or osmesa)",
    )
    parser.add_argument(
        "--fps", type=int, default=30, help="frames per second of --render (default: 30)"
    )
    add_trust_argument(parser)


def _render_progress(episodes: int) -> Callable[[int, int], None]:
    """``simkit eval --render``'s progress on stderr: a line every 100 frames and at every
    episode's end (software OpenGL takes minutes for a 1000-step episode)."""
    last = [0]

    def report(frames: int, done: int) -> None:
        if frames % 100 == 0 or done > last[0]:
            last[0] = done
            print(
                f"simkit eval: rendered {frames} frames, {done}/{episodes} episodes",
                file=sys.stderr,
                flush=True,
            )

    return report


def run_eval(ns: argparse.Namespace) -> int:
    """Runs ``simkit eval``: mean and std of deterministic episode returns."""
    from simkit.clients.learners._train import evaluate_policy

    for flag, value in (("--episodes", ns.episodes), ("--fps", ns.fps)):
        if value < 1:
            print(f"simkit eval: {flag} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if not 0 <= ns.seed < 2**63:
        print(f"simkit eval: --seed must be in [0, 2**63), got {ns.seed}", file=sys.stderr)
        return 2
    path = Path(ns.checkpoint)
    if (
        path.is_dir()
        and (path / "policy.safetensors").is_file()
        and not (path / "manifest.json").exists()
    ):
        path = path / "policy.safetensors"
    try:
        returns = evaluate_policy(
            path,
            episodes=ns.episodes,
            seed=ns.seed,
            render=ns.render,
            fps=ns.fps,
            on_frame=None if ns.render is None else _render_progress(ns.episodes),
            trust=ns.trust,
        )
    except (InvalidCheckpoint, UnknownEnv) as exc:
        print(f"simkit eval: {exc}", file=sys.stderr)
        return 2
    except (MissingDependency, RenderUnavailable, ValueError) as exc:
        print(f"simkit eval: {exc}", file=sys.stderr)
        return 1
    print(f"{len(returns)} episodes: mean return {returns.mean():.2f} +- {returns.std():.2f}")
    if ns.render is not None:
        print(f"video: {ns.render}")
    return 0
