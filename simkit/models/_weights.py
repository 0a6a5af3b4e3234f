"""Policy weights as named raw tensors with a version: in memory, on the wire, on disk.

No pickle anywhere: weights are the model's state dict (parameters and buffers, the
observation statistics included) as numpy arrays; on the wire they are the codec's
named arrays beside a plain body, on disk a safetensors file whose metadata holds the
version and the model spec as JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from simkit.errors import InvalidWeights
from simkit.models._normalize import RunningMeanStd
from simkit.models._spec import ModelSpec
from simkit.protocol._spaces import DTYPES

__all__ = [
    "PolicyWeights",
    "get_weights",
    "set_weights",
    "check_weights",
    "check_version",
    "weights_to_wire",
    "weights_from_wire",
    "save_weights",
    "load_weights",
]

_MAX_VERSION = 2**63 - 1
_META_FORMAT = "simkit.weights/1"


def _check_version_value(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int | np.integer):
        raise InvalidWeights(
            f"policy version must be an int, got {type(version).__name__} {version!r}"
        )
    if not 0 <= int(version) <= _MAX_VERSION:
        raise InvalidWeights(f"policy version must be in [0, 2**63), got {version}")
    return int(version)


@dataclass(frozen=True)
class PolicyWeights:
    """A model's state dict as named numpy arrays, stamped with a policy ``version``.

    Attributes:
        version: non-negative int; a stream's versions only go forward.
        tensors: state-dict name -> C-contiguous array (parameters and buffers,
            including the observation-normalisation statistics).
        spec: the model the weights belong to, where known.

    Raises:
        InvalidWeights: a bad version, a non-str name, or a non-array tensor.
    """

    version: int
    tensors: dict[str, np.ndarray]
    spec: ModelSpec | None = field(default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "version", _check_version_value(self.version))
        if not isinstance(self.tensors, Mapping):
            raise InvalidWeights(f"tensors must be a dict, got {type(self.tensors).__name__}")
        for name, arr in self.tensors.items():
            if not isinstance(name, str) or not name:
                raise InvalidWeights(f"tensor names must be non-empty str, got {name!r}")
            if not isinstance(arr, np.ndarray):
                raise InvalidWeights(
                    f"tensor {name!r} must be a numpy array, got {type(arr).__name__}"
                )
        if self.spec is not None and not isinstance(self.spec, ModelSpec):
            raise InvalidWeights(f"spec must be a ModelSpec, got {type(self.spec).__name__}")

    @property
    def nbytes(self) -> int:
        """Total bytes of all tensors."""
        return sum(int(a.nbytes) for a in self.tensors.values())


def get_weights(model: nn.Module, version: int) -> PolicyWeights:
    """The model's state dict (buffers included) as copied, contiguous numpy arrays."""
    tensors = {
        name: np.array(t.detach().cpu().numpy(), order="C", copy=True)
        for name, t in model.state_dict().items()
    }
    return PolicyWeights(version, tensors, getattr(model, "spec", None))


def check_weights(model: nn.Module, weights: PolicyWeights) -> None:
    """Validates ``weights`` against ``model`` without changing it.

    Beyond each tensor's dtype, shape and finiteness, the observation statistics of
    every :class:`RunningMeanStd` in the model must be possible ones
    (:meth:`RunningMeanStd.check_statistics`): finite but impossible statistics make
    every normalised observation, and so every action, NaN.

    Raises:
        InvalidWeights: names missing or unexpected, a tensor with the wrong dtype or
            shape or with NaN/inf, or observation statistics with a variance < 0 or a
            count <= 0; the message names the tensor, expected and actual.
    """
    if not isinstance(weights, PolicyWeights):
        raise InvalidWeights(f"weights must be PolicyWeights, got {type(weights).__name__}")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights.tensors))
    unexpected = sorted(set(weights.tensors) - set(expected))
    if missing or unexpected:
        raise InvalidWeights(
            f"weights (version {weights.version}) do not match the model's tensors: "
            f"missing {missing}, unexpected {unexpected}"
        )
    for name, ref in expected.items():
        arr = weights.tensors[name]
        want = torch.empty((), dtype=ref.dtype).numpy().dtype
        if arr.dtype != want:
            raise InvalidWeights(
                f"tensor {name!r} has the wrong dtype: expected {want.name}, got {arr.dtype.name}"
            )
        if tuple(arr.shape) != tuple(ref.shape):
            raise InvalidWeights(
                f"tensor {name!r} has the wrong shape: expected {tuple(ref.shape)}, "
                f"got {tuple(arr.shape)}"
            )
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
            bad = int(np.size(arr) - np.isfinite(arr).sum())
            raise InvalidWeights(
                f"tensor {name!r} has {bad} non-finite value(s) (NaN/inf): expected finite"
            )
    for prefix, module in model.named_modules():
        if isinstance(module, RunningMeanStd):
            module.check_statistics(weights.tensors, f"{prefix}." if prefix else "")


def set_weights(model: nn.Module, weights: PolicyWeights) -> None:
    """Loads ``weights`` into ``model`` in place, after validating all of them.

    Raises:
        InvalidWeights: see :func:`check_weights`; the model is then unchanged.
    """
    check_weights(model, weights)
    with torch.no_grad():
        for name, ref in model.state_dict().items():
            arr = weights.tensors[name]
            if not arr.flags.writeable or not arr.flags.c_contiguous:
                arr = np.array(arr, order="C")
            ref.copy_(torch.from_numpy(arr))


def check_version(new: int, *, current: int | None, allow_equal: bool = False) -> int:
    """``new`` if it moves the policy version forward from ``current``.

    ``current`` is None before the first weights. A server calls this before
    :func:`set_weights`, so weights going backwards are refused and it keeps its policy.

    Raises:
        InvalidWeights: ``new`` is not a non-negative int, or it is below ``current``
            (or equal, unless ``allow_equal``).
    """
    version = _check_version_value(new)
    if current is not None and (version < current or (version == current and not allow_equal)):
        relation = ">=" if allow_equal else ">"
        raise InvalidWeights(
            f"policy version must go forward: expected {relation} {current}, got {version}"
        )
    return version


def weights_to_wire(
    weights: PolicyWeights, *, prefix: str = "w/"
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(body, arrays)`` for a codec :class:`~simkit.protocol.Message`.

    ``body`` is ``{"version": int, "tensors": [name, ...], "spec": plain or None}``;
    ``arrays`` maps ``prefix + name`` to each tensor, so the codec carries them as its
    named arrays (dtype, shape, raw bytes) beside any other arrays of the message.

    Raises:
        InvalidWeights: a tensor's dtype is off the codec's whitelist.
    """
    arrays: dict[str, np.ndarray] = {}
    for name, arr in weights.tensors.items():
        if arr.dtype.name not in DTYPES:
            raise InvalidWeights(
                f"tensor {name!r} cannot travel: expected a dtype in {list(DTYPES)}, "
                f"got {arr.dtype.name}"
            )
        arrays[prefix + name] = arr
    body = {
        "version": weights.version,
        "tensors": list(weights.tensors),
        "spec": None if weights.spec is None else weights.spec.to_plain(),
    }
    return body, arrays


def weights_from_wire(
    body: Mapping[str, Any], arrays: Mapping[str, np.ndarray], *, prefix: str = "w/"
) -> PolicyWeights:
    """Rebuilds :class:`PolicyWeights` from :func:`weights_to_wire`'s two halves.

    Arrays stay zero-copy views of the received frames (read-only);
    :func:`set_weights` copies them into the model.

    Raises:
        InvalidWeights: the body is malformed or a named tensor is missing.
    """
    if not isinstance(body, Mapping):
        raise InvalidWeights(f"weights body must be a map, got {type(body).__name__}")
    names = body.get("tensors")
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise InvalidWeights(f"weights body 'tensors' must be a list of names, got {names!r}")
    if len(set(names)) != len(names):
        raise InvalidWeights("weights body 'tensors' lists a name twice")
    tensors: dict[str, np.ndarray] = {}
    for name in names:
        arr = arrays.get(prefix + name)
        if arr is None:
            raise InvalidWeights(
                f"tensor {name!r} is listed but no array {prefix + name!r} came with it"
            )
        tensors[name] = arr
    spec_plain = body.get("spec")
    try:
        spec = None if spec_plain is None else ModelSpec.from_plain(spec_plain)
    except (TypeError, ValueError) as exc:
        raise InvalidWeights(f"weights body 'spec' is not a model spec: {exc}") from exc
    return PolicyWeights(body.get("version"), tensors, spec)  # type: ignore[arg-type]  # validated in __post_init__


def canonical_safetensors(data: bytes) -> bytes:
    """``data`` (a safetensors file's bytes) with its header's ``__metadata__`` keys in
    sorted order, so the same tensors and metadata are always the same bytes.

    safetensors writes the metadata map in a hash map's random order (upstream
    safetensors issue #584); sorting the keys keeps the header's length, so the length
    prefix, the data offsets and the tensor bytes are unchanged.
    """
    import struct

    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    meta = header.pop("__metadata__", None)
    ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta is not None else {}) | header
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > size:  # cannot happen for a reordering; keep the original then
        return data
    return data[:8] + text + b" " * (size - len(text)) + data[8 + size :]


def save_weights(path: str | os.PathLike[str], weights: PolicyWeights) -> None:
    """Writes ``weights`` to a safetensors file, atomically (a temp file, then rename).

    The metadata holds ``format``, ``version`` and ``spec`` (JSON); the same weights
    always give the same bytes (:func:`canonical_safetensors`).
    """
    from safetensors.numpy import save

    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    metadata = {
        "format": _META_FORMAT,
        "version": str(weights.version),
        "spec": json.dumps(None if weights.spec is None else weights.spec.to_plain()),
    }
    data = save({k: np.array(v, order="C") for k, v in weights.tensors.items()}, metadata)
    tmp.write_bytes(canonical_safetensors(data))
    os.replace(tmp, target)


def load_weights(path: str | os.PathLike[str]) -> PolicyWeights:
    """Reads a file :func:`save_weights` wrote (never unpickles anything).

    Raises:
        InvalidWeights: the file is not a simkit weights file, is truncated or corrupt;
            the message names the file.
        FileNotFoundError: there is no such file.
    """
    from safetensors import SafetensorError, safe_open

    target = Path(path)
    if not target.is_file():
        raise FileNotFoundError(f"no weights file at {str(target)!r}")
    try:
        with safe_open(target, framework="np") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118  # safe_open has no __iter__
    except SafetensorError as exc:
        raise InvalidWeights(f"{str(target)!r} is not a readable safetensors file: {exc}") from exc
    if meta.get("format") != _META_FORMAT:
        raise InvalidWeights(
            f"{str(target)!r} is not a simkit weights file: expected metadata format "
            f"{_META_FORMAT!r}, got {meta.get('format')!r}"
        )
    try:
        version = int(meta["version"])
        spec_plain = json.loads(meta["spec"])
        spec = None if spec_plain is None else ModelSpec.from_plain(spec_plain)
    except (KeyError, ValueError, TypeError) as exc:
        raise InvalidWeights(f"{str(target)!r} has bad metadata: {exc}") from exc
    return PolicyWeights(version, tensors, spec)
