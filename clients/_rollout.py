"""Where a learner's fragments come from: in process, local ``simkit serve`` processes,
given endpoints or Ray actors, opened in one place for every algorithm."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from simkit._kernels import pinned_vars
from simkit.clients._device_source import DeviceSource
from simkit.clients._local_source import LocalSource
from simkit.clients._server_source import ServerSource, spawn_servers, stop_servers
from simkit.models import ActorCritic, ModelSpec

__all__ = ["Rollout", "describe_source", "open_rollout", "source_kind"]


def source_kind(source: Any) -> str:
    """What a checkpoint calls the kind of rollout ``source`` runs: ``"device"`` (the
    device loop), ``"local"`` (in process on the host) or ``"servers"``."""
    if isinstance(source, DeviceSource):
        return "device"
    return "local" if isinstance(source, LocalSource) else "servers"


def describe_source(source: Any) -> str:
    """Where ``source`` rolls out, for the run's summary: ``"device loop on cuda:0"``,
    ``"in process (host)"`` or ``"rollout servers"``."""
    kind = source_kind(source)
    if kind == "device":
        return f"device loop on {source.device}"
    return "in process (host)" if kind == "local" else "rollout servers"


@dataclass
class Rollout:
    """An open fragment source and what runs it (server processes, a Ray launch)."""

    source: LocalSource | ServerSource | DeviceSource
    procs: list[Any] = field(default_factory=list)
    launched: Any = None

    def close(self, *, source: bool = True) -> None:
        """Closes the source (unless ``source=False``), stops the servers it started."""
        try:
            if source:
                self.source.close()
        finally:
            stop_servers(self.procs)
            if self.launched is not None:
                self.launched.close()


def _relocator(launched: Any, logdir: Path) -> Callable[[str], str]:
    """Ray's answer to "where is the server lost at this endpoint now", keeping the
    Prometheus targets file current."""

    def locate(endpoint: str) -> str:
        found: str = launched.locate(endpoint)
        launched.write_prometheus_targets(logdir / "prometheus_targets.json")
        return found

    return locate


def open_rollout(
    env_id: str,
    spec: ModelSpec,
    model: ActorCritic,
    *,
    num_envs: int,
    num_steps: int,
    seed: int,
    mode: str,
    max_lag: int,
    env_threads: int,
    servers: int,
    connect: Sequence[str],
    ray: str | None,
    server_cpus: float,
    server_gpus: float,
    max_restarts: int,
    server_timeout: float,
    wait_for_servers: bool,
    give_up: Callable[[], bool],
    logdir: Path,
    device_loop: torch.device | None = None,
) -> Rollout:
    """Opens the fragment source a run asks for (the arguments of
    :func:`simkit.clients._train.run_training`); on error nothing is left running.
    ``device_loop``: roll out in process on that device
    (:class:`~simkit.clients._device_source.DeviceSource`; the run checked it can,
    :func:`~simkit.clients._device_source.use_device_loop`). Else, without servers,
    endpoints or Ray: in process on the host (:class:`LocalSource`); else over servers.

    Raises:
        ValueError: ``ray`` without ``servers`` or with ``connect``.
    """
    if device_loop is not None:
        return Rollout(
            DeviceSource(
                env_id,
                model,
                num_envs=num_envs,
                num_steps=num_steps,
                seed=seed,
                device=device_loop,
            )
        )
    if ray is None and not servers and not connect:
        return Rollout(
            LocalSource(
                env_id,
                model,
                num_envs=num_envs,
                num_steps=num_steps,
                seed=seed,
                mode=mode,
                num_threads=env_threads,
            )
        )
    return _server_rollout(
        env_id,
        spec,
        num_envs=num_envs,
        num_steps=num_steps,
        seed=seed,
        mode=mode,
        max_lag=max_lag,
        env_threads=env_threads,
        servers=servers,
        connect=connect,
        ray=ray,
        server_cpus=server_cpus,
        server_gpus=server_gpus,
        max_restarts=max_restarts,
        server_timeout=server_timeout,
        wait_for_servers=wait_for_servers,
        give_up=give_up,
        logdir=logdir,
    )


def _server_rollout(
    env_id: str,
    spec: ModelSpec,
    *,
    num_envs: int,
    num_steps: int,
    seed: int,
    mode: str,
    max_lag: int,
    env_threads: int,
    servers: int,
    connect: Sequence[str],
    ray: str | None,
    server_cpus: float,
    server_gpus: float,
    max_restarts: int,
    server_timeout: float,
    wait_for_servers: bool,
    give_up: Callable[[], bool],
    logdir: Path,
) -> Rollout:
    """Rollout servers: the ``connect`` endpoints, then those launched on Ray or started
    as local processes, under one :class:`ServerSource`; if the source cannot open, the
    servers started here are stopped."""
    procs: list[Any] = []
    endpoints = list(connect)
    launched: Any = None
    if ray is not None:
        launched = _launch_on_ray(
            env_id,
            ray,
            servers,
            connect,
            num_envs=num_envs,
            num_steps=num_steps,
            env_threads=env_threads,
            server_cpus=server_cpus,
            server_gpus=server_gpus,
            max_restarts=max_restarts,
            server_timeout=server_timeout,
            logdir=logdir,
        )
        endpoints += launched.endpoints
    elif servers:
        procs, spawned = spawn_servers(env_id, servers, num_threads=env_threads)
        endpoints += spawned
    try:
        source = ServerSource(
            endpoints,
            spec,
            env_id=env_id,
            num_envs=num_envs,
            num_steps=num_steps,
            seed=seed,
            mode=mode,
            max_lag=max_lag,
            timeout=server_timeout,
            report=lambda line: print(line, file=sys.stderr, flush=True),
            wait_for_servers=wait_for_servers,
            give_up=give_up,
            curve=None if launched is None else launched.curve,
            locate=None if launched is None else _relocator(launched, logdir),
        )
    except BaseException:
        stop_servers(procs)
        if launched is not None:
            launched.close()
        raise
    return Rollout(source, procs, launched)


def _launch_on_ray(
    env_id: str,
    ray: str,
    servers: int,
    connect: Sequence[str],
    *,
    num_envs: int,
    num_steps: int,
    env_threads: int,
    server_cpus: float,
    server_gpus: float,
    max_restarts: int,
    server_timeout: float,
    logdir: Path,
) -> Any:
    """``servers`` rollout servers launched on the Ray cluster at ``ray`` ("": a local
    Ray instance), the env slots split evenly; their Prometheus targets written into
    ``logdir``.

    Raises:
        ValueError: no ``servers`` or some ``connect`` endpoints (Ray launches them all).
    """
    if connect or not servers:
        raise ValueError(
            f"--ray launches the servers itself: it needs --servers >= 1 and no --connect, "
            f"got --servers {servers} and {len(connect)} --connect"
        )
    from simkit.clients._launch import launch

    launched = launch(
        env_id,
        servers,
        num_envs=max(1, num_envs // servers),
        address=ray or None,
        server_cpus=server_cpus,
        server_gpus=server_gpus,
        max_restarts=max_restarts,
        num_threads=env_threads,
        fragment_length=num_steps,
        heartbeat_timeout=max(60.0, 4 * server_timeout),
        env_vars=pinned_vars(),
    )
    logdir.mkdir(parents=True, exist_ok=True)
    launched.write_prometheus_targets(logdir / "prometheus_targets.json")
    return launched
