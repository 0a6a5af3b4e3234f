"""PPO through rollout servers: training over a stream, and losing one of two servers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from simkit.clients._server_source import spawn_servers, stop_servers
from simkit.clients._train import run_training
from simkit.clients.ppo import PPOArgs

ARGS = {
    "env_id": "simkit/CartPole-v0",
    "num_envs": 4,
    "num_steps": 16,
    "num_minibatches": 2,
    "update_epochs": 1,
    "total_steps": 0,
    "seed": 5,
}


def test_trains_through_a_local_server(tmp_path: Path) -> None:
    r = run_training(PPOArgs(**ARGS), logdir=tmp_path, servers=1, max_updates=3, tensorboard=False)
    assert r.updates == 3
    assert r.global_step == 3 * 4 * 16


def test_killed_server_is_reported_and_the_run_goes_on(tmp_path: Path, capfd) -> None:  # type: ignore[no-untyped-def]  # pytest fixture
    procs, endpoints = spawn_servers("simkit/CartPole-v0", 2)
    try:

        def kill_after_first_update() -> None:
            while not (tmp_path / "policy.safetensors").exists():
                time.sleep(0.05)
            procs[1].kill()

        killer = threading.Thread(target=kill_after_first_update, daemon=True)
        killer.start()
        r = run_training(
            PPOArgs(**ARGS),
            logdir=tmp_path,
            connect=endpoints,
            max_updates=20,
            tensorboard=False,
            server_timeout=3.0,
        )
        killer.join(timeout=5)
    finally:
        stop_servers(procs)
    err = capfd.readouterr().err
    assert f"server {endpoints[1]} stopped answering" in err
    assert "going on with 1 server(s)" in err
    assert r.updates == 20
