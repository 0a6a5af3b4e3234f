"""Rollout servers as Ray actors: placed, supervised and restarted by Ray; data over ZeroMQ.

:func:`launch` starts ``K`` policy-serving rollout servers (``simkit serve ENV --policy``,
each in a Ray actor process) spread over a Ray cluster's nodes with a placement group
(``SPREAD``: one bundle of ``server_cpus`` CPUs and ``server_gpus`` GPUs per server).
Each server binds ZeroMQ on its node's address with CURVE keys made for the run, so the
learner's traffic to it is encrypted whatever network lies between them, and serves
Prometheus metrics on its node. :class:`RayServers` returns the endpoints, the client's
CURVE keys and the metrics targets, so any learner (``simkit train --ray``, a custom one
over :class:`~simkit.clients.PolicyStream` or :class:`~simkit.clients.RemoteVectorEnv`)
uses the same servers.

Ray restarts a server actor that dies (``max_restarts``, on a remaining node if its node
is gone); :meth:`RayServers.locate` waits for the replacement and returns its new
endpoint. The actors are owned by the learner's Ray driver: when the learner exits or is
killed, Ray stops them (and a local Ray instance started by the learner goes with it).
Nothing here supervises or restarts anything itself.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import zmq

from simkit._optional import require
from simkit.clients.remote._connection import CurveKeys
from simkit.errors import ServerStartFailed

__all__ = ["RayServers", "ServerInfo", "launch"]


@dataclass(frozen=True)
class ServerInfo:
    """Where one server actor runs now.

    Attributes:
        index: the server's place in the run (its env slot share).
        endpoint: its ZeroMQ endpoint (``tcp://<node address>:<port>``).
        metrics: its Prometheus target, ``host:port``.
        node_id: the Ray node it runs on.
        pid: its process id (on that node).
        restarts: times Ray restarted it so far, as far as it knows (0 or 1: a
            restarted actor only knows that it was restarted).
    """

    index: int
    endpoint: str
    metrics: str
    node_id: str
    pid: int
    restarts: int


class _ServerActor:
    """The body of a server actor (wrapped by ``ray.remote`` in :func:`launch`)."""

    def __init__(self, index: int, settings: dict[str, Any]) -> None:
        import ray

        from simkit.models._threads import set_compute_threads
        from simkit.servers import RolloutServer

        server = dict(settings)  # RolloutServer's keywords, and the torch threads
        set_compute_threads(server.pop("torch_threads"))
        host = ray.util.get_node_ip_address()
        self.server = RolloutServer(
            bind=f"tcp://{host}:*", metrics_port=0, metrics_host=host, policy=True, **server
        ).start()
        context = ray.get_runtime_context()
        self.info = ServerInfo(
            index=index,
            endpoint=self.server.endpoint,
            metrics=f"{host}:{self.server.metrics_port}",
            node_id=context.get_node_id(),
            pid=os.getpid(),
            restarts=int(context.was_current_actor_reconstructed),
        )

    def describe(self) -> ServerInfo:
        return self.info


class RayServers:
    """The servers of one run on a Ray cluster (from :func:`launch`).

    Attributes:
        curve: the CURVE keys a learner connects with (:class:`CurveKeys`).
        started_s: seconds from :func:`launch` (Ray's start-up included) until every
            server answered.
    """

    def __init__(self, actors: list[Any], placement: Any, curve: CurveKeys, owns_ray: bool) -> None:
        self._actors = actors
        self._placement = placement
        self.curve = curve
        self.started_s = 0.0
        self._owns_ray = owns_ray
        self._infos = [self._started(k) for k in range(len(actors))]
        self.restarts = [0] * len(actors)
        """Restarts seen per server (counted by :meth:`locate`)."""

    def _started(self, k: int) -> ServerInfo:
        """Server ``k``'s :class:`ServerInfo` once it serves.

        Raises:
            ServerStartFailed: its actor died starting (an env that cannot be built on
                that node, a bad keyword): the actor's own last line, not Ray's traceback.
        """
        from ray.exceptions import RayActorError

        try:
            return self._describe(k)
        except RayActorError as exc:
            said = [line for line in str(exc).splitlines() if line.strip()]
            raise ServerStartFailed(
                f"rollout server {k} did not start on Ray: {said[-1] if said else exc!r}"
            ) from None

    def _describe(self, k: int, timeout: float | None = 120.0) -> ServerInfo:
        import ray

        info: ServerInfo = ray.get(self._actors[k].describe.remote(), timeout=timeout)
        return info

    @property
    def infos(self) -> list[ServerInfo]:
        """Every server's :class:`ServerInfo`, as last seen."""
        return list(self._infos)

    @property
    def endpoints(self) -> list[str]:
        """The servers' ZeroMQ endpoints, in run order."""
        return [i.endpoint for i in self._infos]

    @property
    def metrics_targets(self) -> list[str]:
        """The servers' Prometheus targets (``host:port``), in run order."""
        return [i.metrics for i in self._infos]

    def locate(self, endpoint: str, timeout: float = 120.0) -> str:
        """The endpoint the server last seen at ``endpoint`` serves on now: waits until
        Ray has restarted it if it died (on another node if its node is gone).

        While Ray has not yet noticed a crashed node (its health checks) or re-places
        the actor, it answers "temporarily unavailable" (``ActorUnavailableError``):
        that is waited through like a restart, until ``timeout``.

        Raises:
            KeyError: ``endpoint`` is none of this run's servers.
            RuntimeError: Ray gave the server up (its restarts are used up) or it did
                not come back within ``timeout`` seconds.
        """
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        k = next((i.index for i in self._infos if i.endpoint == endpoint), None)
        if k is None:
            raise KeyError(f"{endpoint} is not one of this run's servers: {self.endpoints}")
        deadline = time.monotonic() + timeout
        last: RayActorError | None = None
        while True:
            try:
                info = self._describe(k, timeout=max(0.1, deadline - time.monotonic()))
            except RayActorError as exc:
                # Unavailable: Ray has not yet noticed that the actor's node is gone, or
                # re-places it; "restart": it restarts the actor. Both pass: ask again.
                passing = isinstance(exc, ActorUnavailableError) or "restart" in str(exc).lower()
                if passing and time.monotonic() < deadline:
                    last = exc
                    time.sleep(0.2)
                    continue
                if passing:
                    raise RuntimeError(
                        f"server {k} ({endpoint}) did not come back within {timeout:g} s: {exc}"
                    ) from exc
                raise RuntimeError(f"server {k} ({endpoint}) is gone for good: {exc}") from exc
            except GetTimeoutError as exc:
                still = f" (last: {last})" if last is not None else ""
                raise RuntimeError(
                    f"server {k} ({endpoint}) did not come back within {timeout:g} s{still}"
                ) from exc
            if info.endpoint != endpoint:
                self.restarts[k] += 1
            self._infos[k] = info
            return info.endpoint

    def write_prometheus_targets(self, path: str | os.PathLike[str], job: str = "simkit") -> None:
        """Writes a Prometheus file-based service-discovery file (``file_sd_configs``)
        listing every server's metrics target, atomically (rewritten after restarts)."""
        import json

        body = [
            {
                "targets": [info.metrics],
                "labels": {
                    "job": job,
                    "server": str(info.index),
                    "node": info.node_id[:12],
                    "pid": str(info.pid),
                },
            }
            for info in self._infos
        ]
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w") as f:
            json.dump(body, f, indent=1)
        os.replace(tmp, path)

    def close(self) -> None:
        """Stops the servers, removes the placement group and, where :func:`launch`
        started a local Ray instance, shuts it down."""
        import ray

        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        ray.util.remove_placement_group(self._placement)
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> RayServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def launch(
    env_id: str,
    servers: int,
    *,
    num_envs: int,
    address: str | None = None,
    server_cpus: float = 1.0,
    server_gpus: float = 0.0,
    max_restarts: int = 3,
    device: str | None = None,
    num_threads: int = 1,
    fragment_length: int = 128,
    env_kwargs: dict[str, Any] | None = None,
    heartbeat_timeout: float = 60.0,
    env_vars: dict[str, str] | None = None,
    placement_timeout: float = 120.0,
) -> RayServers:
    """Starts ``servers`` policy-serving rollout servers of ``env_id`` as Ray actors.

    Args:
        env_id: the env (a simkit id or ``gym:<id>``), as ``simkit serve``.
        servers: how many (K >= 1).
        num_envs: env slots per server session by default (a learner asks for its own).
        address: a Ray cluster (``ray://...``, ``host:port`` or ``"auto"``); None starts
            a local Ray instance owned by this process (or joins the one already
            initialised in it).
        server_cpus: CPUs reserved per server (its placement bundle).
        server_gpus: GPUs reserved per server, fractional allowed (0.5 = two per GPU);
            the server's policy then runs on ``cuda`` unless ``device`` says otherwise.
        max_restarts: times Ray restarts a server that died (-1 = forever).
        device: the servers' torch device for the policy (None: ``cuda`` with GPUs
            reserved, else ``cpu``).
        num_threads: env stepping threads per server.
        fragment_length: ``T`` for a learner that asks for none.
        env_kwargs: constructor arguments of every env.
        heartbeat_timeout: seconds a silent learner session is kept.
        env_vars: environment variables the server processes start with (the pinned
            kernels of reproducible mode, :mod:`simkit._kernels`).
        placement_timeout: seconds to wait for the bundles to be placed (room the
            cluster has but other work holds now).

    Raises:
        simkit.errors.MissingDependency: Ray is not installed (``pip install
            'simkit[ray]'``).
        ValueError: before anything is asked of Ray, a count or resource out of range,
            nothing listening at ``address`` (``HOST:PORT``), or live nodes that cannot
            hold ``servers`` bundles; or bundles not placed within ``placement_timeout``:
            one line naming what is needed and what the cluster has.
    """
    _check_launch(servers, server_cpus, server_gpus, max_restarts)
    ray = require("ray", extra="ray", purpose="launching rollout servers on Ray")
    start = time.perf_counter()
    owns_ray = _init_ray(ray, address)
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    settings = {
        "env_id": env_id,
        "num_envs": int(num_envs),
        "env_kwargs": dict(env_kwargs or {}),
        "curve_secret_key": server_secret,
        "curve_allowed_clients": [client_public],
        "num_threads": int(num_threads),
        "torch_threads": max(1, int(server_cpus)),
        "device": device or ("cuda" if server_gpus > 0 else "cpu"),
        "fragment_length": int(fragment_length),
        "heartbeat_timeout": float(heartbeat_timeout),
    }
    bundle = {"CPU": server_cpus, **({"GPU": server_gpus} if server_gpus else {})}
    curve = CurveKeys(server_public, client_public, client_secret)
    try:  # a failure leaves nothing of the run, nor the Ray instance it started
        placement = _place(ray, servers, bundle, placement_timeout)
        launched = _start_servers(
            ray, placement, settings, curve, owns_ray, servers, bundle, max_restarts, env_vars
        )
    except BaseException:
        if owns_ray:
            ray.shutdown()
        raise
    launched.started_s = time.perf_counter() - start
    return launched


def _check_launch(servers: int, server_cpus: float, server_gpus: float, max_restarts: int) -> None:
    """Refuses counts and resources out of range before anything is asked of Ray."""
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if server_cpus < 0 or server_gpus < 0 or (server_cpus == 0 and server_gpus == 0):
        raise ValueError(
            f"server_cpus and server_gpus must be >= 0 and not both 0, got {server_cpus}, "
            f"{server_gpus}"
        )
    if max_restarts < -1:
        raise ValueError(f"max_restarts must be >= -1, got {max_restarts}")


def _init_ray(ray: Any, address: str | None) -> bool:
    """Connects to Ray unless this process already is; True where it started a local
    instance it owns (and :meth:`RayServers.close` shuts down)."""
    if ray.is_initialized():
        return False
    if address not in (None, "auto", "local"):
        _check_listening(address)
    ray.init(
        address=address or "local",  # never join a cluster by accident
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        configure_logging=False,
    )
    return address is None


def _check_listening(address: str, timeout: float = 5.0) -> None:
    """Refuses a ``HOST:PORT`` (or ``ray://HOST:PORT``) ``address`` where nothing accepts
    a connection within ``timeout`` s: ``ray.init`` would retry its GCS for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # Ray's own parsing names what is wrong with it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ValueError(
            f"no Ray cluster answers at {host}:{port} (--ray {address}): "
            f"{exc.strerror or 'timed out'}; start one there with `ray start --head`, or "
            "give its address as `ray start` printed it"
        ) from None


def _start_servers(
    ray: Any,
    placement: Any,
    settings: dict[str, Any],
    curve: CurveKeys,
    owns_ray: bool,
    servers: int,
    bundle: dict[str, float],
    max_restarts: int,
    env_vars: dict[str, str] | None,
) -> RayServers:
    """Starts one server actor per bundle of ``placement`` (server ``k`` in bundle ``k``,
    holding that bundle's resources, restarted by Ray up to ``max_restarts`` times) and
    waits until every one answers; if that fails, kills them and removes the placement
    group (nothing of the run is left)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor_class = ray.remote(_ServerActor)
    actors = [
        actor_class.options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            max_restarts=max_restarts,
            runtime_env={"env_vars": dict(env_vars)} if env_vars else None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement, placement_group_bundle_index=k
            ),
        ).remote(k, settings)
        for k in range(servers)
    ]
    try:
        return RayServers(actors, placement, curve, owns_ray)  # waits for every actor
    except BaseException:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        ray.util.remove_placement_group(placement)
        raise


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in resources.items()) + " in all"


def _place(ray: Any, servers: int, bundle: dict[str, float], timeout: float) -> Any:
    """A ready placement group of ``servers`` ``bundle`` s (``SPREAD``).

    Raises:
        ValueError: the live nodes cannot hold them (nodes and totals named), or Ray
            did not place them within ``timeout`` seconds (the free resources named).
    """
    from ray.exceptions import GetTimeoutError
    from ray.util.placement_group import placement_group

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    # SPREAD packs bundles onto a node when there are fewer nodes than bundles.
    room = sum(
        min(int(node.get(k, 0.0) / v + 1e-9) for k, v in bundle.items() if v > 0) for node in nodes
    )
    needed = f"--servers {servers} needs {servers} bundles of {bundle} "
    needed += f"({_amounts({k: servers * v for k, v in bundle.items()})})"
    if room < servers:
        there = _amounts({k: sum(node.get(k, 0.0) for node in nodes) for k in bundle})
        raise ValueError(
            f"{needed}; the cluster has {len(nodes)} node(s) with {there}, room for {room} "
            "such bundle(s): start fewer servers, give each less (--server-cpus, "
            "--server-gpus) or add nodes"
        )
    placement = placement_group([dict(bundle) for _ in range(servers)], strategy="SPREAD")
    try:
        ray.get(placement.ready(), timeout=timeout)
    except GetTimeoutError:
        ray.util.remove_placement_group(placement)
        free = ray.available_resources()
        raise ValueError(
            f"{needed}; the cluster did not place them within {timeout:g} s (free now: "
            f"{_amounts({k: free.get(k, 0.0) for k in bundle})}; other work holds the rest)"
        ) from None
    except BaseException:
        ray.util.remove_placement_group(placement)
        raise
    return placement
