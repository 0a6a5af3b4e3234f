"""RowPolicy's static act path: buffers per batch shape, a captured forward, in-place weights.

On the CPU the structure runs with ``eager_capture`` (no graph; the buffers, the cache
per batch shape and the weight checks are the CUDA path's); the CUDA tests compare the
graphed path with the eager one on the same device and skip without CUDA.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from stream_helpers import assert_same_fragment, weights_version

from simkit.models import ModelSpec, build_model
from simkit.rollout._policy import PolicyOutput, RowPolicy
from simkit.rollout._static_act import cuda_graph_capture, eager_capture

OBS = spaces.Box(-5.0, 5.0, (5,), np.float32)
SPACES: dict[str, spaces.Space[Any]] = {
    "box": spaces.Box(-1.0, 1.0, (3,), np.float32),
    "discrete": spaces.Discrete(4),
    "multidiscrete": spaces.MultiDiscrete([3, 2]),
}
CUDA = torch.cuda.is_available()


class Counting:
    """A capture that counts its calls (one per batch shape) and replays eagerly."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fill: Callable[[], None], device: torch.device) -> Callable[[], None]:
        self.calls += 1
        return eager_capture(fill, device)


def _policy(
    act_space: spaces.Space[Any], device: torch.device, n: int = 40, **kw: Any
) -> RowPolicy:
    torch.manual_seed(0)
    model = build_model(ModelSpec("mlp", {"hidden_sizes": [16, 16]}), OBS, act_space)
    policy = RowPolicy(
        model,
        device,
        seed=7,
        first_slot=3,
        num_slots=n,
        rows_per_slot=1,
        action_space=act_space,
        lean=False,
        **kw,
    )
    policy.set_weights(weights_version(model, 0))  # normalisation statistics too
    return policy


def _obs(n: int = 40, seed: int = 2, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 5)).astype(dtype)


def _same(got: PolicyOutput, want: PolicyOutput) -> None:
    for name in ("actions", "log_probs", "values"):
        g, w = getattr(got, name), getattr(want, name)
        assert g.dtype == w.dtype, name
        assert g.shape == w.shape, name
        assert g.tobytes() == w.tobytes(), name


@pytest.mark.parametrize("kind", list(SPACES))
def test_the_static_path_acts_as_the_eager_path_whole_and_by_parts(kind: str) -> None:
    cpu = torch.device("cpu")
    capture = Counting()
    static = _policy(SPACES[kind], cpu, capture=capture)
    eager = _policy(SPACES[kind], cpu)
    assert static.static is not None
    assert eager.static is None
    for step in (0, 1, 9):
        obs = _obs(seed=step)
        _same(static.act(obs, step), eager.act(obs, step))
        for part in (slice(0, 20), slice(20, 40)):
            _same(static.act(obs[part], step, part), eager.act(obs[part], step, part))
    assert capture.calls == 2  # 40 rows and 20 rows: one capture per batch shape


def test_one_plan_per_batch_shape_with_its_buffers_kept_across_steps() -> None:
    cpu = torch.device("cpu")
    capture = Counting()
    policy = _policy(SPACES["box"], cpu, capture=capture)
    assert policy.static is not None
    policy.act(_obs(), 0)
    (plan,) = policy.static.plans.values()
    buffers = [t.data_ptr() for t in (plan.host_obs, plan.obs, plan.noise, plan.out, plan.host_out)]
    first = policy.act(_obs(seed=5), 1)
    again = policy.act(_obs(seed=5), 1)
    assert list(policy.static.plans.values()) == [plan]
    assert buffers == [
        t.data_ptr() for t in (plan.host_obs, plan.obs, plan.noise, plan.out, plan.host_out)
    ]
    assert capture.calls == 1
    _same(again, first)  # outputs are copies: the next act does not overwrite them
    assert not np.shares_memory(first.actions, plan.host_out.numpy())


def test_float64_observations_are_acted_on_as_float32_as_the_eager_path_does() -> None:
    cpu = torch.device("cpu")
    static = _policy(SPACES["box"], cpu, capture=eager_capture)
    eager = _policy(SPACES["box"], cpu)
    obs = _obs(dtype=np.float64) * 1.1  # values that round
    _same(static.act(obs, 3), eager.act(obs, 3))
    assert static.static is not None
    (plan,) = static.static.plans.values()
    assert plan.obs.dtype == torch.float32


@pytest.mark.parametrize("load", ["set_weights", "load_state_dict"])
def test_weights_are_swapped_in_place_into_the_captured_tensors(load: str) -> None:
    """A weight swap copies into the model's own parameters and statistics: the plans
    (and their graphs) stay and act with the new weights, without a capture."""
    cpu = torch.device("cpu")
    capture = Counting()
    static = _policy(SPACES["discrete"], cpu, capture=capture)
    eager = _policy(SPACES["discrete"], cpu)
    obs = _obs()
    static.act(obs, 0)
    assert static.static is not None
    where = [t.data_ptr() for t in static.model.state_dict().values()]
    new = weights_version(static.model, 1)
    for policy in (static, eager):
        if load == "set_weights":
            policy.set_weights(new)
        else:
            tensors = {k: torch.from_numpy(v.copy()) for k, v in new.tensors.items()}
            policy.load_state_dict(tensors, 1)
    assert [t.data_ptr() for t in static.model.state_dict().values()] == where
    rms = static.model.obs_rms
    assert rms is not None
    assert rms.mean.abs().sum() > 0
    _same(static.act(obs, 1), eager.act(obs, 1))
    assert capture.calls == 1
    assert len(static.static.plans) == 1


def test_a_parameter_whose_storage_was_replaced_drops_the_plans() -> None:
    cpu = torch.device("cpu")
    capture = Counting()
    static = _policy(SPACES["box"], cpu, capture=capture)
    eager = _policy(SPACES["box"], cpu)
    obs = _obs()
    static.act(obs, 0)
    param = next(static.model.parameters())
    param.data = param.data.clone()  # a graph would still read the old storage
    new = weights_version(static.model, 1)
    static.set_weights(new)
    eager.set_weights(new)
    assert static.static is not None
    assert not static.static.plans
    _same(static.act(obs, 1), eager.act(obs, 1))
    assert capture.calls == 2


def test_the_cpu_keeps_its_paths_and_only_cuda_graphs_by_default() -> None:
    cpu = torch.device("cpu")
    assert _policy(SPACES["box"], cpu).static is None
    lean = RowPolicy(
        build_model(ModelSpec("mlp", {"hidden_sizes": [8]}), OBS, SPACES["box"]),
        cpu,
        seed=0,
        first_slot=0,
        num_slots=4,
        rows_per_slot=1,
        action_space=SPACES["box"],
    )
    assert lean.static is None
    assert lean.lean is not None


def test_a_forward_that_cannot_be_captured_runs_eagerly_on_the_buffers() -> None:
    def refuse(fill: Callable[[], None], device: torch.device) -> Callable[[], None]:
        raise RuntimeError("operation not permitted when stream is capturing")

    cpu = torch.device("cpu")
    static = _policy(SPACES["box"], cpu, capture=refuse)
    eager = _policy(SPACES["box"], cpu)
    obs = _obs()
    _same(static.act(obs, 2), eager.act(obs, 2))
    assert static.static is not None
    (plan,) = static.static.plans.values()
    assert plan.fallback is not None
    assert "not permitted" in plan.fallback


@pytest.mark.parametrize("explore", [1.0, 0.0])
def test_the_sac_actor_samples_without_reading_the_device(
    explore: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SAC actor's exploration switch is a tensor select, not a branch on a value
    read back (which would stall every CUDA step and cannot be captured): the same bits
    as the branch it replaces."""
    from simkit.models._sac import SquashedGaussianHead

    torch.manual_seed(0)
    model = build_model(ModelSpec("sac_mlp", {"hidden_sizes": [8]}), OBS, SPACES["box"])
    head = model.head
    assert isinstance(head, SquashedGaussianHead)
    head.explore.fill_(explore)
    params = head(model.actor(model.encoder(model.preprocess(_obs(6))))).detach()
    noise = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    if explore:
        u = 0.5 * (1.0 + torch.erf(noise * (1.0 / np.sqrt(2.0))))
        want = (head.bias + head.scale * (2.0 * u - 1.0), -torch.log(2.0 * head.scale).sum())
    else:
        want = head.rsample(params, noise)
    want = (want[0].detach(), want[1].detach())

    def no_reads(*args: Any) -> Any:
        raise AssertionError("a value was read back from the tensor")

    monkeypatch.setattr(torch.Tensor, "__bool__", no_reads)
    monkeypatch.setattr(torch.Tensor, "item", no_reads)
    with torch.no_grad():
        actions, log_probs = head.sample_noise(params, noise)
    monkeypatch.undo()
    assert actions.numpy().tobytes() == want[0].numpy().tobytes()
    assert log_probs.shape == (6,)
    assert log_probs.numpy().tobytes() == want[1].expand(6).numpy().tobytes()


def _loop(env_id: str, n: int, *, halves: bool, **kw: Any) -> Any:
    """A RolloutLoop of ``n`` envs (episodes truncated at 5 steps) with a model.act policy."""
    from simkit.rollout._loop import RolloutLoop
    from simkit.rollout._rows import make_env_rows

    envs = make_env_rows(env_id, n, env_kwargs={"max_episode_steps": 5}, halves=halves)
    if halves:
        envs.split()
    torch.manual_seed(0)
    model = build_model(
        ModelSpec("mlp", {"hidden_sizes": [16, 16]}), envs.observation_space, envs.action_space
    )
    policy = RowPolicy(
        model,
        torch.device("cpu"),
        seed=3,
        first_slot=0,
        num_slots=n,
        rows_per_slot=1,
        action_space=envs.action_space,
        lean=False,
        **kw,
    )
    return RolloutLoop(envs, policy, fragment_length=6)


@pytest.mark.parametrize(
    ("env_id", "halves"),
    [
        ("simkit/CartPole-v0", False),
        ("simkit/BatchCheetah-v0", False),
        ("simkit/BatchCheetah-v0", True),
    ],
)
def test_a_loop_on_the_static_path_streams_the_eager_loops_fragments(
    env_id: str, halves: bool
) -> None:
    """Final values queued on the static path (written after the next act) and a weight
    swap between steps: the fragments of the eager loop, bit for bit."""
    loops = [_loop(env_id, 6, halves=halves, capture=c) for c in (eager_capture, None)]
    got: list[list[Any]] = [[], []]
    for loop, out in zip(loops, got, strict=True):
        weights = [weights_version(loop.policy.model, v) for v in range(2)]
        loop.policy.set_weights(weights[0])
        loop.reset(9, 0)
        for step in range(18):
            if step == 8:
                loop.set_weights(weights[1])
            fragment = loop.step()
            if fragment is not None:
                out.append(fragment)
        loop.envs.close()
    assert loops[0].policy.static is not None
    assert loops[1].policy.static is None
    assert len(got[0]) == 3
    assert any(f.final_values.any() for f in got[0])
    for a, b in zip(*got, strict=True):
        assert_same_fragment(a, b)


def test_final_values_on_the_static_path_wait_once_per_fragment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The value forward of the truncations is not run step by step: the loop computes
    the final values of every step since the last weight change in one batch, at the
    fragment's end (or before a weight change), so a step waits for the device once
    (its act) and a fragment once more."""
    loop = _loop("simkit/CartPole-v0", 4, halves=False, capture=eager_capture)
    policy = loop.policy
    events: list[str] = []
    act, static = policy.act, policy._value_static

    def logged_act(*args: Any, **kw: Any) -> Any:
        events.append("act")
        return act(*args, **kw)

    def logged_static(obs: Any, rows: Any) -> Any:
        events.append(f"values of {int(rows.sum())} rows")
        return static(obs, rows)

    monkeypatch.setattr(policy, "act", logged_act)
    monkeypatch.setattr(policy, "_value_static", logged_static)
    policy.set_weights(weights_version(policy.model, 0))
    loop.reset(1, 0)
    for _ in range(5):  # every episode is truncated at step 5
        assert loop.step() is None
    assert events == ["act"] * 5
    fragment = loop.step()  # the sixth step ends the fragment
    assert fragment is not None
    # One batch of the truncated rows, then the last values (every row).
    assert events[5:] == ["act", "values of 4 rows", "values of 4 rows"]
    assert fragment.final_values[4].all()
    loop.envs.close()


# ------------------------------------------------------------------------------ CUDA

needs_cuda = pytest.mark.skipif(
    not CUDA, reason="needs a CUDA device (runs in bench/device_check.sh)"
)


@needs_cuda
@pytest.mark.parametrize("kind", list(SPACES))
def test_graphed_act_on_cuda_equals_eager_on_cuda_bit_for_bit(kind: str) -> None:
    cuda = torch.device("cuda")
    graphed = _policy(SPACES[kind], cuda)
    eager = _policy(SPACES[kind], cuda, graphs=False)
    assert graphed.static is not None
    assert graphed.static.capture is cuda_graph_capture
    assert eager.static is None
    for step in range(6):
        if step == 3:  # a swap in place: the graphs read the new weights and statistics
            new = weights_version(graphed.model, 1)
            graphed.set_weights(new)
            eager.set_weights(new)
        obs = _obs(seed=step)
        _same(graphed.act(obs, step), eager.act(obs, step))
        for part in (slice(0, 20), slice(20, 40)):
            _same(graphed.act(obs[part], step, part), eager.act(obs[part], step, part))
    assert len(graphed.static.plans) == 2


@needs_cuda
def test_a_serve_session_on_cuda_streams_the_eager_cuda_fragments() -> None:
    """A stream session on CUDA (graphed act) gives the fragments of the same loop with
    the eager act on CUDA, truncations (final values) and a weight swap included."""
    from simkit.clients import PolicyStream
    from simkit.rollout._loop import RolloutLoop
    from simkit.rollout._rows import make_env_rows
    from simkit.servers import RolloutServer

    env_id, n, length, seed = "simkit/CartPole-v0", 6, 8, 11
    kwargs = {"max_episode_steps": 5}
    spec = ModelSpec("mlp", {"hidden_sizes": [16, 16]})
    envs = make_env_rows(env_id, n, env_kwargs=kwargs)
    model = build_model(spec, envs.observation_space, envs.action_space)
    weights = [weights_version(model, v) for v in range(2)]
    policy = RowPolicy(
        model,
        torch.device("cuda"),
        seed=seed,
        first_slot=0,
        num_slots=n,
        rows_per_slot=1,
        action_space=envs.action_space,
        graphs=False,
    )
    loop = RolloutLoop(envs, policy, fragment_length=length)
    loop.reset(seed, 0)
    want = []
    for w in weights:
        loop.set_weights(w)
        fragment = None
        while fragment is None:
            fragment = loop.step()
        want.append(fragment)
    envs.close()
    with (
        RolloutServer(
            env_id,
            n,
            "tcp://127.0.0.1:0",
            policy=True,
            device="cuda",
            fragment_length=length,
            env_kwargs=kwargs,
        ) as server,
        PolicyStream(server.endpoint, spec, num_envs=n, seed=seed, timeout=60) as stream,
    ):
        got = []
        for w in weights:
            stream.push_weights(w)
            got.append(stream.next_batch())
    assert any(f.truncated.any() for f in want)
    for a, b in zip(got, want, strict=True):
        assert_same_fragment(a, b)


@needs_cuda
def test_a_sac_actor_on_cuda_is_graphed_and_follows_its_explore_flag() -> None:
    """The SAC actor's forward is captured (no read-back in it) and the exploration flag,
    a buffer swapped in place with the weights, switches the graph's samples."""
    from simkit.models import get_weights

    cuda = torch.device("cuda")
    torch.manual_seed(0)
    model = build_model(ModelSpec("sac_mlp", {"hidden_sizes": [16]}), OBS, SPACES["box"])
    kw: dict[str, Any] = {
        "seed": 7,
        "first_slot": 0,
        "num_slots": 40,
        "rows_per_slot": 1,
        "action_space": SPACES["box"],
    }
    graphed = RowPolicy(copy.deepcopy(model), cuda, **kw)
    eager = RowPolicy(copy.deepcopy(model), cuda, graphs=False, **kw)
    obs = _obs()
    for version, explore in enumerate((1.0, 0.0)):
        with torch.no_grad():
            model.head.explore.fill_(explore)
        weights = get_weights(model, version)  # the flag travels with the weights
        graphed.set_weights(weights)
        eager.set_weights(weights)
        _same(graphed.act(obs, version), eager.act(obs, version))
    assert graphed.static is not None
    (plan,) = graphed.static.plans.values()
    assert plan.fallback is None


def _local_fragments(device: str | None, **kw: Any) -> list[Any]:
    """Two sync fragments (a weight push between) of an in-process CartPole source."""
    from simkit.clients.learners._sources import LocalSource

    torch.manual_seed(0)
    spec = ModelSpec("mlp", {"hidden_sizes": [16, 16]})
    model = build_model(spec, spaces.Box(-5.0, 5.0, (4,), np.float32), spaces.Discrete(2))
    source = LocalSource(
        "simkit/CartPole-v0", model, num_envs=6, num_steps=8, seed=5, device=device, **kw
    )
    try:
        out = []
        for version in range(2):
            weights = weights_version(model, version)
            with torch.no_grad():
                for name, t in model.state_dict().items():
                    t.copy_(torch.from_numpy(weights.tensors[name]))
            source.push_weights(model, version=version)
            out.append(source.rollout())
        return out
    finally:
        source.close()


def test_the_in_process_source_takes_the_policys_device() -> None:
    """``LocalSource(device=...)`` puts the rollout's policy there; the CPU keeps its
    LeanMLP path and its fragments."""
    from simkit.clients.learners._sources import LocalSource

    model = build_model(ModelSpec("mlp", {"hidden_sizes": [8]}), OBS, SPACES["box"])
    source = LocalSource(
        "simkit/BatchCheetah-v0", model, num_envs=2, num_steps=4, seed=0, device="cpu"
    )
    assert source.policy.device == torch.device("cpu")
    assert source.policy.lean is not None
    source.close()
    for a, b in zip(_local_fragments(None), _local_fragments("cpu"), strict=True):
        assert_same_fragment(a, b)


@needs_cuda
def test_the_in_process_source_on_cuda_gives_the_eager_cuda_fragments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = _local_fragments("cuda")
    import simkit.clients.learners._sources as local

    class Eager(RowPolicy):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, graphs=False, **kw)

    monkeypatch.setattr(local, "RowPolicy", Eager)
    want = _local_fragments("cuda")
    for a, b in zip(got, want, strict=True):
        assert_same_fragment(a, b)


@needs_cuda
@pytest.mark.parametrize("kind", ["box", "discrete"])
def test_an_act_on_cuda_waits_for_the_device_once(kind: str) -> None:
    """After the first act of a batch shape (its capture), an act makes no synchronising
    call besides its one event wait (which torch's sync debug mode may or may not
    count)."""
    import warnings

    policy = _policy(SPACES[kind], torch.device("cuda"))
    obs = _obs()
    rows = np.arange(40) % 3 == 0
    policy.act(obs, 0)
    policy.final_values(obs[None], rows[None])
    torch.cuda.synchronize()
    counts = []
    for step in range(1, 4):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                policy.act(obs, step)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message) for w in seen))
    assert max(counts) <= 1, counts
