"""Rollout servers on Ray: a two-node cluster on this machine (``ray.cluster_utils``).

Servers are placed on both nodes, PPO trains through them with the parameters of an
in-process run, a killed server actor and a removed node are replaced by Ray and the
sync run ends bit-identical to an undisturbed one, and a SIGKILLed learner leaves no
server behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# One machine, no network: Ray on loopback (tests/conftest.py sets it before Ray loads).
assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0"
ray = pytest.importorskip("ray", reason="Ray is the optional extra simkit[ray]")

import simkit  # noqa: E402
import simkit.clients.launcher._launch as launch_module  # noqa: E402
from simkit.clients.learners.ppo import PPOArgs  # noqa: E402
from simkit.errors import ServerStartFailed  # noqa: E402

ARGS = {
    "env_id": "simkit/CartPole-v0",
    "num_envs": 4,
    "num_steps": 23,
    "num_minibatches": 2,
    "update_epochs": 1,
    "total_steps": 0,
    "seed": 5,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"node_ip_address": "127.0.0.1", "num_cpus": 2, "include_dashboard": False},
    )
    c.add_node(node_ip_address="127.0.0.1", num_cpus=2)
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _params(path: Path | None) -> dict[str, Any]:
    from simkit.clients.learners._checkpoint import load_checkpoint

    assert path is not None
    return dict(load_checkpoint(path).model)


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every :class:`RayServers` the runs of a test launch."""
    runs: list[Any] = []
    real = launch_module.launch

    def keep(*args: Any, **kwargs: Any) -> Any:
        servers = real(*args, **kwargs)
        runs.append(servers)
        return servers

    monkeypatch.setattr(launch_module, "launch", keep)
    return runs


def _run(path: Path, **kw: Any) -> Any:
    kw.setdefault("server_timeout", 5.0)
    return simkit.train(PPOArgs(**ARGS), logdir=path, max_rounds=4, tensorboard=False, **kw)


def test_ray_servers_spread_over_nodes_and_train_the_in_process_bits(
    cluster: Any, tmp_path: Path, launched: list[Any]
) -> None:
    ray_run = _run(tmp_path / "ray", ray=cluster.address, servers=2)
    [servers] = launched
    infos = servers.infos
    assert len({i.node_id for i in infos}) == 2  # SPREAD: one server per node
    assert all(i.endpoint.startswith("tcp://127.0.0.1:") for i in infos)
    assert servers.curve is not None  # CURVE keys made for the run
    targets = json.loads((tmp_path / "ray" / "prometheus_targets.json").read_text())
    assert [t["targets"] for t in targets] == [[i.metrics] for i in infos]
    local = _run(tmp_path / "local", servers=0)
    assert ray_run.updates == local.updates == 4
    _same(_params(local.checkpoint), _params(ray_run.checkpoint))


@pytest.mark.timeout(60, method="thread")  # the bundles used to wait forever
def test_servers_the_cluster_cannot_hold_fail_at_once_saying_what_is_needed_and_there(
    cluster: Any,
) -> None:
    """Three 2-CPU servers on two 2-CPU nodes: one line, before any actor starts."""
    before = len(ray.util.placement_group_table())
    with pytest.raises(
        ValueError,
        match=r"^--servers 3 needs 3 bundles of \{'CPU': 2\.0\} \(6 CPU in all\); the "
        r"cluster has 2 node\(s\) with 4 CPU in all, room for 2 such bundle\(s\)",
    ):
        launch_module.launch("simkit/CartPole-v0", 3, num_envs=1, server_cpus=2.0)
    with pytest.raises(ValueError, match=r"1 GPU in all\); the cluster has .* 0 GPU in all"):
        launch_module.launch("simkit/CartPole-v0", 1, num_envs=1, server_gpus=1.0)
    assert len(ray.util.placement_group_table()) == before  # nothing was asked of Ray
    # Room the cluster has but other work holds: the placement times out, same line.
    held = ray.util.placement_group([{"CPU": 2.0}, {"CPU": 2.0}], strategy="SPREAD")
    ray.get(held.ready(), timeout=30)
    try:
        with pytest.raises(
            ValueError, match=r"did not place them within 1 s \(free now: 0 CPU in all;"
        ):
            launch_module.launch("simkit/CartPole-v0", 1, num_envs=1, placement_timeout=1.0)
    finally:
        ray.util.remove_placement_group(held)


def test_a_server_actor_that_dies_starting_is_one_line_naming_its_error(cluster: Any) -> None:
    """An env the server's node cannot build: Ray's ``ActorDiedError`` (an 87-line
    traceback out of ``simkit train``) is a ``ServerStartFailed`` with the actor's own
    last line, and nothing of the launch is left."""
    before = {p["placement_group_id"] for p in _live_groups()}
    with pytest.raises(ServerStartFailed) as info:
        launch_module.launch("simkit/CartPole-v0", 1, num_envs=1, env_kwargs={"bogus": 1})
    message = str(info.value)
    assert message.startswith("rollout server 0 did not start on Ray: ")
    assert "bogus" in message
    assert "\n" not in message
    assert {p["placement_group_id"] for p in _live_groups()} <= before


def _live_groups() -> list[dict[str, Any]]:
    return [p for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"]


def _kill_during_second_update(monkeypatch: pytest.MonkeyPatch, kill: Any) -> None:
    import simkit.clients.learners._run as train_module  # the run writes the policy snapshots

    save_policy = train_module.save_policy
    calls: list[int] = []

    def save_then_kill(*args: Any, **kwargs: Any) -> None:
        save_policy(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            kill()

    monkeypatch.setattr(train_module, "save_policy", save_then_kill)


def test_a_killed_server_actor_is_restarted_and_the_run_ends_exactly(
    cluster: Any, tmp_path: Path, launched: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calm = _run(tmp_path / "calm", ray=cluster.address, servers=2)

    def kill() -> None:
        os.kill(launched[-1].infos[1].pid, signal.SIGKILL)

    _kill_during_second_update(monkeypatch, kill)
    hit = _run(tmp_path / "hit", ray=cluster.address, servers=2)
    servers = launched[-1]
    assert servers.restarts == [0, 1]
    assert hit.updates == calm.updates == 4
    # One view of the servers: alive, restarted, per share throughput and lag.
    last = json.loads((tmp_path / "hit" / "progress.jsonl").read_text().splitlines()[-1])
    view = last["servers"]
    assert (view["alive"], view["restarted"], view["lost"]) == (2, 1, 0)
    assert [s["first_slot"] for s in view["servers"]] == [0, 2]
    assert view["servers"][1]["endpoint"] == servers.endpoints[1]
    assert all(s["steps_per_s"] > 0 for s in view["servers"])
    _same(_params(calm.checkpoint), _params(hit.checkpoint))


def _during_second_fragment(monkeypatch: pytest.MonkeyPatch, hit: Any) -> None:
    """Calls ``hit()`` right after the second weights went out: the servers are
    rolling out that version's fragment."""
    from simkit.clients.learners._server_source import ServerSource

    push_weights = ServerSource.push_weights
    calls: list[int] = []

    def push_then_hit(self: ServerSource, *args: Any, **kwargs: Any) -> int:
        version = push_weights(self, *args, **kwargs)
        calls.append(version)
        if len(calls) == 2:
            hit()
        return version

    monkeypatch.setattr(ServerSource, "push_weights", push_then_hit)


def test_a_removed_nodes_server_comes_back_on_the_other_node(
    cluster: Any, tmp_path: Path, launched: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node goes while a fragment is in flight, and the learner asks Ray for the
    server soon after (``server_timeout`` 2 s), while Ray still re-places the actor
    (``ActorUnavailableError``): the learner waits for it instead of giving it up."""
    cluster.add_node(node_ip_address="127.0.0.1", num_cpus=2)  # room left after a removal
    cluster.wait_for_nodes()
    calm = _run(tmp_path / "calm", ray=cluster.address, servers=2)
    victim: list[str] = []

    def remove_a_servers_node() -> None:
        hosting = {i.node_id: i.pid for i in launched[-1].infos}
        node = next(n for n in cluster.worker_nodes if n.node_id in hosting)
        victim.append(node.node_id)
        # The node crashes: its raylet is SIGKILLed (Ray learns of it only when its
        # health checks fail), and so is the server on it (a worker would otherwise
        # outlive its raylet for a while).
        cluster.remove_node(node, allow_graceful=False)
        with contextlib.suppress(ProcessLookupError):
            os.kill(hosting[node.node_id], signal.SIGKILL)

    _during_second_fragment(monkeypatch, remove_a_servers_node)
    hit = _run(tmp_path / "hit", ray=cluster.address, servers=2, server_timeout=2.0)
    assert victim
    assert all(i.node_id != victim[0] for i in launched[-1].infos)
    assert sum(launched[-1].restarts) == 1
    assert (hit.updates, hit.global_step) == (calm.updates, calm.global_step)
    _same(_params(calm.checkpoint), _params(hit.checkpoint))


def test_a_sigkilled_learner_leaves_no_ray_server_behind(tmp_path: Path) -> None:
    """The learner starts its own local Ray instance; SIGKILL it and every process of
    that instance (the server actors included) is gone within seconds."""
    logdir = tmp_path / "run"
    err = (tmp_path / "stderr").open("w")
    learner = subprocess.Popen(
        [
            *(sys.executable, "-m", "simkit", "train", "simkit/CartPole-v0", "--ray"),
            *("--servers", "1", "--num-envs", "2", "--num-steps", "16"),
            *("--num-minibatches", "2", "--update-epochs", "1", "--total-steps", "0"),
            *("--no-progress", "--logdir", str(logdir)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=err,
        env={
            **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},  # not the fixture's
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        },
    )
    targets = logdir / "prometheus_targets.json"
    deadline = time.monotonic() + 120
    while not (targets.exists() and (logdir / "progress.jsonl").exists()):
        if learner.poll() is not None:
            err.close()
            pytest.fail((tmp_path / "stderr").read_text()[-2000:])
        assert time.monotonic() < deadline, "the learner did not start training in 120 s"
        time.sleep(0.2)
    [target] = json.loads(targets.read_text())
    server_pid = int(target["labels"]["pid"])
    os.kill(server_pid, 0)  # alive
    learner.kill()
    learner.wait()
    err.close()
    deadline = time.monotonic() + 20
    while _alive(server_pid):
        assert time.monotonic() < deadline, f"server {server_pid} outlived its learner by 20 s"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_sac_on_ray_servers_trains_the_bits_of_local_servers(cluster: Any, tmp_path: Path) -> None:
    import simkit
    from simkit.clients.learners._args import SACArgs

    args = SACArgs(
        env_id="simkit/Pendulum-v0",
        seed=3,
        total_steps=240,
        num_envs=2,
        num_steps=4,
        buffer_size=500,
        batch_size=16,
        learning_starts=40,
        hidden=(16, 16),
    )
    on_ray = simkit.train(
        args, logdir=tmp_path / "ray", ray=cluster.address, servers=2, tensorboard=False
    )
    local = simkit.train(args, logdir=tmp_path / "local", servers=2, tensorboard=False)
    assert on_ray.global_step == local.global_step == 240
    assert on_ray.updates == local.updates > 0
    _same(_params(local.checkpoint), _params(on_ray.checkpoint))


@pytest.mark.parametrize("fails", ["_place", "_start_servers"])
def test_a_launch_that_fails_shuts_down_the_ray_it_started(
    fails: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Placement or the servers' start failing: the local Ray instance ``launch`` started
    for itself is shut down (nothing of the run is left); one it joined stays."""

    class FakeRay:
        def __init__(self, initialized: bool) -> None:
            self.initialized = initialized
            self.shut_down = False

        def is_initialized(self) -> bool:
            return self.initialized

        def init(self, **kwargs: Any) -> None:
            self.initialized = True

        def shutdown(self) -> None:
            self.shut_down = True

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"{fails} failed")

    monkeypatch.setattr(launch_module, "_place", lambda *a, **k: object())
    monkeypatch.setattr(launch_module, "_start_servers", lambda *a, **k: object())
    monkeypatch.setattr(launch_module, fails, fail)
    for initialized, owned in ((False, True), (True, False)):
        fake = FakeRay(initialized)
        monkeypatch.setattr(launch_module, "require", lambda *a, fake=fake, **k: fake)
        with pytest.raises(ValueError, match=f"{fails} failed"):
            launch_module.launch("simkit/CartPole-v0", 1, num_envs=1)
        assert fake.shut_down is owned


@pytest.mark.timeout(30, method="thread")
@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1"])
def test_a_ray_address_with_nothing_listening_fails_at_once(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--ray HOST:PORT`` with no cluster there waited minutes in ``ray.init`` (its GCS
    retries) before failing with Ray's log lines: one line, before Ray is asked."""

    class NoInit:
        def is_initialized(self) -> bool:
            return False

        def init(self, **kwargs: Any) -> None:
            raise AssertionError("ray.init was called")

    monkeypatch.setattr(launch_module, "require", lambda *a, **k: NoInit())
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"^no Ray cluster answers at 127\.0\.0\.1:1 \(--ray "):
        launch_module.launch("simkit/CartPole-v0", 1, num_envs=1, address=address)
    assert time.monotonic() - started < 10
