"""Shared by the stream tests: a fixed sequence of policy weights, and fragment equality."""

from __future__ import annotations

import numpy as np
import torch

from simkit._types import Fragment
from simkit.models import PolicyWeights, get_weights
from simkit.protocol import FRAGMENT_ARRAYS


def weights_version(model: torch.nn.Module, version: int) -> PolicyWeights:
    """Version ``version`` of a fixed sequence: the model's weights plus seeded noise."""
    base = get_weights(model, version)
    rng = np.random.default_rng(version)
    tensors = {
        name: (arr + rng.normal(0, 0.1, arr.shape).astype(arr.dtype))
        if arr.dtype.kind == "f" and arr.ndim
        else arr
        for name, arr in base.tensors.items()
    }
    return PolicyWeights(version, tensors)


def assert_same_fragment(a: Fragment, b: Fragment) -> None:
    """Every fragment array of ``a`` and ``b`` has the same dtype, shape and bytes."""
    for name in FRAGMENT_ARRAYS:
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype, name
        assert x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), name
