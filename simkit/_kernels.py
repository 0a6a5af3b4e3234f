"""Reproducible mode: the same numeric kernels on every x86-64 CPU.

numpy's OpenBLAS, numpy's own SIMD loops, MKL, oneDNN and PyTorch's CPU kernels each
pick code paths by the CPU they run on (AVX-512 where there is AVX-512, else AVX2), and
the paths round differently, so the same seed trains different parameters on an
AVX-512 and an AVX2 machine. Reproducible mode pins every library to its AVX2 path
through the environment variables each reads when it loads (:data:`PINS`, plus
numpy's ``NPY_DISABLE_CPU_FEATURES`` for the AVX-512 features this CPU has). They
take effect only in a process that starts with them, so ``simkit train
--reproducible`` re-executes itself with them, and every server it starts (local or
on Ray) inherits them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import NoReturn

__all__ = ["PINS", "pinned_env", "pinned_vars", "is_pinned", "reexec_pinned"]

PINS: dict[str, str] = {
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's OpenBLAS: the AVX2 kernels
    "MKL_CBWR": "AVX2",  # MKL (torch's CPU BLAS): conditional numerical reproducibility
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (torch's CPU convolutions, some matmuls)
    "ATEN_CPU_CAPABILITY": "avx2",  # PyTorch's vectorised CPU kernels
}
"""The pinned kernels, as the environment variables each library reads at load."""

_NUMPY = "NPY_DISABLE_CPU_FEATURES"


def _numpy_features_to_disable() -> str:
    """numpy's AVX-512 dispatch targets present on this CPU (disabling absent ones is
    an error in some numpy versions)."""
    import importlib

    try:
        umath = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # numpy < 2
        umath = importlib.import_module("numpy.core._multiarray_umath")
    features: dict[str, bool] = umath.__cpu_features__
    return " ".join(
        sorted(k for k, on in features.items() if on and (k.startswith("AVX512") or k == "X86_V4"))
    )


def pinned_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the kernels pinned."""
    env = dict(os.environ if base is None else base)
    env.update(PINS)
    disable = _numpy_features_to_disable()
    if disable:
        env[_NUMPY] = disable
    else:
        env.pop(_NUMPY, None)
    return env


def is_pinned(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's) pins every kernel of :data:`PINS`."""
    env = os.environ if env is None else env
    return all(env.get(k) == v for k, v in PINS.items())


def pinned_vars() -> dict[str, str] | None:
    """The pinning variables of this process's environment, for processes started
    elsewhere (Ray's server actors); None where this process is not pinned."""
    if not is_pinned():
        return None
    return {k: os.environ[k] for k in (*PINS, _NUMPY) if k in os.environ}


def reexec_pinned() -> NoReturn:
    """Runs this process's command line again with the kernels pinned (never returns)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], pinned_env())
