"""simkit._kernels: the pinned environment starts numpy cleanly on any x86-64 CPU, and a
pinned process computes the same pins and the same CPU description as an unpinned one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simkit._kernels import (
    PINS,
    cpu_simd,
    is_pinned,
    kernel_mode,
    numpy_avx512_targets,
    pinned_env,
)

pytestmark = pytest.mark.kernels

_PROBE = (
    "import json, numpy; from simkit import _kernels as k; "
    "print(json.dumps([k.numpy_avx512_targets(), k.pinned_env().get('NPY_DISABLE_CPU_FEATURES'), "
    "k.cpu_simd(), k.is_pinned()]))"
)


def _probe(env: dict[str, str]) -> tuple[list[str], str | None, str, bool]:
    """What a process started with ``env`` computes (numpy's warnings are errors there)."""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    targets, disable, simd, pinned = json.loads(done.stdout)
    return targets, disable, simd, pinned


def test_numpy_starts_without_a_warning_under_the_pinned_env() -> None:
    """The pins name numpy's dispatch targets only: a name numpy does not dispatch on
    (``AVX512F`` under numpy 2.4) is an ImportWarning, an error under ``-W error``."""
    targets, disable, _, pinned = _probe(pinned_env())
    assert pinned
    assert targets == numpy_avx512_targets()
    assert disable == (" ".join(targets) or None)


def test_the_pins_name_only_numpys_avx512_dispatch_targets() -> None:
    import numpy as np

    try:
        umath = np._core._multiarray_umath
    except AttributeError:  # numpy < 2
        umath = np.core._multiarray_umath  # type: ignore[attr-defined]
    dispatch = set(umath.__cpu_dispatch__)
    targets = numpy_avx512_targets()
    assert set(targets) <= dispatch
    assert all(t.startswith("AVX512") or t == "X86_V4" for t in targets)
    env = pinned_env({})
    assert {k: env[k] for k in PINS} == PINS
    assert env.get("NPY_DISABLE_CPU_FEATURES", "").split() == targets


def test_a_process_with_avx512_disabled_computes_the_same_pins_and_cpu() -> None:
    """A process whose numpy already has its AVX-512 targets disabled (pinned, or started
    as on an AVX2 machine) sees them as absent: it still pins the same targets (its
    children, e.g. the servers of ``--reproducible``, stay pinned) and describes the same
    CPU."""
    disabled = {**pinned_env(), "OPENBLAS_CORETYPE": "SkylakeX"}
    targets, disable, simd, pinned = _probe(disabled)
    assert targets == numpy_avx512_targets()
    assert disable == (" ".join(targets) or None)
    assert simd == cpu_simd()
    assert not pinned  # OpenBLAS is not on its AVX2 kernels
    assert not is_pinned()
    assert kernel_mode() == {"reproducible": False, "simd": cpu_simd()}


def test_pinned_means_numpys_avx512_targets_are_disabled_too() -> None:
    env = pinned_env()
    assert is_pinned(env)
    if numpy_avx512_targets():  # an AVX-512 CPU: the PINS alone leave numpy's loops free
        assert not is_pinned({k: v for k, v in env.items() if k != "NPY_DISABLE_CPU_FEATURES"})
