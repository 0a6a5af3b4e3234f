"""The keywords every fragment source takes (``SourceKeywords``: ``num_envs``,
``num_steps``, ``seed``): a keyword missing or unknown is refused with a TypeError naming
it, as an explicit signature refuses it, before anything is built or connected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from simkit.clients.learners._device_source import DeviceSource
from simkit.clients.learners._local_source import LocalSource
from simkit.clients.learners._server_source import ServerSource
from simkit.clients.learners._train import build_model
from simkit.clients.learners.ppo import PPOArgs
from simkit.models import ModelSpec

ENV = "simkit/BatchCartPole-v0"
MODEL = build_model(PPOArgs(env_id=ENV, hidden=(8,)))

SOURCES: dict[str, Callable[..., Any]] = {
    "local": lambda **kw: LocalSource(ENV, MODEL, **kw),
    "device": lambda **kw: DeviceSource(ENV, MODEL, device=torch.device("cpu"), **kw),
    "servers": lambda **kw: ServerSource(
        ["tcp://127.0.0.1:1"], ModelSpec("mlp", {"hidden_sizes": [8]}), env_id=ENV, **kw
    ),
}


@pytest.mark.parametrize("kind", SOURCES)
def test_an_unknown_keyword_is_refused_by_name(kind: str) -> None:
    with pytest.raises(TypeError, match=r"keyword argument.*'num_env'"):
        SOURCES[kind](num_env=2, num_steps=4, seed=0)


@pytest.mark.parametrize("kind", SOURCES)
def test_a_missing_keyword_is_refused_by_name(kind: str) -> None:
    with pytest.raises(TypeError, match=r"missing.*'seed'"):
        SOURCES[kind](num_envs=2, num_steps=4)


def test_the_keywords_reach_the_source() -> None:
    source = LocalSource(ENV, MODEL, num_envs=3, num_steps=5, seed=7)
    try:
        source.push_weights(MODEL)
        fragment = source.rollout()
        assert (source.num_envs, fragment.num_steps) == (3, 5)
    finally:
        source.close()
