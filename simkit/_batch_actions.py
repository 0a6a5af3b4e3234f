"""Vectorised action checks for torch :class:`simkit.BatchEnv` batches.

The numpy path is :func:`simkit.vector._actions.check_batch_array`, shared with the
vectors; this is its torch counterpart for batches that live on a device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from simkit._validation import ActionBounds
from simkit.errors import InvalidAction

__all__ = ["check_torch_actions"]


def check_torch_actions(
    torch: Any, space: spaces.Space[Any], actions: Any, n: int, bounds: ActionBounds, device: Any
) -> Any:
    """Checks ``n`` rows of ``actions`` for ``space`` as a tensor on ``device``.

    ``Box`` actions come back as the space's float dtype (clipped under ``CLIP``),
    ``Discrete`` as int64.

    Raises:
        InvalidAction: wrong shape or dtype, a NaN/inf, or out of range.
        TypeError: a space other than ``Box``/``Discrete``.
    """
    if not isinstance(actions, torch.Tensor):
        actions = torch.as_tensor(np.asarray(actions), device=device)
    if isinstance(space, spaces.Box):
        if tuple(actions.shape) != (n, *space.shape):
            raise InvalidAction(
                f"actions must have shape {(n, *space.shape)}, got shape {tuple(actions.shape)}"
            )
        if actions.dtype.is_complex or actions.dtype == torch.bool:
            raise InvalidAction(f"actions must be numeric, got dtype {actions.dtype}")
        dtype = {np.float32: torch.float32, np.float64: torch.float64}.get(
            np.dtype(space.dtype).type, torch.float32
        )
        arr = actions.to(device=device, dtype=dtype)
        if not bool(torch.isfinite(arr).all()):
            raise InvalidAction("actions must be finite (no NaN or inf)")
        low = torch.as_tensor(space.low, device=device, dtype=arr.dtype)
        high = torch.as_tensor(space.high, device=device, dtype=arr.dtype)
        if bounds is ActionBounds.CLIP:
            return torch.clamp(arr, low, high)
        if bool(((arr < low) | (arr > high)).any()):
            raise InvalidAction(
                f"actions must lie in [{space.low.tolist()}, {space.high.tolist()}]"
            )
        return arr
    if isinstance(space, spaces.Discrete):
        if tuple(actions.shape) != (n,) or actions.dtype.is_floating_point:
            raise InvalidAction(
                f"actions must be an integer tensor of shape ({n},), got "
                f"{actions.dtype} of shape {tuple(actions.shape)}"
            )
        lo, hi = int(space.start), int(space.start + space.n)
        if bool(((actions < lo) | (actions >= hi)).any()):
            raise InvalidAction(f"actions must be in [{lo}, {hi})")
        return actions.to(device=device, dtype=torch.int64)
    raise TypeError(
        f"torch BatchEnvs support Box and Discrete action spaces, got {type(space).__name__}"
    )
