"""Rollout servers as the learner's fragment source: ``simkit train --connect`` / ``--servers``.

:class:`ServerSource` wraps :class:`simkit.clients.PolicyStream` with the learner's
failure policy: a server that stops answering, or sends what the learner refuses, is
reported by name, removed from the stream, and every fragment already received from it
is still handed to the learner; the run goes on with the remaining servers (it fails
only when none is left). :func:`spawn_servers` starts local ``simkit serve --policy``
subprocesses on free loopback ports and :func:`stop_servers` shuts them down.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from simkit._argtypes import env_kwarg_flags
from simkit._types import Fragment
from simkit.clients.learners._checkpoint import NO_ENV_STATES_LINE, no_snapshots_line
from simkit.clients.remote._connection import CurveKeys, ServerRefused, ServerUnavailable
from simkit.clients.remote._stream import PolicyStream
from simkit.errors import ServerStartFailed
from simkit.models import ModelSpec
from simkit.protocol import ProtocolError, RemoteError, SessionSnapshot
from simkit.servers import PARENT_ENV

__all__ = ["ServerSource", "spawn_servers", "stop_servers"]

_LAST_LINES = 20
"""Lines of a server's output a failed start shows."""


class ServerSource:
    """Fragments from rollout servers, surviving the loss of some of them.

    Without supervision a lost server is reported and dropped; its received fragments
    still reach the learner and the run goes on with the others. Supervised (with
    ``wait_for_servers``, or a ``locate`` that says where a restarted server answers,
    as Ray's :meth:`~simkit.clients.launcher._launch.RayServers.locate` does) the lost server's
    session is reopened on its replacement. In sync mode the replacement continues
    exactly: the source keeps every session's snapshot at each fragment boundary
    (``stream_state``, taken right before each weight push), restores it into the new
    session, sends the current weights again and lets the replacement produce the lost
    fragment anew (a fragment already received from the dead server is discarded, or,
    if the learner used it, the replacement's copy is), so the run ends with the
    parameters of an undisturbed one. Async mode reopens the session with fresh envs
    and counts the lost fragment as dropped.

    Args:
        endpoints: the servers.
        spec: the policy's model spec (the servers build it).
        env_id, env_kwargs, mode, max_lag, timeout, curve: as :class:`PolicyStream` (a
            server refuses an env id or kwargs its operator did not give it; a server
            silent for ``timeout`` seconds counts as dead).
        report: called with a line for a person when a server is lost.
        wait_for_servers: supervise: wait until a lost server is back on the same
            endpoint (retrying every ``timeout`` seconds) and reopen its session.
        give_up: while waiting, checked between retries; when it turns true the lost
            server is dropped as without supervision (e.g. on SIGINT).
        locate: supervise: ``locate(endpoint)`` waits until the server lost at
            ``endpoint`` runs again and returns where (raises if it never will).
        num_envs, num_steps, seed: as :class:`~simkit.clients.learners._sources.LocalSource`
            (the env slots split over the servers).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        spec: ModelSpec,
        *,
        env_id: str,
        num_envs: int,
        num_steps: int,
        seed: int,
        env_kwargs: Mapping[str, Any] | None = None,
        mode: str = "sync",
        max_lag: int = 1,
        timeout: float = 30.0,
        report: Callable[[str], None] = print,
        wait_for_servers: bool = False,
        give_up: Callable[[], bool] = lambda: False,
        curve: CurveKeys | None = None,
        locate: Callable[[str], str] | None = None,
    ) -> None:
        self.stream = PolicyStream(
            list(endpoints),
            spec,
            num_envs=num_envs,
            seed=seed,
            fragment_length=num_steps,
            mode=mode,
            max_lag=max_lag,
            env_id=env_id,
            env_kwargs=env_kwargs,
            timeout=timeout,
            curve=curve,
        )
        self.num_servers = len(endpoints)
        """Servers the run started with (a resumed run starts as many)."""
        self.observation_space = self.stream.observation_space
        self.action_space = self.stream.action_space
        self.report = report
        self.give_up = give_up
        self.mode = mode
        self.locate = locate or ((lambda ep: ep) if wait_for_servers else None)
        self.lost: list[str] = []
        self.restored: list[str] = []
        self.dropped = 0
        """Fragments lost with a server and not produced again (async mode)."""
        self._kept: list[Fragment] = []
        self._failed: ServerUnavailable | None = None
        self._boundary: dict[int, SessionSnapshot] | None = {} if self.supervised else None
        """Sync, supervised: every session's snapshot at the current version's start, by
        env offset (None once the envs turned out to have no snapshots)."""
        self._boundary_version: int | None = None
        self.env_id = env_id
        self.not_exact: str | None = None
        """Why this run's continuation after a server loss and from its checkpoints is
        not exact (its envs have no snapshots), once the servers said so; else None."""

    @property
    def supervised(self) -> bool:
        """Whether a lost server is replaced (else dropped)."""
        return self.locate is not None

    @property
    def num_rows(self) -> int:
        """Policy rows of the servers still in the stream."""
        # PolicyStream exposes no per-server row count
        return sum(srv.info.num_rows for srv in self.stream._servers if srv.info is not None)

    def _lose(self, exc: ServerUnavailable, *, used: bool = False) -> None:
        """Replaces (supervised) or drops the server lost at ``exc.endpoint``. ``used``:
        its fragment of the current version already reached the learner."""
        config = self.stream.server_config(exc.endpoint)
        kept = self.stream.remove_server(exc.endpoint)
        replace = self.supervised and not isinstance(exc, ServerRefused)  # no second chance
        snap = None if self._boundary is None else self._boundary.get(config.env_offset)
        if replace and self.mode == "sync" and snap is not None:
            kept = []  # the replacement produces them again, bit for bit
        self._kept.extend(kept)
        if replace and self._replace(exc, config, snap, used=used, kept=len(kept)):
            return
        self.lost.append(exc.endpoint)
        left = self.stream.endpoints
        how = "was dropped" if isinstance(exc, ServerRefused) else "stopped answering"
        self.report(
            f"simkit train: server {exc.endpoint} {how} ({exc}); kept its "
            f"{len(kept)} received fragment(s), going on with {len(left)} server(s): {left}"
        )
        if not left:
            raise exc

    def _replace(
        self,
        exc: ServerUnavailable,
        config: Any,
        snap: SessionSnapshot | None,
        *,
        used: bool,
        kept: int,
    ) -> bool:
        """Reopens the lost session where :attr:`locate` finds its server; False if
        :attr:`give_up` turned true first (or the server is gone for good)."""
        assert self.locate is not None
        version = self.stream.version
        exact = self.mode == "sync" and snap is not None
        slots = f"env slots {config.env_offset}..{config.env_offset + config.num_envs - 1}"
        self.report(
            f"simkit train: server {exc.endpoint} stopped answering ({exc}); waiting for "
            f"it to come back ({slots})"
        )
        while not self.give_up():
            try:
                endpoint = self.locate(exc.endpoint)
            except (RuntimeError, KeyError) as gone:
                self.report(f"simkit train: {gone}")
                return False
            send_weights = exact or self.mode != "sync" or (kept == 0 and not used)
            try:
                self.stream.add_server(
                    endpoint, config, send_weights=send_weights, restore=snap if exact else None
                )
                if exact and used:
                    self.stream.take(endpoint)  # the learner has this fragment already
            except ServerUnavailable:
                continue
            self.restored.append(endpoint)
            if exact:
                how = f"its session restored at version {version}'s boundary"
            else:
                how = f"its envs restart from seed {config.seed}"
                if self.mode == "async":
                    self.dropped += 1
                    how += ", its fragment in flight counted as dropped"
            self.report(f"simkit train: server {exc.endpoint} is back at {endpoint}; {how}")
            return True
        return False

    def fragments(self) -> Iterator[Fragment | None]:
        """Fragments as they arrive; after a loss, the dead server's received ones, then
        ``None`` (the learner re-checks its batch against the smaller row count)."""
        while True:
            try:
                if self._failed is not None:  # seen by pending(): its message is consumed
                    raise self._failed
                fragment = self.stream.next_fragment()
            except ServerUnavailable as exc:
                self._failed = None
                self._lose(exc)
                while self._kept:
                    yield self._kept.pop(0)
                yield None
                continue
            yield fragment

    def pending(self) -> bool:
        """Whether a fragment is ready without waiting (a lost server's kept ones count)."""
        try:
            return bool(self._kept) or self._failed is not None or self.stream.pending()
        except ServerUnavailable as exc:
            self._failed = exc  # fragments() reports it
            return True

    def _capture(self) -> list[tuple[Any, SessionSnapshot]] | None:
        """Every session's snapshot at this boundary (sync mode), replacing a server
        that died since it delivered its fragment; None for envs without snapshots."""
        while True:
            try:
                states = self.stream.session_states()
            except RemoteError as exc:
                if exc.remote_code != "unsupported":
                    raise
                self._boundary = None
                if self.not_exact is None:  # said once, with what it costs
                    self.not_exact = f"the envs of {self.env_id} have no snapshots"
                    self.report(no_snapshots_line(self.not_exact, supervised=self.supervised))
                return None
            except ServerUnavailable as exc:
                if not self.supervised:
                    raise
                self._lose(exc, used=True)
                continue
            if self._boundary is not None:
                self._boundary = {config.env_offset: snap for config, snap in states}
                self._boundary_version = self.stream.version
            return states

    def push_weights(self, weights: torch.nn.Module, *, version: int | None = None) -> int:
        """Sends new weights to every live server without waiting for the acks.

        Supervised in sync mode, every session's boundary snapshot is taken first (the
        point a replacement continues from). A server refusing them or gone surfaces at
        the next fragment, where :meth:`fragments` handles it; waiting here would leave
        a half-pushed version that cannot be re-sent (versions must increase).
        """
        if (
            self._boundary is not None
            and self.mode == "sync"
            and (self._boundary_version != self.stream.version or not self._boundary)
        ):
            self._capture()
        return self.stream.push_weights(weights, version=version, wait=False)

    def get_state(self, *, include_envs: bool = True) -> dict[str, Any]:
        """Every server's session snapshot (``stream_state``), as plain data for the
        checkpoint: ``{"sessions": [{"endpoint", "env_offset", "num_envs", "state"}]}``.

        Call it where the learner's loop waits at a fragment boundary (after an update,
        before its weights are pushed; sync mode). ``sessions`` is None without
        ``include_envs`` (async mode, where the servers never pause) and for envs
        without snapshots (Gymnasium's): such a run resumes with fresh envs.
        """
        count = {"servers": self.num_servers}
        states = None
        if include_envs and self.mode == "sync" and self.stream.endpoints:
            try:
                states = self._capture()
            except ServerUnavailable as exc:  # the fragment path reports and handles the loss
                self.report(
                    f"simkit train: server {exc.endpoint} did not send its session state "
                    f"({exc}); this checkpoint's envs will restart afresh"
                )
        if states is None:
            return {"sessions": None, **count}
        return {
            **count,
            "sessions": [
                {
                    "endpoint": endpoint,
                    "env_offset": config.env_offset,
                    "num_envs": config.num_envs,
                    "state": snap.to_plain(),
                }
                for endpoint, (config, snap) in zip(self.stream.endpoints, states, strict=True)
            ],
        }

    def view(self) -> dict[str, Any]:
        """One view of the servers, JSON-able: how many are alive, were restarted
        (replaced after a loss) or lost for good, fragments lost with a server (async),
        and per server share (by first env slot) its endpoint, env steps/s and mean
        policy lag."""
        stats = sorted(self.stream.stats(), key=lambda st: st.first_slot)
        return {
            "alive": sum(st.alive for st in stats),
            "restarted": len(self.restored),
            "lost": len(self.lost),
            "dropped": self.dropped,
            "servers": [
                {
                    "first_slot": st.first_slot,
                    "endpoint": st.endpoint,
                    "steps_per_s": round(st.steps_per_second, 1),
                    "lag_mean": st.lag_avg,
                    "alive": st.alive,
                }
                for st in stats
            ],
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores :meth:`get_state` into the (fresh) servers' sessions, before the first
        weights: every session continues exactly where the checkpointed one stopped.

        Raises:
            ValueError: the snapshots do not fit the servers (another number of servers,
                other env slots, malformed; the message says which).
            RemoteError: a server refused its snapshot.
        """
        sessions = state.get("sessions")
        if sessions is None:
            self.report(NO_ENV_STATES_LINE)
            return
        try:
            snaps = [SessionSnapshot.from_plain(s["state"]) for s in sessions]
        except (KeyError, TypeError, ProtocolError) as exc:
            raise ValueError(f"malformed server session state: {exc}") from exc
        if len(snaps) != len(self.stream.endpoints):
            raise ValueError(
                f"the checkpoint holds {len(snaps)} server session(s) (env slots "
                f"{[(s.env_offset, s.env_offset + s.num_envs) for s in snaps]}), this run "
                f"streams from {len(self.stream.endpoints)} server(s); resume with "
                f"--servers {len(snaps)} (or as many --connect)"
            )
        self.stream.restore_sessions(snaps)

    def close(self) -> None:
        """Closes the stream (the servers keep running)."""
        self.stream.close(polite=not self.lost)


def spawn_servers(
    env_id: str,
    count: int,
    *,
    num_threads: int = 1,
    binds: Sequence[str] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """Starts ``count`` local ``simkit serve ENV --policy`` processes; returns them and their endpoints.

    ``binds`` gives each server's bind address (default: a free loopback port each);
    ``env_kwargs`` the constructor arguments of their envs (each ``--env-kwarg KEY=JSON``).

    Raises:
        ServerStartFailed: a server did not start (its output is in the message).
        ValueError: ``binds`` does not name ``count`` addresses.
    """
    if binds is not None and len(binds) != count:
        raise ValueError(f"binds must name {count} addresses, got {len(binds)}: {list(binds)}")
    procs: list[subprocess.Popen[str]] = []
    endpoints: list[str] = []
    try:
        for k in range(count):
            bind = "tcp://127.0.0.1:*" if binds is None else binds[k]
            cmd = [sys.executable, "-m", "simkit", "serve", env_id, "--policy", "--bind", bind]
            proc = subprocess.Popen(
                [*cmd, "--num-threads", str(num_threads), *env_kwarg_flags(env_kwargs or {})],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                # Its own session: Ctrl-C in a terminal reaches the learner only, which
                # checkpoints (asking the servers for their sessions) and then stops them.
                start_new_session=True,
                # The server stops when this process is gone, even killed by SIGKILL.
                env={**os.environ, PARENT_ENV: str(os.getpid())},
            )
            procs.append(proc)
            endpoints.append(_started_endpoint(proc, env_id))
    except BaseException:
        stop_servers(procs)
        raise
    return procs, endpoints


def _started_endpoint(proc: subprocess.Popen[str], env_id: str) -> str:
    """The endpoint ``proc`` (a starting ``simkit serve``) says it serves on.

    From then on its output is read by a thread and dropped (the learner reports what
    it sees of the server), so that a server that goes on printing never blocks on a
    full pipe.

    Raises:
        ServerStartFailed: it exited first; the message holds its exit code and its
            last lines (an import error's traceback, a bind error).
    """
    assert proc.stdout is not None
    last: deque[str] = deque(maxlen=_LAST_LINES)
    for line in proc.stdout:
        if " on tcp://" in line:
            _drain(proc)
            return "tcp://" + line.split(" on tcp://", 1)[1].split(",")[0].split()[0]
        if line.strip():
            last.append(line.rstrip())
    try:
        code: int | str = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = "still running, its output closed"
    said = "\n".join(last) if last else "(it printed nothing)"
    raise ServerStartFailed(f"simkit serve {env_id} did not start (exit {code}):\n{said}")


def _drain(proc: subprocess.Popen[str]) -> None:
    """Reads ``proc``'s output until it ends, on a daemon thread."""
    stdout = proc.stdout
    assert stdout is not None

    def read() -> None:
        with contextlib.suppress(ValueError, OSError):  # closed by stop_servers
            for _ in stdout:
                pass

    threading.Thread(target=read, name=f"simkit-serve-{proc.pid}-output", daemon=True).start()


def stop_servers(procs: Sequence[subprocess.Popen[str]], timeout: float = 10.0) -> None:
    """SIGTERM each server, then kill those that do not stop within ``timeout``."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
