"""Where the GPU pays for the update: ``--device auto``'s own probe
(``clients/learners/_device_pick.py``) over a sweep of batch and model sizes, on every
candidate device of this machine, as a markdown table on stdout::

    .venv/bin/python bench/bench_device_pick.py           # the sweep (about 30 s on a GPU machine)
    .venv/bin/python bench/bench_device_pick.py --quick   # two small rows (the CPU dry run)

Rows: the PPO minibatch step (the run's loss, backward, gradient clip and Adam, as a
CUDA graph on CUDA) at minibatch sizes of 64 to 32,768 samples with 64x64 and 256x256
MLPs, and SAC's gradient step (256x256) at batches of 256 and 2,048, on Cheetah-sized
spaces (17 observations, 6 actions). Each cell is the probe's median milliseconds per
step, the CPU timed with ``--threads`` torch threads (``simkit train``'s default: 1);
"auto picks" is the device a run of that size would train on. On a machine without
CUDA only the CPU is timed and auto has nothing to choose.
"""

from __future__ import annotations

import argparse

import torch

from simkit.clients.learners._args import PPOArgs, SACArgs
from simkit.clients.learners._device_pick import Probe, candidates
from simkit.clients.learners._train_sac import build_actor
from simkit.clients.learners.ppo import build_model, ppo_probe
from simkit.clients.learners.sac import sac_probe
from simkit.models._threads import set_compute_threads

ENV = "simkit/Cheetah-v0"


def _ppo(minibatch: int, hidden: tuple[int, ...]) -> tuple[Probe, int]:
    """The PPO probe of a run whose minibatches hold ``minibatch`` samples."""
    args = PPOArgs(
        env_id=ENV, num_envs=1, num_steps=4 * minibatch, num_minibatches=4, hidden=hidden
    )
    return ppo_probe(args, build_model(args), 1)


def _sac(batch: int, hidden: tuple[int, ...]) -> tuple[Probe, int]:
    """SAC's probe at batch size ``batch``."""
    args = SACArgs(env_id=ENV, batch_size=batch, hidden=hidden)
    return sac_probe(args, build_actor(args))


def main() -> int:
    """Prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small rows")
    parser.add_argument("--threads", type=int, default=1, help="CPU torch threads (0: all)")
    ns = parser.parse_args()
    if ns.threads:
        set_compute_threads(ns.threads)
    found = candidates()
    names = [str(d) for d in found]
    rows: list[tuple[str, tuple[Probe, int]]] = []
    ppo_sizes = [64, 512] if ns.quick else [64, 512, 4096, 32768]
    ppo_hidden = [(64, 64)] if ns.quick else [(64, 64), (256, 256)]
    for hidden in ppo_hidden:
        for mb in ppo_sizes:
            rows.append((f"PPO minibatch step, {'x'.join(map(str, hidden))}", _ppo(mb, hidden)))
    for batch in [] if ns.quick else [256, 2048]:
        rows.append(("SAC gradient step, 256x256", _sac(batch, (256, 256))))
    print(f"torch {torch.__version__}, CPU threads {torch.get_num_threads()}, devices: {names}")
    print()
    print(f"| step | samples | {' | '.join(f'{n} ms' for n in names)} | auto picks |")
    print(f"|---|---:|{'---:|' * len(names)}---|")
    for label, made in rows:
        probe, samples = made
        ms = [1e3 * probe(d) for d in found]
        pick = names[ms.index(min(ms))] if len(found) > 1 else f"{names[0]} (no CUDA: no probe)"
        cells = " | ".join(f"{m:.3f}" for m in ms)
        print(f"| {label} | {samples:,} | {cells} | {pick} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
