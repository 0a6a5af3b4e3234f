"""CPU time per batch step of the execution core's hot paths, for before/after checks.

Prints one JSON line of µs per batch step (``time.process_time``: CPU time of all
threads, steadier than wall time on a loaded machine). Run it alternately against two
checkouts and compare medians; ``SIMKIT_TREE`` names a tree laid out as the installed
package (``<tree>/simkit`` with ``envs``, ``servers`` and ``clients`` linked inside),
which then shadows the editable install::

    git archive <rev> | tar -x -C /tmp/before/src
    mkdir -p /tmp/before/tree/simkit
    for f in /tmp/before/src/simkit/*; do ln -s "$f" /tmp/before/tree/simkit/; done
    for d in envs servers clients; do ln -s /tmp/before/src/$d /tmp/before/tree/simkit/$d; done
    for r in 1 2 3 4 5; do
        SIMKIT_TREE=/tmp/before/tree .venv/bin/python bench/bench_core_ab.py
        .venv/bin/python bench/bench_core_ab.py
    done
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

TREE = os.environ.get("SIMKIT_TREE")
if TREE:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    sys.path.insert(0, TREE)

import numpy as np  # noqa: E402  (after the path set-up above)

import simkit  # noqa: E402


def balance(obs: Any) -> np.ndarray:
    o = np.asarray(obs)
    return (o[:, 2] + 0.5 * o[:, 3] > 0).astype(np.int32)


def timed(steps: int, body: Callable[[], object]) -> float:
    t = time.process_time()
    body()
    return (time.process_time() - t) / steps * 1e6


def batch_cartpole(n: int, steps: int, policy: str) -> float:
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=n)
    rand = np.random.default_rng(1).integers(0, 2, (steps, n))
    env.reset(seed=0)

    def body() -> None:
        obs = env.step_batch(rand[0]).obs
        for a in rand[1:]:
            obs = env.step_batch(a if policy == "random" else balance(obs)).obs

    return timed(steps, body)


def batch_cheetah(n: int, steps: int) -> float:
    env = simkit.make("simkit/BatchCheetah-v0", num_envs=n)
    acts = np.random.default_rng(1).uniform(-1, 1, (steps, n, 6)).astype(np.float32)
    env.reset(seed=0)
    return timed(steps, lambda: [env.step_batch(a) for a in acts])


def vector_cartpole(n: int, steps: int) -> float:
    from simkit.vector import VectorEnv

    vec = VectorEnv("simkit/CartPole-v0", n)
    vec.reset(seed=0)
    rand = np.random.default_rng(1).integers(0, 2, (steps, n))
    return timed(steps, lambda: [vec.step_batch(a) for a in rand])


def host_cartpole(n: int, steps: int) -> float:
    from simkit.protocol import ResetRequest
    from simkit.servers import EnvListHost

    host = EnvListHost([simkit.make("simkit/CartPole-v0") for _ in range(n)])
    ids = np.arange(n, dtype=np.int64)
    host.reset(ResetRequest(ids, seed=0))
    rand = np.random.default_rng(1).integers(0, 2, (steps, n))
    return timed(steps, lambda: [host.step(ids, a) for a in rand])


def main() -> None:
    rows = {
        "BatchCartPole N=256 random": lambda: batch_cartpole(256, 600, "random"),
        "BatchCartPole N=256 balance": lambda: batch_cartpole(256, 600, "balance"),
        "BatchCartPole N=16 random": lambda: batch_cartpole(16, 1500, "random"),
        "BatchCheetah N=64": lambda: batch_cheetah(64, 150),
        "BatchCheetah N=256": lambda: batch_cheetah(256, 60),
        "VectorEnv CartPole N=16": lambda: vector_cartpole(16, 400),
        "EnvListHost CartPole N=1": lambda: host_cartpole(1, 3000),
        "EnvListHost CartPole N=16": lambda: host_cartpole(16, 800),
    }
    print(json.dumps({name: round(run(), 1) for name, run in rows.items()}))


if __name__ == "__main__":
    main()
