"""Reproducible mode: the same numeric kernels on every x86-64 CPU.

numpy's OpenBLAS, numpy's own SIMD loops, MKL, oneDNN and PyTorch's CPU kernels each
pick code paths by the CPU they run on (AVX-512 where there is AVX-512, else AVX2), and
the paths round differently, so the same seed trains different parameters on an
AVX-512 and an AVX2 machine. Reproducible mode pins every library to its AVX2 path
through the environment variables each reads when it loads (:data:`PINS`, plus
numpy's ``NPY_DISABLE_CPU_FEATURES`` for its AVX-512 dispatch targets this CPU has). They
take effect only in a process that starts with them, so ``simkit train
--reproducible`` re-executes itself with them, and every server it starts (local or
on Ray) inherits them (``simkit record --reproducible`` and ``simkit serve
--reproducible`` likewise).

Checkpoints and recordings store the kernels their bits were made under
(:func:`kernel_mode`: pinned or not, and the CPU's SIMD features), so that a resume
keeps the pins and a replay on another CPU can tell a kernel difference from a real
divergence (:func:`why_bits_may_differ`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "PINS",
    "pinned_env",
    "pinned_vars",
    "is_pinned",
    "reexec_pinned",
    "numpy_avx512_targets",
    "cpu_simd",
    "kernel_mode",
    "why_bits_may_differ",
    "RECORD_PORTABLY",
]

PINS: dict[str, str] = {
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's OpenBLAS: the AVX2 kernels
    "MKL_CBWR": "AVX2",  # MKL (torch's CPU BLAS): conditional numerical reproducibility
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (torch's CPU convolutions, some matmuls)
    "ATEN_CPU_CAPABILITY": "avx2",  # PyTorch's vectorised CPU kernels
}
"""The pinned kernels, as the environment variables each library reads at load."""

_NUMPY = "NPY_DISABLE_CPU_FEATURES"


def _numpy_cpu() -> tuple[list[str], set[str], set[str]]:
    """numpy's dispatch targets, the CPU features numpy sees, and the features this
    process's ``NPY_DISABLE_CPU_FEATURES`` hid from it (numpy reports those as absent)."""
    import importlib

    try:
        umath = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # numpy < 2
        umath = importlib.import_module("numpy.core._multiarray_umath")
    features: dict[str, bool] = umath.__cpu_features__
    dispatch: list[str] = list(umath.__cpu_dispatch__)
    hidden = set(os.environ.get(_NUMPY, "").replace(",", " ").split()) & set(features)
    return dispatch, {k for k, on in features.items() if on}, hidden


def _is_avx512(name: str) -> bool:
    return name.startswith("AVX512") or name == "X86_V4"


def numpy_avx512_targets() -> list[str]:
    """numpy's AVX-512 *dispatch* targets that this CPU has: what ``NPY_DISABLE_CPU_FEATURES``
    must name to keep numpy's SIMD loops on their AVX2 paths.

    Only dispatch targets: numpy warns (``ImportWarning``, an error under ``-W error``)
    about any other name, e.g. the features a target implies (``AVX512F`` under numpy 2.4,
    whose targets are ``X86_V3 X86_V4 AVX512_ICL AVX512_SPR``). Only those this CPU has
    (disabling an absent one is an error in some numpy versions), counting the ones this
    process's own ``NPY_DISABLE_CPU_FEATURES`` hid, so a pinned process computes the same
    list as an unpinned one. Empty on a CPU without AVX-512."""
    dispatch, present, hidden = _numpy_cpu()
    return sorted(t for t in dispatch if _is_avx512(t) and t in present | hidden)


def cpu_simd() -> str:
    """This CPU's SIMD features that pick numeric code paths, space separated and sorted:
    the ``avx*``, ``fma*`` and ``amx*`` flags of ``/proc/cpuinfo`` (whatever this
    process's pinning hides from the libraries); where there is no ``/proc/cpuinfo``,
    numpy's names of the features it sees. Recorded with checkpoints and recordings: bits
    computed without :func:`pinned_env` are only expected to repeat on a CPU with the same
    string."""
    global _SIMD
    if _SIMD is None:
        _SIMD = _proc_cpuinfo_simd()
        if _SIMD is None:
            _, present, hidden = _numpy_cpu()
            _SIMD = " ".join(sorted(present | hidden))
    return _SIMD


_SIMD: str | None = None


def _proc_cpuinfo_simd() -> str | None:
    """The SIMD flags of the first processor in ``/proc/cpuinfo``; None without one (not
    Linux) or without a ``flags`` line (not x86)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return " ".join(sorted(f for f in value.split() if f.startswith(("avx", "fma", "amx"))))
    return None


def kernel_mode() -> dict[str, Any]:
    """This process's kernels, as checkpoints and recordings store them:
    ``{"reproducible": is_pinned(), "simd": cpu_simd()}``."""
    return {"reproducible": is_pinned(), "simd": cpu_simd()}


RECORD_PORTABLY = (
    "record with --reproducible (simkit record, train or serve) for a recording that "
    "verifies on any x86-64 CPU"
)
"""How to make bits that verify anywhere, for the messages that explain a difference."""


def _avx2_paths(mode: Mapping[str, Any]) -> bool:
    """Whether bits computed under ``mode`` (a :func:`kernel_mode`) came from the AVX2
    paths: pinned, or a CPU without AVX-512 (where those paths are the default)."""
    return bool(mode.get("reproducible")) or "avx512" not in str(mode.get("simd", "")).lower()


def why_bits_may_differ(recorded: Mapping[str, Any] | None) -> str | None:
    """Why bits computed under the kernels ``recorded`` (a stored :func:`kernel_mode`) may
    differ from what this process computes, in words; None where they are expected to be
    the same bits (both on the AVX2 paths, pinned or by the CPU; or both unpinned on CPUs
    with the same SIMD features) or where ``recorded`` is None (stored before simkit kept
    kernel modes: unknown)."""
    if recorded is None:
        return None
    here = kernel_mode()
    if _avx2_paths(recorded) and _avx2_paths(here):
        return None
    theirs, ours = set(str(recorded.get("simd", "")).split()), set(here["simd"].split())
    if not recorded.get("reproducible") and not here["reproducible"] and theirs == ours:
        return None
    if recorded.get("reproducible"):
        return (
            "made with --reproducible, computed here without its pinned kernels (start the "
            "process with simkit._kernels.pinned_env(): the CLI does so itself)"
        )
    if theirs == ours:
        return "made without --reproducible, computed here under the pinned kernels"
    parts = [
        f"{label}: {' '.join(sorted(names))}"
        for label, names in (("there, not here", theirs - ours), ("here, not there", ours - theirs))
        if names
    ]
    return f"made without --reproducible on a CPU with other SIMD features ({'; '.join(parts)})"


def pinned_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the kernels pinned."""
    env = dict(os.environ if base is None else base)
    env.update(PINS)
    disable = " ".join(numpy_avx512_targets())
    if disable:
        env[_NUMPY] = disable
    else:
        env.pop(_NUMPY, None)
    return env


def is_pinned(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's) pins every kernel of :data:`PINS` and
    disables numpy's AVX-512 targets of this CPU (:func:`numpy_avx512_targets`)."""
    env = os.environ if env is None else env
    if not all(env.get(k) == v for k, v in PINS.items()):
        return False
    disabled = set(env.get(_NUMPY, "").replace(",", " ").split())
    return set(numpy_avx512_targets()) <= disabled


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
