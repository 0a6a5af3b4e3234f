"""simkit.models: specs as data, the registry, the ActorCritic API and policy weights."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.wrappers.utils import RunningMeanStd as GymRunningMeanStd
from hypothesis import given, settings
from hypothesis import strategies as st

from simkit.errors import InvalidWeights, SimkitError, UnknownModel
from simkit.models import (
    ENTRY_POINT_GROUP,
    ActorCritic,
    ModelSpec,
    PolicyWeights,
    build_model,
    check_version,
    get_weights,
    layer_init,
    load_weights,
    model_names,
    numpy_actions,
    register_model,
    save_weights,
    set_weights,
    weights_from_wire,
    weights_to_wire,
)
from simkit.models import _registry as registry_module
from simkit.protocol import Message, decode, encode

CHEETAH_OBS = spaces.Box(-np.inf, np.inf, (17,), np.float64)
CHEETAH_ACT = spaces.Box(-1.0, 1.0, (6,), np.float32)
IMAGE_OBS = spaces.Box(0, 255, (64, 48, 3), np.uint8)

ACTION_SPACES: dict[str, spaces.Space[Any]] = {
    "box": CHEETAH_ACT,
    "box64": spaces.Box(-2.0, 2.0, (2, 3), np.float64),
    "discrete": spaces.Discrete(3, start=-1),
    "multidiscrete": spaces.MultiDiscrete([3, 2, 5]),
    "multidiscrete2d": spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[0, 1], [2, 3]]),
}


def _obs(space: spaces.Box, batch: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if space.dtype == np.uint8:
        return torch.from_numpy(rng.integers(0, 256, (batch, *space.shape), dtype=np.uint8))
    return torch.from_numpy(rng.normal(size=(batch, *space.shape)).astype(space.dtype))


def _mlp(action_space: spaces.Space[Any] = CHEETAH_ACT, **kwargs: Any) -> ActorCritic:
    return build_model(ModelSpec("mlp", kwargs), CHEETAH_OBS, action_space)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- specs and the registry ----------------------------------------------------------


def test_spec_round_trips_through_msgpack_and_json() -> None:
    spec = ModelSpec("mlp", {"hidden_sizes": (32, 16), "activation": "relu", "extra": {"a": [1.5]}})
    assert spec.kwargs["hidden_sizes"] == [32, 16]  # normalised to plain data
    wire = msgpack.unpackb(msgpack.packb(spec.to_plain()), raw=False)
    assert ModelSpec.from_plain(wire) == spec
    assert ModelSpec.from_plain(json.loads(json.dumps(spec.to_plain()))) == spec


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        ([1], TypeError, r"a model spec must be a map, got list"),
        (
            {"name": "mlp", "extra": 1},
            ValueError,
            r"keys \['kwargs', 'name'\], got \['extra', 'name'\]",
        ),
        ({"name": "", "kwargs": {}}, TypeError, r"ModelSpec.name must be a non-empty str, got ''"),
        ({"name": "mlp", "kwargs": [1]}, TypeError, r"kwargs must be a str-keyed dict, got list"),
        ({"name": "mlp", "kwargs": {1: 2}}, TypeError, r"keys must be str, got int 1"),
        (
            {"name": "mlp", "kwargs": {"x": b"raw"}},
            TypeError,
            r"ModelSpec.kwargs\['x'\] must be plain data .* got bytes",
        ),
    ],
)
def test_bad_spec_is_refused(data: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ModelSpec.from_plain(data)


def test_unknown_model_names_itself_and_the_group() -> None:
    with pytest.raises(
        UnknownModel, match=r"no model registered as 'mpl'; did you mean mlp\?"
    ) as info:
        build_model(ModelSpec("mpl"), CHEETAH_OBS, CHEETAH_ACT)
    assert f"{ENTRY_POINT_GROUP!r} entry-point group" in str(info.value)
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, SimkitError)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"hidden": [3]},
            TypeError,
            r"model 'mlp' got unknown argument\(s\) \['hidden'\]; expected some of \['activation', ",
        ),
        ({"hidden_sizes": [64, 0]}, ValueError, r"hidden_sizes\[1\] must be positive, got 0"),
        (
            {"hidden_sizes": 64},
            TypeError,
            r"hidden_sizes must be a list of positive ints, got int 64",
        ),
        (
            {"activation": "sigmoid"},
            ValueError,
            r"activation must be one of \['elu', 'relu', 'tanh'\], got 'sigmoid'",
        ),
        ({"normalize_obs": 1}, TypeError, r"normalize_obs must be a bool, got int 1"),
        ({"log_std_init": float("nan")}, ValueError, r"log_std_init must be finite, got nan"),
    ],
)
def test_bad_kwargs_name_the_argument(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _mlp(**kwargs)


def test_unsupported_spaces_are_refused() -> None:
    with pytest.raises(TypeError, match=r"model 'mlp' needs a Box observation space"):
        build_model(ModelSpec("mlp"), spaces.Discrete(4), CHEETAH_ACT)
    with pytest.raises(TypeError, match=r"action space must be Box .* got MultiBinary\(3\)"):
        _mlp(spaces.MultiBinary(3))
    with pytest.raises(TypeError, match=r"Box action spaces must have a float dtype"):
        _mlp(spaces.Box(0, 3, (2,), np.int64))
    with pytest.raises(ValueError, match=r"H, W >= 36, got shape \(32, 32, 3\)"):
        build_model(ModelSpec("cnn"), spaces.Box(0, 255, (32, 32, 3), np.uint8), CHEETAH_ACT)


def test_register_model_and_builder_must_return_an_actor_critic() -> None:
    with pytest.raises(ValueError, match=r"model 'mlp' is already registered"):
        register_model("mlp", lambda o, a: None)  # type: ignore[arg-type,return-value]  # the refusal is the point
    register_model("test-none", lambda o, a: None)  # type: ignore[arg-type,return-value]  # a bad builder
    try:
        with pytest.raises(
            TypeError,
            match=r"builder of model 'test-none' must return an ActorCritic, got NoneType",
        ):
            build_model(ModelSpec("test-none"), CHEETAH_OBS, CHEETAH_ACT)
    finally:
        del registry_module._BUILDERS["test-none"]


def test_entry_point_models_load_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "simkit_test_models.py").write_text(
        textwrap.dedent(
            """
            from simkit.models import build_mlp

            def tiny(observation_space, action_space, *, width=8):
                return build_mlp(observation_space, action_space, hidden_sizes=[width])
            """
        )
    )
    dist = tmp_path / "simkit_test_models-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: simkit-test-models\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\ntiny = simkit_test_models:tiny\nbroken = simkit_test_nowhere:x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "simkit_test_models", raising=False)
    monkeypatch.setattr(registry_module, "_BUILDERS", dict(registry_module._BUILDERS))
    importlib.invalidate_caches()
    assert "tiny" in model_names()
    assert "simkit_test_models" not in sys.modules  # listing does not import
    model = build_model(ModelSpec("tiny", {"width": 5}), CHEETAH_OBS, CHEETAH_ACT)
    assert model.spec == ModelSpec("tiny", {"width": 5})
    assert model.head.mean.in_features == 5  # type: ignore[union-attr]  # a Gaussian head
    with pytest.raises(
        TypeError,
        match=r"model 'tiny' got unknown argument\(s\) \['depth'\]; expected some of \['width'\]",
    ):
        build_model(ModelSpec("tiny", {"depth": 2}), CHEETAH_OBS, CHEETAH_ACT)
    with pytest.raises(
        UnknownModel,
        match=r"model 'broken' from entry point 'simkit_test_nowhere:x' in group 'simkit.models' failed to load: ModuleNotFoundError",
    ):
        build_model(ModelSpec("broken"), CHEETAH_OBS, CHEETAH_ACT)


def _wide(
    observation_space: spaces.Box, action_space: spaces.Space[Any], *, width: int = 256
) -> ActorCritic:
    """The custom model of docs/models.md."""
    n = observation_space.shape[0]
    return ActorCritic(
        observation_space,
        action_space,
        encoder=torch.nn.Sequential(layer_init(torch.nn.Linear(n, width), 2**0.5), torch.nn.ReLU()),
        actor=torch.nn.Identity(),
        critic=layer_init(torch.nn.Linear(width, 1), 1.0),
        actor_features=width,
        normalize_obs=True,
    )


def test_a_custom_model_composes_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "_BUILDERS", dict(registry_module._BUILDERS))
    register_model("my-wide", _wide)  # type: ignore[arg-type]  # a Box observation space is what it takes
    model = build_model(ModelSpec("my-wide", {"width": 8}), CHEETAH_OBS, spaces.Discrete(3))
    obs = _obs(CHEETAH_OBS, 4)
    out = model.act(obs, generator=_gen(0))
    assert out.actions.shape == (4,)
    assert torch.equal(model.evaluate(obs, out.actions)[0], out.log_probs)
    assert "obs_rms.mean" in get_weights(model, 0).tensors


def test_import_simkit_does_not_import_torch() -> None:
    code = "import sys, simkit; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the ActorCritic API ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ACTION_SPACES))
def test_act_shapes_dtypes_and_evaluate_agree(name: str) -> None:
    space = ACTION_SPACES[name]
    model = _mlp(space)
    obs = _obs(CHEETAH_OBS, 7)
    out = model.act(obs, generator=_gen(1))
    assert out.actions.shape == (7, *space.shape)
    assert out.actions.dtype == torch.from_numpy(np.zeros(1, space.dtype)).dtype
    assert out.log_probs.shape == out.values.shape == (7,)
    assert out.log_probs.dtype == out.values.dtype == torch.float32
    if not isinstance(space, spaces.Box):  # Box samples are not clipped by the model
        assert all(space.contains(a) for a in numpy_actions(out.actions))
    log_probs, entropy, values = model.evaluate(obs, out.actions)
    if isinstance(space, spaces.Box):  # act's Gaussian log-prob comes from the noise
        torch.testing.assert_close(log_probs, out.log_probs, rtol=1e-6, atol=1e-5)
    else:
        assert torch.equal(log_probs, out.log_probs)
    assert torch.equal(values, out.values)
    assert torch.equal(model.value(obs), out.values)
    assert entropy.shape == (7,)
    assert bool((entropy > 0).all())
    (-(log_probs.mean() + entropy.mean())).backward()
    assert all(p.grad is not None for p in model.head.parameters())


@pytest.mark.parametrize("name", sorted(ACTION_SPACES))
def test_act_is_a_function_of_the_generator_only(name: str) -> None:
    model = _mlp(ACTION_SPACES[name])
    obs = _obs(CHEETAH_OBS, 64)
    global_state = torch.get_rng_state()
    first = model.act(obs, generator=_gen(7))
    second = model.act(obs, generator=_gen(7))
    other = model.act(obs, generator=_gen(8))
    assert torch.equal(torch.get_rng_state(), global_state)
    assert torch.equal(first.actions, second.actions)
    assert torch.equal(first.log_probs, second.log_probs)
    assert not torch.equal(first.actions, other.actions)
    with pytest.raises(ValueError, match=r"act needs a torch.Generator"):
        model.act(obs)


def test_deterministic_act_is_the_mean_or_the_argmax() -> None:
    obs = _obs(CHEETAH_OBS, 5)
    box = _mlp()
    mean = box(obs)
    det = box.act(obs, deterministic=True)
    assert torch.equal(det.actions, mean)
    torch.testing.assert_close(det.log_probs, box.evaluate(obs, mean)[0])
    disc = _mlp(spaces.Discrete(4, start=10))
    det = disc.act(obs, deterministic=True)
    assert torch.equal(det.actions, disc(obs).argmax(-1) + 10)
    assert torch.equal(det.log_probs, disc.evaluate(obs, det.actions)[0])


def test_gaussian_samples_are_not_clipped_and_log_prob_matches_torch() -> None:
    model = _mlp(log_std_init=1.0)
    obs = _obs(CHEETAH_OBS, 256)
    out = model.act(obs, generator=_gen(0))
    assert bool((out.actions.abs() > 1.0).any())
    dist = torch.distributions.Normal(model(obs), torch.ones(6).exp())
    expected = dist.log_prob(out.actions).sum(-1)
    torch.testing.assert_close(out.log_probs, expected)
    _, entropy, _ = model.evaluate(obs, out.actions)
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))


def test_categorical_sampling_follows_the_probabilities() -> None:
    model = _mlp(spaces.Discrete(3))
    with torch.no_grad():
        model.head.logits.bias.copy_(torch.tensor([0.0, 1.0, 2.0]))  # type: ignore[union-attr]  # a categorical head
        model.head.logits.weight.zero_()  # type: ignore[union-attr]  # a categorical head
    out = model.act(_obs(CHEETAH_OBS, 20000), generator=_gen(3))
    freq = torch.bincount(out.actions, minlength=3).double() / 20000
    torch.testing.assert_close(
        freq, torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0).double(), atol=0.015, rtol=0
    )


def test_cnn_shapes_and_scaling() -> None:
    model = build_model(ModelSpec("cnn", {"fc_size": 32}), IMAGE_OBS, spaces.Discrete(5))
    assert model.obs_rms is None
    obs = _obs(IMAGE_OBS, 3)
    out = model.act(obs, generator=_gen(0))
    assert out.actions.shape == (3,)
    assert out.actions.dtype == torch.int64
    assert torch.equal(model.evaluate(obs, out.actions)[0], out.log_probs)
    scaled = model.encoder(obs.float() * (1.0 / 255.0))
    assert torch.equal(model.critic(scaled).reshape(-1), out.values)
    cont = build_model(ModelSpec("cnn", {"fc_size": 16}), IMAGE_OBS, CHEETAH_ACT)
    assert cont.act(obs, generator=_gen(0)).actions.shape == (3, 6)


def test_preprocessed_observations_give_the_same_results() -> None:
    model = _mlp()
    model.update_obs_stats(_obs(CHEETAH_OBS, 30, seed=2) * 3)
    obs = _obs(CHEETAH_OBS, 8)
    actions = model.act(obs, generator=_gen(0)).actions
    x = model.preprocess(obs)
    for a, b in zip(
        model.evaluate(obs, actions), model.evaluate(x, actions, preprocessed=True), strict=True
    ):
        assert torch.equal(a, b)
    assert torch.equal(model.value(x, preprocessed=True), model.value(obs))


def test_wrong_action_shape_is_refused() -> None:
    model = _mlp(spaces.MultiDiscrete([3, 2]))
    with pytest.raises(
        ValueError, match=r"actions must have shape \(B, \*\(2,\)\) with B = 4, got \(4,\)"
    ):
        model.evaluate(_obs(CHEETAH_OBS, 4), torch.zeros(4, dtype=torch.int64))
    log_probs, _, _ = model.evaluate(_obs(CHEETAH_OBS, 4), np.zeros((4, 2), np.int64))
    assert log_probs.shape == (4,)


def test_wrong_observation_shape_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"observations must have shape \(B, \*\(17,\)\), got \(17,\)"
    ):
        _mlp().act(torch.zeros(17), deterministic=True)


def test_init_follows_cleanrl() -> None:
    model = _mlp()
    first = model.actor[0].weight.detach()  # type: ignore[index]  # a Sequential
    torch.testing.assert_close(first.T @ first, 2.0 * torch.eye(17), atol=1e-4, rtol=0)
    w = model.actor[2].weight.detach()  # type: ignore[index]  # a Sequential
    torch.testing.assert_close(w @ w.T, 2.0 * torch.eye(64), atol=1e-4, rtol=0)
    head = model.head.mean.weight.detach()  # type: ignore[union-attr]  # a Gaussian head
    torch.testing.assert_close(head @ head.T, 1e-4 * torch.eye(6), atol=1e-8, rtol=0)
    critic = model.critic[1].weight.detach()  # type: ignore[index]  # a Sequential
    torch.testing.assert_close((critic**2).sum(), torch.tensor(1.0), atol=1e-5, rtol=0)
    assert torch.equal(model.head.log_std.detach(), torch.zeros(6))  # type: ignore[union-attr]  # a Gaussian head
    shared = _mlp(shared_trunk=True, activation="elu", hidden_sizes=[16])
    assert len([m for m in shared.modules() if isinstance(m, torch.nn.Linear)]) == 3


# -- observation normalisation ---------------------------------------------------------


def test_obs_stats_match_gymnasium_and_travel_with_the_weights() -> None:
    model = _mlp()
    gym_rms = GymRunningMeanStd(shape=(17,))
    rng = np.random.default_rng(0)
    for scale in (1.0, 30.0, 0.1):
        batch = rng.normal(3.0, scale, size=(50, 17))
        model.update_obs_stats(batch)
        gym_rms.update(batch)
    assert model.obs_rms is not None
    np.testing.assert_allclose(model.obs_rms.mean.numpy(), gym_rms.mean, rtol=1e-12)
    np.testing.assert_allclose(model.obs_rms.var.numpy(), gym_rms.var, rtol=1e-12)
    assert float(model.obs_rms.count) == pytest.approx(gym_rms.count)
    obs = torch.from_numpy(rng.normal(3.0, 50.0, size=(9, 17)))
    expected = np.clip((obs.numpy() - gym_rms.mean) / np.sqrt(gym_rms.var + 1e-8), -10, 10)
    np.testing.assert_allclose(model.obs_rms(obs).numpy(), expected, rtol=1e-6, atol=1e-5)

    fresh = _mlp()
    assert not torch.equal(fresh(obs), model(obs))
    set_weights(fresh, get_weights(model, 1))
    assert torch.equal(fresh(obs), model(obs))
    assert torch.equal(
        fresh.act(obs, generator=_gen(4)).actions, model.act(obs, generator=_gen(4)).actions
    )


def test_cached_normalisation_follows_every_change_of_the_statistics() -> None:
    model = _mlp()
    assert model.obs_rms is not None
    obs = _obs(CHEETAH_OBS, 6)
    before = model.obs_rms(obs)
    model.update_obs_stats(_obs(CHEETAH_OBS, 20, seed=1) * 5 + 2)
    after_update = model.obs_rms(obs)
    assert not torch.equal(before, after_update)
    model.load_state_dict(_mlp().state_dict())
    torch.testing.assert_close(model.obs_rms(obs), before)
    with torch.no_grad():
        model.obs_rms.var.mul_(4.0)
    torch.testing.assert_close(model.obs_rms(obs), before / 2)


def test_obs_stats_update_is_explicit_and_checked() -> None:
    model = _mlp()
    before = _state(model)
    model.act(_obs(CHEETAH_OBS, 8), generator=_gen(0))
    model.evaluate(_obs(CHEETAH_OBS, 8), torch.zeros(8, 6))
    assert _same_state(before, _state(model))
    model.update_obs_stats(_obs(CHEETAH_OBS, 12).reshape(3, 4, 17))  # leading dims flatten
    assert model.obs_rms is not None
    assert float(model.obs_rms.count) == pytest.approx(12.0001)
    with pytest.raises(ValueError, match=r"shape \(batch, \*\(17,\)\), got \(4, 16\)"):
        model.update_obs_stats(torch.zeros(4, 16))
    off = _mlp(normalize_obs=False)
    off.update_obs_stats(torch.zeros(4, 17))
    assert off.obs_rms is None
    assert not any("obs_rms" in k for k in off.state_dict())


# -- weights ---------------------------------------------------------------------------


def test_get_weights_copies_the_state_dict() -> None:
    model = _mlp()
    weights = get_weights(model, 3)
    assert weights.version == 3
    assert weights.spec == ModelSpec("mlp")
    assert set(weights.tensors) == set(model.state_dict())
    assert {"obs_rms.mean", "obs_rms.var", "obs_rms.count", "head.log_std"} <= set(weights.tensors)
    assert weights.tensors["obs_rms.mean"].dtype == np.float64
    assert weights.tensors["obs_rms.count"].shape == ()  # 0-d stays 0-d
    assert all(a.flags.c_contiguous for a in weights.tensors.values())
    with torch.no_grad():
        model.head.log_std.add_(1.0)  # type: ignore[union-attr]  # a Gaussian head
    assert not weights.tensors["head.log_std"].any()


def _broken(weights: PolicyWeights, name: str, value: np.ndarray | None) -> PolicyWeights:
    tensors = dict(weights.tensors)
    if value is None:
        del tensors[name]
    else:
        tensors[name] = value
    return PolicyWeights(weights.version, tensors)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (("head.log_std", None), r"missing \['head.log_std'\], unexpected \[\]"),
        (("extra.weight", np.zeros(2, np.float32)), r"missing \[\], unexpected \['extra.weight'\]"),
        (
            ("head.log_std", np.zeros(5, np.float32)),
            r"tensor 'head.log_std' has the wrong shape: expected \(6,\), got \(5,\)",
        ),
        (
            ("head.log_std", np.zeros(6, np.float64)),
            r"tensor 'head.log_std' has the wrong dtype: expected float32, got float64",
        ),
        (
            ("obs_rms.var", np.full(17, np.nan)),
            r"tensor 'obs_rms.var' has 17 non-finite value\(s\)",
        ),
        (
            ("actor.0.bias", np.array([np.inf] + [0.0] * 63, np.float32)),
            r"tensor 'actor.0.bias' has 1 non-finite",
        ),
        (
            ("obs_rms.var", np.array([-1.0] + [1.0] * 16)),
            r"tensor 'obs_rms.var' holds 1 variance\(s\) < 0 \(the smallest -1.0\): "
            r"expected every value >= 0",
        ),
        (
            ("obs_rms.count", np.array(0.0)),
            r"tensor 'obs_rms.count' must count observations: expected > 0, got 0.0",
        ),
        (("obs_rms.count", np.array(-3.0)), r"expected > 0, got -3.0"),
    ],
)
def test_set_weights_refuses_bad_tensors_and_changes_nothing(
    change: tuple[str, np.ndarray | None], match: str
) -> None:
    source = _mlp()
    source.update_obs_stats(_obs(CHEETAH_OBS, 10))
    weights = get_weights(source, 2)
    target = _mlp()
    before = _state(target)
    with pytest.raises(InvalidWeights, match=match):
        set_weights(target, _broken(weights, *change))
    assert _same_state(before, _state(target))


def test_a_zero_variance_is_possible_observation_statistics() -> None:
    source = _mlp()
    weights = get_weights(source, 1)
    target = _mlp()
    set_weights(target, _broken(weights, "obs_rms.var", np.zeros(17)))
    assert float(target.obs_rms.var.abs().sum()) == 0.0


def test_policy_weights_validate_the_version() -> None:
    with pytest.raises(InvalidWeights, match=r"policy version must be an int, got bool True"):
        PolicyWeights(True, {})
    with pytest.raises(InvalidWeights, match=r"policy version must be in \[0, 2\*\*63\), got -1"):
        PolicyWeights(-1, {})
    with pytest.raises(InvalidWeights, match=r"tensor 'a' must be a numpy array, got list"):
        PolicyWeights(0, {"a": [1.0]})  # type: ignore[dict-item]  # the refusal is the point


def test_check_version_only_goes_forward() -> None:
    assert check_version(0, current=None) == 0
    assert check_version(5, current=4) == 5
    assert check_version(4, current=4, allow_equal=True) == 4
    with pytest.raises(InvalidWeights, match=r"must go forward: expected > 4, got 4"):
        check_version(4, current=4)
    with pytest.raises(InvalidWeights, match=r"must go forward: expected >= 4, got 3"):
        check_version(3, current=4, allow_equal=True)


def test_weights_cross_the_codec_and_load_into_a_fresh_model() -> None:
    model = _mlp(spaces.MultiDiscrete([3, 4]))
    model.update_obs_stats(_obs(CHEETAH_OBS, 32))
    body, arrays = weights_to_wire(get_weights(model, 11))
    frames = encode(Message("weights", id=1, body=body, arrays=arrays), inline_threshold=256)
    msg = decode([bytes(f) for f in frames])
    received = weights_from_wire(msg.body, msg.arrays)
    assert received.version == 11
    assert received.spec == model.spec
    fresh = build_model(received.spec, CHEETAH_OBS, spaces.MultiDiscrete([3, 4]))  # type: ignore[arg-type]  # spec came along
    set_weights(fresh, received)  # read-only frames are copied in
    assert _same_state(_state(fresh), _state(model))
    with pytest.raises(
        InvalidWeights,
        match=r"tensor 'head.logits.bias' is listed but no array 'w/head.logits.bias'",
    ):
        weights_from_wire(body, {k: v for k, v in arrays.items() if k != "w/head.logits.bias"})
    with pytest.raises(InvalidWeights, match=r"policy version must be an int, got str"):
        weights_from_wire({**body, "version": "11"}, arrays)


def test_safetensors_round_trip(tmp_path: Path) -> None:
    model = _mlp(hidden_sizes=[8])
    model.update_obs_stats(_obs(CHEETAH_OBS, 5))
    path = tmp_path / "policy.safetensors"
    save_weights(path, get_weights(model, 42))
    loaded = load_weights(path)
    assert loaded.version == 42
    assert loaded.spec == ModelSpec("mlp", {"hidden_sizes": [8]})
    fresh = build_model(loaded.spec, CHEETAH_OBS, CHEETAH_ACT)  # type: ignore[arg-type]  # saved with its spec
    set_weights(fresh, loaded)
    assert _same_state(_state(fresh), _state(model))
    assert not (tmp_path / "policy.safetensors.tmp").exists()


def test_corrupt_weight_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / "policy.safetensors"
    save_weights(path, get_weights(_mlp(), 1))
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        InvalidWeights, match=r"cut.safetensors' is not a readable safetensors file"
    ):
        load_weights(tmp_path / "cut.safetensors")
    from safetensors.numpy import save_file

    save_file({"a": np.zeros(2, np.float32)}, tmp_path / "other.safetensors")
    with pytest.raises(InvalidWeights, match=r"other.safetensors' is not a simkit weights file"):
        load_weights(tmp_path / "other.safetensors")
    with pytest.raises(FileNotFoundError, match=r"no weights file at"):
        load_weights(tmp_path / "missing.safetensors")


# -- any Box shape ---------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(
    obs_shape=st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple),
    act_shape=st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple),
    batch=st.integers(1, 6),
    shared=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_box_shapes(
    obs_shape: tuple[int, ...], act_shape: tuple[int, ...], batch: int, shared: bool, seed: int
) -> None:
    obs_space = spaces.Box(-1.0, 1.0, obs_shape, np.float32)
    act_space = spaces.Box(-1.0, 1.0, act_shape, np.float32)
    model = build_model(
        ModelSpec("mlp", {"hidden_sizes": [4], "shared_trunk": shared}), obs_space, act_space
    )
    obs = _obs(obs_space, batch, seed)
    model.update_obs_stats(obs)
    out = model.act(obs, generator=_gen(seed))
    assert out.actions.shape == (batch, *act_shape)
    torch.testing.assert_close(
        model.evaluate(obs, out.actions)[0], out.log_probs, rtol=1e-6, atol=1e-5
    )
    assert torch.equal(model.act(obs, generator=_gen(seed)).actions, out.actions)
    fresh = build_model(model.spec, obs_space, act_space)  # type: ignore[arg-type]  # set by build_model
    set_weights(fresh, get_weights(model, 0))
    assert torch.equal(fresh.act(obs, generator=_gen(seed)).actions, out.actions)


_PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=25, deadline=None)
@given(
    name=st.text(min_size=1, max_size=10),
    kwargs=st.dictionaries(st.text(max_size=8), _PLAIN, max_size=4),
)
def test_any_plain_spec_round_trips(name: str, kwargs: dict[str, Any]) -> None:
    spec = ModelSpec(name, kwargs)
    assert ModelSpec.from_plain(msgpack.unpackb(msgpack.packb(spec.to_plain()), raw=False)) == spec
    assert ModelSpec.from_plain(json.loads(json.dumps(spec.to_plain()))) == spec


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_any_corrupted_tensor_is_named_and_changes_nothing(data: st.DataObject) -> None:
    source = _mlp(hidden_sizes=[4])
    weights = get_weights(source, 1)
    name = data.draw(st.sampled_from(sorted(weights.tensors)))
    arr = weights.tensors[name]
    kind = data.draw(st.sampled_from(["shape", "dtype", "nonfinite"]))
    if kind == "shape":
        bad = np.zeros((*arr.shape, 2), arr.dtype)
    elif kind == "dtype":
        bad = arr.astype(np.float16)
    else:
        bad = arr.copy()
        bad.reshape(-1)[data.draw(st.integers(0, max(arr.size - 1, 0)))] = data.draw(
            st.sampled_from([np.nan, np.inf, -np.inf])
        )
    target = _mlp(hidden_sizes=[4])
    before = _state(target)
    with pytest.raises(InvalidWeights, match=f"tensor '{name}'"):
        set_weights(target, _broken(weights, name, bad))
    assert _same_state(before, _state(target))


def test_cnn_with_normalised_pixels() -> None:
    model = build_model(
        ModelSpec("cnn", {"fc_size": 8, "normalize_obs": True}), IMAGE_OBS, spaces.Discrete(2)
    )
    assert model.obs_rms is not None
    assert model.obs_scale is None
    obs = _obs(IMAGE_OBS, 4)
    model.update_obs_stats(obs)
    x = model.preprocess(obs)
    assert x.dtype == torch.float32
    assert float(x.abs().max()) <= 10.0
    assert "obs_rms.mean" in get_weights(model, 0).tensors
