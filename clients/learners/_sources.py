"""Where a learner's fragments come from: in process, local ``simkit serve`` processes,
given endpoints or Ray actors, opened in one place for every algorithm."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from simkit._kernels import pinned_vars
from simkit._types import Fragment
from simkit.clients.learners._args import RunOptions, Settings
from simkit.clients.learners._local_source import LocalSource, SourceKeywords
from simkit.clients.learners._server_source import ServerSource, spawn_servers, stop_servers
from simkit.models import ActorCritic, ModelSpec
from simkit.rollout._loop import DeviceFragment

__all__ = [
    "FragmentSource",
    "Rollout",
    "RolloutPlan",
    "describe_source",
    "open_rollout",
    "served_env",
    "source_kind",
]


class FragmentSource(Protocol):
    """What a run uses of its fragment source (:class:`LocalSource`, on the host or in the
    device loop, :class:`ServerSource`): its policy rows, the fragments (``None``: the source changed,
    e.g. lost a server), weight pushes, whether a fragment waits, its state for
    checkpoints and why a continuation from them would not be exact."""

    @property
    def num_rows(self) -> int: ...

    @property
    def not_exact(self) -> str | None: ...

    def fragments(self) -> Iterator[Fragment | DeviceFragment | None]: ...

    def push_weights(self, weights: torch.nn.Module, *, version: int | None = None) -> int: ...

    def pending(self) -> bool: ...

    def get_state(self, *, include_envs: bool = True) -> dict[str, Any]: ...

    def set_state(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def source_kind(source: FragmentSource) -> str:
    """What a checkpoint calls the kind of rollout ``source`` runs: ``"device"`` (the
    device loop), ``"local"`` (in process on the host) or ``"servers"``."""
    if isinstance(source, LocalSource):
        return "device" if source.device_loop else "local"
    return "servers"


def describe_source(source: FragmentSource) -> str:
    """Where ``source`` rolls out, for the run's summary: ``"device loop on cuda:0"``,
    ``"in process (host)"`` or ``"rollout servers"``."""
    if isinstance(source, LocalSource):
        return (
            f"device loop on {source.policy.device}" if source.device_loop else "in process (host)"
        )
    return "rollout servers"


@dataclass
class Rollout:
    """An open fragment source and what runs it (server processes, a Ray launch)."""

    source: LocalSource | ServerSource
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


@dataclass(frozen=True)
class RolloutPlan:
    """What a run asks of its fragment source: the algorithm's ``settings`` (env, slots,
    fragment length, seed, mode, threads, env kwargs), the run's ``options`` (servers,
    endpoints, Ray, timeouts), the policy's ``spec``, read by each kind of source.

    Attributes:
        servers: local servers to start (the run's choice: options, checkpoint, default).
        device_loop: roll out in process with every array on that device
            (:class:`LocalSource` with ``device_loop``; the run checked it can,
            :func:`~simkit.clients.learners._local_source.use_device_loop`); None: not.
    """

    settings: Settings
    options: RunOptions
    spec: ModelSpec
    max_lag: int
    servers: int
    give_up: Callable[[], bool]
    logdir: Path
    device_loop: torch.device | None = None

    def source_keywords(self) -> SourceKeywords:
        """What every kind of source is given: ``num_envs``, ``num_steps``, ``seed``."""
        s = self.settings
        return SourceKeywords(num_envs=s.num_envs, num_steps=s.num_steps, seed=s.seed)


def open_rollout(plan: RolloutPlan, model: ActorCritic) -> Rollout:
    """Opens the fragment source ``plan`` asks for; on error nothing is left running.
    With ``plan.device_loop``: in process on that device; else, without servers,
    endpoints or Ray: in process on the host (:class:`LocalSource`); else over servers.

    Raises:
        ValueError: ``ray`` without ``servers`` or with ``connect``.
    """
    p, s = plan, plan.settings
    in_process = p.options.ray is None and not p.servers and not p.options.connect
    if p.device_loop is not None or in_process:
        return Rollout(
            LocalSource(
                s.env_id,
                model,
                mode=s.mode,
                num_threads=s.env_threads,
                env_kwargs=s.env_kwargs,
                device=p.device_loop,
                device_loop=p.device_loop is not None,
                **p.source_keywords(),
            )
        )
    return _server_rollout(p)


def served_env(env_id: str, env_kwargs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The env id and kwargs a rollout server this process starts is given, so that it
    builds the envs ``env_id`` builds here.

    A new process knows simkit's own ids, the installed plugins' and ``gym:`` and
    ``package.module:Class`` ids (:func:`simkit.registry.registered_everywhere`); those
    pass unchanged. An id this process's code registered (``simkit.register`` in a
    script or notebook) does not exist there: its server is given the registered class
    as ``package.module:Class`` (on its own command line, as its operator names it)
    and the registered kwargs under ``env_kwargs``.

    Raises:
        ValueError: the registered entry point is no class a new process can import (a
            class of ``__main__`` or a function's, a factory function): one line saying
            to roll out in process or to name an importable class.
    """
    from simkit.registry import GYM_PREFIX, registered_everywhere, spec

    if env_id.startswith(GYM_PREFIX) or ":" in env_id or registered_everywhere(env_id):
        return env_id, dict(env_kwargs)
    registered = spec(env_id)
    path = _importable_class(registered.entry_point)
    if path is None:
        raise ValueError(
            f"{env_id!r} is registered in this process only ({_described(registered)}), "
            "and the rollout servers this run starts are new processes that cannot build "
            "it: roll out in this process (--servers 0), or define the class in a module "
            "and register it (or train on its package.module:Class id)"
        )
    return path, {**registered.kwargs, **env_kwargs}


def _importable_class(entry_point: Any) -> str | None:
    """``package.module:Class`` of an entry point that names an env class a new process
    can import, else None."""
    import importlib

    if isinstance(entry_point, str):
        module_name, _, attr = entry_point.partition(":")
    else:
        module_name = getattr(entry_point, "__module__", "") or ""
        attr = getattr(entry_point, "__qualname__", "") or ""
    if module_name in ("", "__main__") or not attr.isidentifier():
        return None  # a script's or notebook's class, a local class, a lambda
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return None
    if not isinstance(found, type) or (
        not isinstance(entry_point, str) and found is not entry_point
    ):
        return None  # a factory function, or another object under that name
    return f"{module_name}:{attr}"


def _described(registered: Any) -> str:
    """Where a registration's entry point lives, in words."""
    entry = registered.entry_point
    if isinstance(entry, str):
        return f"entry point {entry}"
    module = getattr(entry, "__module__", "?")
    name = getattr(entry, "__qualname__", type(entry).__name__)
    return f"entry point {name} of {module}"


def _server_rollout(p: RolloutPlan) -> Rollout:
    """Rollout servers: the ``connect`` endpoints, then those launched on Ray or started
    as local processes, under one :class:`ServerSource`; if the source cannot open, the
    servers started here are stopped. Servers this run starts get the env the way a new
    process can build it (:func:`served_env`); ``connect`` servers serve what their
    operators chose."""
    o, s = p.options, p.settings
    procs: list[Any] = []
    endpoints = list(o.connect)
    launched: Any = None
    env_id, env_kwargs = s.env_id, dict(s.env_kwargs)
    if not o.connect:
        env_id, env_kwargs = served_env(s.env_id, s.env_kwargs)
    if o.ray is not None:
        launched = _launch_on_ray(p, o.ray, env_id, env_kwargs)
        endpoints += launched.endpoints
    elif p.servers:
        procs, spawned = spawn_servers(
            env_id, p.servers, num_threads=s.env_threads, env_kwargs=env_kwargs
        )
        endpoints += spawned
    try:
        source = ServerSource(
            endpoints,
            p.spec,
            env_id=env_id,
            env_kwargs=env_kwargs,
            mode=s.mode,
            max_lag=p.max_lag,
            timeout=o.server_timeout,
            report=lambda line: print(line, file=sys.stderr, flush=True),
            wait_for_servers=o.wait_for_servers,
            give_up=p.give_up,
            curve=None if launched is None else launched.curve,
            locate=None if launched is None else _relocator(launched, p.logdir),
            **p.source_keywords(),
        )
    except BaseException:
        stop_servers(procs)
        if launched is not None:
            launched.close()
        raise
    return Rollout(source, procs, launched)


def _launch_on_ray(p: RolloutPlan, ray: str, env_id: str, env_kwargs: dict[str, Any]) -> Any:
    """``p.servers`` rollout servers of ``env_id`` (with ``env_kwargs``:
    :func:`served_env`) launched on the Ray cluster at ``ray`` ("": a local Ray
    instance), the env slots split evenly; their Prometheus targets written into
    ``p.logdir``.

    Raises:
        ValueError: no ``servers`` or some ``connect`` endpoints (Ray launches them all).
    """
    o, s = p.options, p.settings
    servers, connect = p.servers, o.connect
    if connect or not servers:
        raise ValueError(
            f"--ray launches the servers itself: it needs --servers >= 1 and no --connect, "
            f"got --servers {servers} and {len(connect)} --connect"
        )
    from simkit.clients.launcher._launch import launch

    launched = launch(
        env_id,
        servers,
        num_envs=max(1, s.num_envs // servers),
        address=ray or None,
        server_cpus=o.server_cpus,
        server_gpus=o.server_gpus,
        max_restarts=o.max_restarts,
        num_threads=s.env_threads,
        fragment_length=s.num_steps,
        heartbeat_timeout=max(60.0, 4 * o.server_timeout),
        env_vars=pinned_vars(),
        env_kwargs=env_kwargs,
    )
    p.logdir.mkdir(parents=True, exist_ok=True)
    launched.write_prometheus_targets(p.logdir / "prometheus_targets.json")
    return launched
