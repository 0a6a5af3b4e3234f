"""Test helpers for device-resident code: refusing every host read of a tensor."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def no_host_reads(torch: Any) -> Iterator[None]:
    """A context in which reading a tensor's values on the host raises: what a device
    synchronisation is (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool()``,
    ``int()``, ``float()``, ``__index__``, ``__array__``). On the CPU this stands in for
    ``torch.cuda.set_sync_debug_mode("error")``, which only CUDA has."""
    names = (
        "item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__",
        "__index__", "__array__",
    )  # fmt: skip
    saved = {name: getattr(torch.Tensor, name) for name in names}

    def refuse(name: str) -> Any:
        def read(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"a host read of a tensor: Tensor.{name}")

        return read

    try:
        for name in names:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.Tensor, name, value)
