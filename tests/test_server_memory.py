"""A rollout server's memory stays bounded under a stream of sessions, hostile ones
included: limits are checked at open, and a closed session's memory is given back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simkit.clients import PolicyStream
from simkit.clients._server_source import spawn_servers, stop_servers
from simkit.models import ModelSpec, build_model
from simkit.protocol import RemoteError
from simkit.vector import VectorEnv


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_server_memory_stays_bounded_under_random_and_hostile_sessions() -> None:
    procs, endpoints = spawn_servers("simkit/CartPole-v0", 1)
    pid = procs[0].pid
    probe = VectorEnv("simkit/CartPole-v0", 1)
    refused: list[str] = []

    def session(hidden: list[int], num_envs: int, length: int) -> None:
        spec = ModelSpec("mlp", {"hidden_sizes": hidden})
        try:
            with PolicyStream(
                endpoints[0], spec, num_envs=num_envs, fragment_length=length, timeout=60
            ) as stream:
                stream.push_weights(
                    build_model(spec, probe.single_observation_space, probe.single_action_space)
                )
                stream.next_fragment()
        except RemoteError as exc:
            refused.append(exc.remote_code)

    try:
        session([64, 64], 8, 16)
        base = _rss_mb(pid)
        rng = np.random.default_rng(0)
        for _ in range(8):
            width, depth = int(rng.integers(16, 512)), int(rng.integers(1, 4))
            session([width] * depth, int(rng.integers(1, 256)), int(rng.integers(1, 128)))
        session([6000, 6000], 4, 8)  # a model too large
        session([64] * 65536, 4, 8)  # a model too deep
        session([64], 4096, 2**20)  # a fragment too large
        grown = _rss_mb(pid) - base
    finally:
        probe.close()
        stop_servers(procs)
    assert refused == ["invalid_field"] * 3
    assert grown < 150, f"the server grew by {grown:.0f} MB over the sessions"
