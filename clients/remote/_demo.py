"""The remote part of ``simkit demo``: serve an env in a subprocess, step it remotely.

:func:`remote_demo` starts ``simkit serve`` on a temporary ipc endpoint, connects a
:class:`RemoteVectorEnv`, checks it against a local :class:`simkit.vector.VectorEnv`
(same seed and actions, bit for bit), and reports throughput and loop latency of both.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from simkit.clients.remote._vector import RemoteVectorEnv
from simkit.vector import VectorEnv

__all__ = ["DemoFigures", "remote_demo"]


@dataclass(frozen=True)
class DemoFigures:
    """What :func:`remote_demo` measured.

    Attributes:
        env_id: the env stepped.
        num_envs: envs per vector.
        steps: vector steps timed per side.
        local_steps_per_s: env steps/s of the local vector.
        remote_steps_per_s: env steps/s of the remote vector.
        local_p50_ms / remote_p50_ms / remote_p99_ms: per-step loop latency (action
            sent to observation received).
        identical: remote and local gave identical observations and rewards.
    """

    env_id: str
    num_envs: int
    steps: int
    local_steps_per_s: float
    remote_steps_per_s: float
    local_p50_ms: float
    remote_p50_ms: float
    remote_p99_ms: float
    identical: bool

    def table(self) -> str:
        """A markdown table of the figures."""
        return "\n".join(
            [
                f"{self.env_id}, N={self.num_envs}, {self.steps} steps "
                f"(remote equals local bit for bit: {'yes' if self.identical else 'NO'})",
                "",
                "| vector | steps/s | loop p50 ms | loop p99 ms |",
                "|---|---:|---:|---:|",
                f"| local simkit.vector | {self.local_steps_per_s:,.0f} "
                f"| {self.local_p50_ms:.3f} | - |",
                f"| remote (simkit serve, ipc) | {self.remote_steps_per_s:,.0f} "
                f"| {self.remote_p50_ms:.3f} | {self.remote_p99_ms:.3f} |",
            ]
        )


def _run(env: Any, actions: list[Any]) -> tuple[float, list[float], list[np.ndarray]]:
    times, obs = [], []
    start = time.perf_counter()
    for act in actions:
        t = time.perf_counter()
        step = env.step_batch(act)
        times.append(time.perf_counter() - t)
        obs.append(np.concatenate([np.ravel(step.obs), step.reward]))
    return time.perf_counter() - start, times, obs


def remote_demo(
    env_id: str = "simkit/CartPole-v0", num_envs: int = 16, steps: int = 300, seed: int = 0
) -> DemoFigures:
    """Serves ``env_id`` in a subprocess, steps it remotely and locally, measures both.

    Raises:
        ServerUnavailable: the server subprocess did not come up within 60 s.
    """
    tmp = tempfile.mkdtemp(prefix="simkit-demo-")
    endpoint = f"ipc://{tmp}/demo.sock"
    cmd = [sys.executable, "-m", "simkit.servers", env_id, "--num-envs", str(num_envs)]
    proc = subprocess.Popen(
        [*cmd, "--bind", endpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        remote = RemoteVectorEnv(endpoint, timeout=60)
        remote.timeout = 10
        local = VectorEnv(env_id, num_envs)
        try:
            space = local.action_space
            space.seed(seed)
            actions = [space.sample() for _ in range(steps)]
            local.reset(seed=seed)
            remote.reset(seed=seed)
            local_s, local_t, local_obs = _run(local, actions)
            remote_s, remote_t, remote_obs = _run(remote, actions)
        finally:
            remote.close()
            local.close()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    identical = all(np.array_equal(a, b) for a, b in zip(local_obs, remote_obs, strict=True))
    return DemoFigures(
        env_id=env_id,
        num_envs=num_envs,
        steps=steps,
        local_steps_per_s=steps * num_envs / local_s,
        remote_steps_per_s=steps * num_envs / remote_s,
        local_p50_ms=float(np.percentile(local_t, 50)) * 1e3,
        remote_p50_ms=float(np.percentile(remote_t, 50)) * 1e3,
        remote_p99_ms=float(np.percentile(remote_t, 99)) * 1e3,
        identical=identical,
    )
