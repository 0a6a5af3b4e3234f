"""``simkit train`` and ``simkit eval``: the command lines over :func:`simkit.train`
(:mod:`simkit.clients.learners._train`) and :mod:`simkit.clients.learners._evaluate`.

The setting flags come from :class:`~simkit.clients.learners._args.PPOArgs` and ``SACArgs``
themselves (one flag per field, its default shown in ``--help``); every flag is the
keyword of the same name (:func:`train_keywords`), checked before anything starts. A
setting flag that is not given is ``None`` here, which is how ``--resume`` tells what the
command line asks for from what the checkpoint holds: only flags given are compared with
the checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simkit._argtypes import ENV_ID_FORMS, integer, parse_env_kwargs
from simkit._kernels import is_pinned, reexec_pinned
from simkit.clients.learners._args import DEFAULT_SERVERS, PPOArgs, RunOptions, SACArgs, flag
from simkit.clients.learners._logdir import LogdirLock, died_before_first_checkpoint, resumed_logdir
from simkit.errors import (
    InvalidCheckpoint,
    MissingDependency,
    RecordingLocked,
    RenderUnavailable,
    ServersLost,
    ServerStartFailed,
    UnknownEnv,
    WriteFailed,
)
from simkit.registry import add_trust_argument

if TYPE_CHECKING:
    from simkit.clients.learners._run import TrainResult

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

_RUN_HELP: dict[str, str] = {
    "checkpoint_every": "checkpoint every K updates; 0: only by time and at the end (default: 10)",
    "checkpoint_steps": "--algo sac: also checkpoint (with the replay buffer) every N env steps; "
    "0: not by steps. SAC also checkpoints once learning starts, then by time so that a crash "
    "loses at most about half the run (docs/offpolicy.md) (default: 100000)",
    "buffer_from": "--algo sac: fill the replay buffer with the episodes recorded in DIR "
    "(`simkit record` / --record) before the first update",
    "metrics_port": "--algo sac: serve the learner's Prometheus metrics on this port (0: any "
    "free one; rules: docs/alerts.yml)",
    "checkpoint_minutes": "also checkpoint when this many minutes passed since the last one "
    "(--algo sac: at most this many apart, sooner early in a run); 0: never by time (default: 5)",
    "resume": "continue the run of this checkpoint, its checkpoints/ folder or its log "
    "directory (in that directory unless --logdir says otherwise)",
    "logdir": "default: runs/<env>-<seed>-<time>",
    "reproducible": "pin the numeric kernels (OpenBLAS, numpy SIMD, MKL, oneDNN, PyTorch) of "
    "the learner and of every server it starts to their AVX2 paths, so the same seed gives "
    "the same parameters on any x86-64 CPU (docs/training.md)",
    "no_progress": "no live progress bar (without a terminal: plain lines, see --print-every)",
    "print_every": "seconds between plain progress lines when stdout is not a terminal "
    "(default: 10)",
    "connect": "stream from a running `simkit serve ENV --policy` (repeatable)",
    "curve_server_key": "--connect: the servers' CURVE public key file "
    "(zmq.auth.create_certificates), for servers bound beyond loopback; with --curve-secret-key",
    "curve_secret_key": "--connect: this learner's CURVE secret key file (.key_secret; its "
    "public key on the servers' --curve-allow list)",
    "servers": "start this many local `simkit serve` processes and stream from them; 0 "
    f"rolls out in process (default: {DEFAULT_SERVERS}, --algo sac: 0; with --resume as "
    "many as the checkpoint streamed from)",
    "wait_for_servers": "when a server stops answering, wait for it to come back on its "
    "endpoint (instead of going on with the others)",
    "record": "record every episode of the fragment stream, with the policy version of "
    "every step, into DIR (replay with `simkit replay DIR --verify`)",
    "server_timeout": "seconds before a silent server is dropped (default: 30)",
    "ray": "launch the --servers as Ray actors (pip install 'simkit[ray]') on the cluster "
    "at ADDRESS (none: a local Ray instance); Ray restarts a dead server and the run "
    "continues with it (exactly, in sync mode)",
    "server_cpus": "--ray: CPUs reserved per server (1)",
    "server_gpus": "--ray: GPUs reserved per server, fractional allowed (1: one server per GPU) "
    "(0)",
    "max_restarts": "--ray: times Ray restarts a dead server; -1: always (default: 3)",
}
"""The help of each flag of the run (not a setting's: :data:`_HELP`), in ``--help`` order."""

_SAC_ONLY = [f.name for f in dataclasses.fields(SACArgs) if not hasattr(PPOArgs(), f.name)]
_CHOICES = {"mode": ("sync", "async"), "device_loop": ("auto", "on", "off")}


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """``simkit train`` options: every :class:`PPOArgs` field, then the run's settings."""
    parser.add_argument(
        "env_id", help=f"the env to train on (single-agent, multi-agent or batch): {ENV_ID_FORMS}"
    )
    parser.add_argument(
        "--algo",
        choices=("ppo", "sac"),
        help="ppo (on-policy) or sac (off-policy, replay buffer; continuous actions) "
        "(default: ppo; with --resume the checkpoint's)",
    )
    _add_hyperparameters(parser)
    _add_run_options(parser)
    _add_server_options(parser)


def _add_hyperparameters(parser: argparse.ArgumentParser) -> None:
    """Every :class:`PPOArgs` field (shared with SAC unless PPO's alone), then SAC's own."""
    d, sac_d = PPOArgs(), SACArgs()
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
        if f.name not in _SAC_ONLY and getattr(sac_d, f.name, default) != default:
            help_ += f"; SAC: {getattr(sac_d, f.name)}"
        help_ += ")"
        if isinstance(default, bool):
            group.add_argument(
                flag(f.name), action=argparse.BooleanOptionalAction, default=None, help=help_
            )
        elif isinstance(default, tuple):
            group.add_argument(flag(f.name), type=integer, nargs="+", default=None, help=help_)
        elif f.name in _CHOICES:
            group.add_argument(flag(f.name), choices=_CHOICES[f.name], default=None, help=help_)
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
            group.add_argument(flag(f.name), type=kind, default=None, help=help_)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """Checkpoints, resume, log directory, progress and metrics."""
    run = parser.add_argument_group("run")
    _option(run, "checkpoint_every", type=integer, default=10)
    _option(run, "checkpoint_steps", type=integer, default=100_000)
    _option(run, "buffer_from", metavar="DIR")
    _option(run, "metrics_port", type=int)
    _option(run, "checkpoint_minutes", type=float, default=5.0)
    _option(run, "resume")
    _option(run, "logdir")
    _option(run, "reproducible", action="store_true")
    _option(run, "no_progress", action="store_true")
    _option(run, "print_every", type=float, default=10.0)


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    """Where the fragments come from: local servers, running ones, Ray; the recorder."""
    servers = parser.add_argument_group("rollout servers")
    _option(servers, "connect", action="append", default=[], metavar="ENDPOINT")
    _option(servers, "curve_server_key", metavar="FILE")
    _option(servers, "curve_secret_key", metavar="FILE")
    _option(servers, "servers", type=integer)
    _option(servers, "wait_for_servers", action="store_true")
    _option(servers, "record", metavar="DIR")
    _option(servers, "server_timeout", type=float, default=30.0)
    _option(servers, "ray", nargs="?", const="", metavar="ADDRESS")
    _option(servers, "server_cpus", type=float, default=1.0)
    _option(servers, "server_gpus", type=float, default=0.0)
    _option(servers, "max_restarts", type=int, default=3)


def _option(group: Any, name: str, **kwargs: Any) -> None:
    """The flag of ``name`` (:func:`flag`) in ``group``, its help from :data:`_RUN_HELP`."""
    group.add_argument(flag(name), help=_RUN_HELP[name], **kwargs)


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


def train_keywords(ns: argparse.Namespace) -> dict[str, Any]:
    """The parsed ``simkit train`` flags as :func:`simkit.train`'s keywords of the same
    names; a setting flag not given is left out (on ``--resume`` the checkpoint's holds)."""
    keywords: dict[str, Any] = {
        f.name: getattr(ns, f.name) for f in dataclasses.fields(RunOptions) if hasattr(ns, f.name)
    }
    keywords.update(progress=not ns.no_progress, handle_signals=True)
    for f in [*dataclasses.fields(PPOArgs), *dataclasses.fields(SACArgs)]:
        value = getattr(ns, f.name, None)
        if f.name == "env_id" or value is None:
            continue
        if f.name == "env_kwargs":
            value = parse_env_kwargs(value)
        keywords[f.name] = tuple(value) if isinstance(value, list) else value
    return keywords


def _run_train(ns: argparse.Namespace, locks: list[LogdirLock]) -> int:
    """:func:`run_train`, holding its log directory's lock in ``locks``."""
    from simkit.clients.learners._logdir import claim_logdir
    from simkit.clients.learners._train import execute, plan
    from simkit.recording._format import DirectoryLock

    try:
        run = plan(ns.env_id, **train_keywords(ns))  # its memory and --record too
    except (InvalidCheckpoint, ValueError, TypeError) as exc:
        # A --resume of a run that died before its first checkpoint: start it again
        # without --resume (not from scratch under --resume: its settings died with it,
        # and the resume command's defaults would train another run).
        again = ""
        if isinstance(exc, InvalidCheckpoint) and ns.resume is not None:
            logdir = resumed_logdir(ns.resume)
            if died_before_first_checkpoint(logdir):
                again = (
                    "; nothing to resume: start the run again (its command without --resume, "
                    f"with --logdir {logdir}: the folder is reused)"
                )
        print(f"simkit train: {exc}{again}", file=sys.stderr)
        return 2
    # --reproducible (given, or kept by --resume): this process re-executed pinned if it
    # is not yet (numpy and torch choose their kernels when they load), then said so.
    from simkit.clients.learners._train import resumed_kernels

    keep, said = resumed_kernels(run)
    if keep and not is_pinned():
        reexec_pinned()
    if keep:
        print(
            "simkit train: --reproducible: numeric kernels pinned to their AVX2 paths in the "
            "learner and the servers it starts (the same seed gives the same parameters on "
            "any x86-64 CPU)",
            file=sys.stderr,
        )
    if said:
        print(f"simkit train: --resume: {said}", file=sys.stderr)
    logdir = run.logdir
    try:
        locks.append(claim_logdir(logdir, ns.resume))
        if ns.record is not None and Path(ns.record).is_dir():  # another writer: now, not
            DirectoryLock(Path(ns.record)).release()  # once the servers run
    except (ValueError, WriteFailed, RecordingLocked) as exc:
        print(f"simkit train: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, RecordingLocked) else 2
    if locks[-1].reused:
        print(
            f"simkit train: --logdir {logdir} held a run that stopped before its first "
            "checkpoint (nothing to resume); starting a new run there",
            file=sys.stderr,
        )
    from simkit.clients.remote._connection import ServerUnavailable

    try:
        result = execute(run)
    except (InvalidCheckpoint, ValueError, MissingDependency, FileNotFoundError) as exc:
        print(f"simkit train: {exc}", file=sys.stderr)
        return 2
    except (ServersLost, ServerStartFailed, WriteFailed, RecordingLocked) as exc:
        print(f"simkit train: {exc}", file=sys.stderr)  # RecordingLocked: --record DIR is held
        return 1
    except ServerUnavailable as exc:  # at start-up: once training runs, ServersLost
        print(f"simkit train: {_unanswered(exc, ns, run.settings.env_id)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # once training runs, SIGINT checkpoints and stops instead
        print("simkit train: interrupted before training started", file=sys.stderr)
        return 130
    if result.complete:
        print(
            f"simkit train: the run in {result.logdir} is complete ({result.global_step:,} "
            f"env steps, --total-steps {run.settings.total_steps:,}); nothing to do. Resume "
            "with a larger --total-steps to train on."
        )
        return 0
    _print_summary(run.settings.env_id, result, run.algo)
    return 0


def _unanswered(exc: Any, ns: argparse.Namespace, env_id: str) -> str:
    """What to do about a rollout server that did not answer at start-up
    (``ServerUnavailable``; its own text ends in a Python API hint)."""
    if exc.endpoint in ns.connect:
        keys = (
            "; a server with CURVE answers only learners holding its keys (--curve-server-key,"
            " --curve-secret-key)"
            if ns.curve_server_key is None
            else " (or its CURVE keys are not these: is this learner's public key on its "
            "--curve-allow list?)"
        )
        return (
            f"no rollout server answered at {exc.endpoint} within {exc.timeout:g} s: start "
            f"one there (simkit serve {env_id} --policy --bind {exc.endpoint}) or wait "
            f"longer (--server-timeout){keys}"
        )
    return (
        f"the rollout server at {exc.endpoint} did not answer within {exc.timeout:g} s "
        "(wait longer: --server-timeout)"
    )


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
    q = shlex.quote  # the commands paste into a shell as printed, spaces in paths too
    where = [
        ("checkpoint", str(r.checkpoint)),
        ("policy snapshot", str(r.policy)),
        ("TensorBoard", f"{q(tensorboard)} --logdir {q(str(r.logdir / 'tb'))}"),
        ("evaluate", f"{q(simkit)} eval {q(str(r.policy))}"),
        (
            "resume",
            f"{q(simkit)} train {q(env_id)}{algo_flag} --resume {q(str(r.logdir))}"
            + (" --reproducible" if r.reproducible else ""),
        ),
    ]
    if r.record is not None:
        where.append(("recording", f"{q(simkit)} replay {q(str(r.record))} --verify"))
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


def run_eval(ns: argparse.Namespace) -> int:
    """Runs ``simkit eval``: mean and std of deterministic episode returns."""
    from simkit.clients.learners._evaluate import evaluate_policy

    for name, value in (("--episodes", ns.episodes), ("--fps", ns.fps)):
        if value < 1:
            print(f"simkit eval: {name} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if not 0 <= ns.seed < 2**63:
        print(f"simkit eval: --seed must be in [0, 2**63), got {ns.seed}", file=sys.stderr)
        return 2
    last = [0]

    def report(frames: int, done: int) -> None:
        """--render's progress on stderr: a line every 100 frames and at every episode's
        end (software OpenGL takes minutes for a 1000-step episode)."""
        if frames % 100 == 0 or done > last[0]:
            last[0] = done
            print(
                f"simkit eval: rendered {frames} frames, {done}/{ns.episodes} episodes",
                file=sys.stderr,
                flush=True,
            )

    try:
        returns = evaluate_policy(
            ns.checkpoint,  # a log directory: its policy.safetensors (load_model)
            episodes=ns.episodes,
            seed=ns.seed,
            render=ns.render,
            fps=ns.fps,
            on_frame=None if ns.render is None else report,
            trust=ns.trust,
        )
    except (InvalidCheckpoint, UnknownEnv, MissingDependency, RenderUnavailable, ValueError) as exc:
        print(f"simkit eval: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidCheckpoint | UnknownEnv) else 1
    print(f"{len(returns)} episodes: mean return {returns.mean():.2f} +- {returns.std():.2f}")
    if ns.render is not None:
        print(f"video: {ns.render}")
    return 0
