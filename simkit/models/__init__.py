"""Policies as data: model specs, the model registry, actor-critics and their weights.

A policy is a registered model name plus plain keyword arguments (:class:`ModelSpec`),
built on both sides of a stream by :func:`build_model`; its weights are named raw
tensors with a version (:class:`PolicyWeights`). This package imports torch; ``import
simkit`` does not import it. See docs/models.md.
"""

from __future__ import annotations

from simkit.models import _weights
from simkit.models._actor_critic import ActorCritic, ActOutput, numpy_actions
from simkit.models._builtin import ACTIVATIONS, build_cnn, build_mlp
from simkit.models._heads import ActionHead, CategoricalHead, GaussianHead, layer_init, make_head
from simkit.models._normalize import RunningMeanStd
from simkit.models._registry import (
    ENTRY_POINT_GROUP,
    ModelBuilder,
    build_model,
    model_names,
    register_model,
)
from simkit.models._sac import SquashedGaussianHead, build_sac_mlp
from simkit.models._spec import ModelSpec
from simkit.models._weights import *  # noqa: F403  (the weights: _weights.__all__)

__all__ = [
    # models as data
    "ModelSpec",
    "ModelBuilder",
    "register_model",
    "build_model",
    "model_names",
    "ENTRY_POINT_GROUP",
    # the policy API
    "ActorCritic",
    "ActOutput",
    "numpy_actions",
    "RunningMeanStd",
    # built-in models and their parts
    "build_mlp",
    "build_cnn",
    "build_sac_mlp",
    "ACTIVATIONS",
    "ActionHead",
    "GaussianHead",
    "CategoricalHead",
    "SquashedGaussianHead",
    "make_head",
    "layer_init",
    # weights
    *_weights.__all__,
]
