"""The ``serve`` command: ``simkit serve ENV_ID --num-envs N --bind tcp://127.0.0.1:5555``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from simkit._argtypes import ENV_ID_FORMS, env_kwarg_flags, parse_env_kwargs
from simkit._kernels import is_pinned, reexec_pinned
from simkit._validation import check_curve_key, load_key_file
from simkit.errors import SimkitError
from simkit.servers._memory import DEFAULT_MAX_MEMORY, parse_bytes
from simkit.servers._server import BUSY_POLL_US, RolloutServer

__all__ = ["add_serve_arguments", "env_kwarg_flags", "run_serve", "main", "parse_env_kwargs"]


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``serve`` options to ``parser`` (used by ``simkit serve`` too)."""
    parser.add_argument(
        "env_id",
        help=f"the env to serve: {ENV_ID_FORMS}; or pz:<module>[:<factory>] for a PettingZoo "
        "parallel env",
    )
    _add_session_options(parser)
    _add_limits(parser)
    _add_security_options(parser)
    _add_observability_options(parser)
    _add_policy_options(parser)


def _add_session_options(parser: argparse.ArgumentParser) -> None:
    """Where the server listens and what each client session gets: envs, their
    arguments, stepping threads, polling and the heartbeat."""
    parser.add_argument(
        "--num-envs", type=int, default=1, help="envs per client session (default 1)"
    )
    parser.add_argument(
        "--bind", default="tcp://127.0.0.1:5555", help="ZeroMQ endpoint (default loopback)"
    )
    parser.add_argument("--shared", action="store_true", help="all clients share one set of envs")
    parser.add_argument(
        "--env-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="constructor argument for every env, VALUE as JSON or else a string "
        "(repeatable; e.g. max_episode_steps=500)",
    )
    parser.add_argument(
        "--allow-env",
        action="append",
        default=[],
        metavar="ID",
        help="another env id a --policy learner may ask for, built with its registered "
        "defaults (repeatable). A learner gets ENV with --env-kwarg, or an id named here, "
        "nothing else: no peer chooses what code this server imports",
    )
    parser.add_argument(
        "--num-threads",
        type=int,
        default=1,
        help="threads stepping each session's envs (default 1; MuJoCo envs gain most)",
    )
    parser.add_argument(
        "--busy-poll-us",
        type=int,
        default=None,
        help="microseconds to poll for the next request before sleeping "
        f"(default {BUSY_POLL_US}; 0 = never spin)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=60.0,
        help="seconds before a silent session is freed",
    )


def _add_limits(parser: argparse.ArgumentParser) -> None:
    """How much the server takes on: sessions in all, per peer, and memory."""
    parser.add_argument("--max-sessions", type=int, default=64, help="concurrent client sessions")
    parser.add_argument(
        "--max-sessions-per-peer",
        type=int,
        default=None,
        help="sessions one peer (a CURVE key, else a non-loopback IP address) may hold "
        "(default half of --max-sessions)",
    )
    parser.add_argument(
        "--max-memory",
        type=_size,
        default=DEFAULT_MAX_MEMORY,
        metavar="SIZE",
        help="memory budget beyond the idle server, e.g. 512M or 4G (default 2G): stream "
        "sessions reserve from it at open and get busy when it is spent; the largest "
        "message is an eighth of it (docs/server.md, Memory)",
    )


def _add_security_options(parser: argparse.ArgumentParser) -> None:
    """CURVE encryption and client keys, and the explicit opt-out for a non-loopback bind."""
    parser.add_argument(
        "--curve-secret-key",
        type=Path,
        help="server secret key file (zmq.auth.create_certificates format); enables CURVE",
    )
    parser.add_argument(
        "--curve-allow",
        type=Path,
        action="append",
        default=[],
        help="client public key file or a directory of them (repeatable)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback bind without CURVE (anyone on the network can connect)",
    )


def _add_observability_options(parser: argparse.ArgumentParser) -> None:
    """Prometheus metrics and episode recording."""
    parser.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on this HTTP port"
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="interface for the metrics HTTP server (default loopback; any other warns: "
        "the metrics are unauthenticated)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        metavar="DIR",
        help="record every step session's episodes into DIR (docs/recording.md; "
        "replay them with simkit replay DIR --verify)",
    )


def _add_policy_options(parser: argparse.ArgumentParser) -> None:
    """The "policy serving" group: stream sessions, the policy's device and threads, and
    how fragments are produced."""
    policy = parser.add_argument_group(
        "policy serving", "run learners' policies and stream trajectory fragments (docs/server.md)"
    )
    policy.add_argument(
        "--policy",
        action="store_true",
        help="accept stream sessions: the server runs the policy a learner sends and "
        "streams fragments back",
    )
    policy.add_argument(
        "--device",
        default=None,
        help="torch device of the policy (default: cuda when available, else cpu)",
    )
    policy.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads of this server process (default 1: small batched "
        "policies run fastest on one thread beside the envs' own threads)",
    )
    policy.add_argument(
        "--fragment-length",
        type=int,
        default=128,
        help="steps per fragment when a learner asks for none (default 128)",
    )
    policy.add_argument(
        "--double-buffer",
        action="store_true",
        help="step a session's envs in two halves, one half's physics overlapping the "
        "policy for the other (BatchEnvs with subset steps, an even number of env "
        "slots; same fragments)",
    )
    policy.add_argument(
        "--reproducible",
        action="store_true",
        help="pin the numeric kernels to their AVX2 paths, as `simkit train "
        "--reproducible` does for the servers it starts (for servers a learner reaches "
        "with --connect)",
    )


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _client_keys(paths: Sequence[Path], secret: bytes | None) -> list[bytes]:
    """The public keys of ``--curve-allow``: key files, or directories of ``*.key``.

    Raises:
        ValueError: one line naming the flag and file: no ``--curve-secret-key`` beside
            it, a file that cannot be read, or one whose key is malformed.
    """
    if paths and secret is None:
        raise ValueError(
            "--curve-allow needs --curve-secret-key: without it the server has no CURVE "
            "and admits every client"
        )
    files = [f for p in paths for f in (sorted(p.glob("*.key")) if p.is_dir() else [p])]
    keys = []
    for f in files:
        try:
            keys.append(check_curve_key(load_key_file(f)[0], "the public key"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--curve-allow {f}: {exc}") from exc
    return keys


PARENT_ENV = "SIMKIT_PARENT_PID"
"""Set by a learner that starts ``simkit serve``: the server stops once that process is
gone (killed by SIGKILL included), so no server outlives the run that started it."""


def _stop_when_orphaned(server: RolloutServer, parent: int, interval: float = 0.5) -> None:
    """Stops ``server`` when this process's parent is no longer ``parent`` (it died
    and the process was re-parented); a daemon thread checks every ``interval`` s."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        server.request_stop()
        with contextlib.suppress(OSError):  # the parent's end of a pipe may be gone too
            print(f"simkit serve: parent process {parent} is gone, shutting down", file=sys.stderr)

    threading.Thread(target=watch, name="simkit-parent-watch", daemon=True).start()


MAX_HEARTBEAT_TIMEOUT = 7 * 24 * 3600.0
"""The longest ``--heartbeat-timeout`` (a week), in seconds."""
MAX_BUSY_POLL_US = 1_000_000
"""The longest ``--busy-poll-us`` (a second of spinning after each reply)."""
MIN_MAX_MEMORY = 16 << 20
"""The smallest ``--max-memory`` (16M: its eighth, the largest message, fits a session)."""
MAX_SESSIONS = 1 << 16
MAX_FRAGMENT_LENGTH = 1 << 20


def check_serve_arguments(args: argparse.Namespace) -> None:
    """``simkit serve``'s numbers, checked before anything starts: counts, threads,
    timeouts, the memory budget and the port in their ranges, and ``--num-envs`` envs
    within the memory this machine has free.

    Raises:
        ValueError: one line naming the flag, what it must be and what came.
    """
    from simkit._limits import (
        ENV_BYTES,
        MAX_PORT,
        Range,
        check_env_id,
        check_memory,
        check_ranges,
        max_threads,
    )

    check_env_id(args.env_id)
    threads = max_threads()
    ranges = [
        Range("--num-envs", 1, 1 << 40),
        Range("--num-threads", 1, threads),
        Range("--busy-poll-us", 0, MAX_BUSY_POLL_US, optional=True),
        Range("--heartbeat-timeout", 0, MAX_HEARTBEAT_TIMEOUT, low_open=True),
        Range("--max-sessions", 1, MAX_SESSIONS),
        Range("--max-sessions-per-peer", 1, MAX_SESSIONS, optional=True),
        Range("--max-memory", MIN_MAX_MEMORY, 1 << 50, what="in [16M, 1024T]"),
        Range("--metrics-port", 0, MAX_PORT, optional=True, what="a port in [0, 65535]"),
        Range("--torch-threads", 1, threads),
        Range("--fragment-length", 1, MAX_FRAGMENT_LENGTH),
    ]
    # Each flag's value is its argparse dest: --num-envs is args.num_envs.
    check_ranges((r, getattr(args, r.flag[2:].replace("-", "_"))) for r in ranges)
    check_memory(
        args.num_envs * ENV_BYTES,
        f"--num-envs {args.num_envs:,} (envs of every session, at least "
        f"{ENV_BYTES >> 10} KiB each)",
    )


def _secret_key(path: Path | None) -> bytes | None:
    """The server's CURVE secret key from ``--curve-secret-key`` (None without one).

    Raises:
        ValueError: the file cannot be read or holds no secret key, in one line.
    """
    if path is None:
        return None
    try:
        _, secret = load_key_file(path)
        if secret is None:
            raise ValueError("holds no secret key (expected a '.key_secret' file)")
        return check_curve_key(secret, "the secret key")
    except (OSError, ValueError) as exc:
        raise ValueError(f"--curve-secret-key {path}: {exc}") from exc


def run_serve(args: argparse.Namespace) -> int:
    """Runs the server until SIGINT/SIGTERM; returns the exit code (0 on a clean stop)."""
    if getattr(args, "reproducible", False) and not is_pinned():
        reexec_pinned()  # the kernels are chosen when numpy and torch load
    try:
        check_serve_arguments(args)
        secret = _secret_key(args.curve_secret_key)
        client_keys = _client_keys(args.curve_allow, secret)
    except ValueError as exc:
        print(f"simkit serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.policy:  # only a policy-serving server needs torch
        from simkit.models._threads import set_compute_threads

        set_compute_threads(args.torch_threads)
    try:
        server = RolloutServer(
            args.env_id,
            args.num_envs,
            args.bind,
            shared=args.shared,
            env_kwargs=parse_env_kwargs(args.env_kwarg),
            num_threads=args.num_threads,
            busy_poll_us=args.busy_poll_us,
            heartbeat_timeout=args.heartbeat_timeout,
            max_sessions=args.max_sessions,
            max_sessions_per_peer=args.max_sessions_per_peer,
            max_memory=args.max_memory,
            curve_secret_key=secret,
            curve_allowed_clients=client_keys,
            insecure=args.insecure,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            policy=args.policy,
            device=args.device,
            fragment_length=args.fragment_length,
            double_buffer=args.double_buffer,
            record=args.record,
            allow_envs=args.allow_env,
        )
    except (ValueError, TypeError, KeyError, ImportError, OSError, SimkitError) as exc:
        print(f"simkit serve: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        print(f"simkit serve: {signal.Signals(signum).name}, shutting down", file=sys.stderr)
        server.request_stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    parent = os.environ.get(PARENT_ENV)
    if parent:
        _stop_when_orphaned(server, int(parent))
    serving = f", policy serving on {server.device}" if server.device else ""
    serving += f", recording into {args.record}" if args.record else ""
    if server.metrics_port:
        serving += f", metrics on http://{args.metrics_host}:{server.metrics_port}/metrics"
    print(f"simkit serve: {args.env_id} x{args.num_envs} on {server.endpoint}{serving}", flush=True)
    server.serve_forever()
    print("simkit serve: stopped", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simkit.servers ENV_ID ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m simkit.servers", description="Serve envs over ZeroMQ."
    )
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv))
