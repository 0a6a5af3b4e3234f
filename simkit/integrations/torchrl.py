"""TorchRL's ``EnvBase`` over simkit's vectors (the ``torchrl`` extra).

TorchRL's ``GymWrapper`` already takes a ``gymnasium.vector.VectorEnv`` that autoresets
in the same step, reading the final observation from ``infos["final_obs"]``. What it
cannot take are simkit's other infos: it turns every info key it sees into a spec, and
keys that come and go with episodes (``params`` at each reset, ``final_info``) break
its spec check. :func:`torchrl_env` hands it the vector with only the final
observation in the infos.
"""

from __future__ import annotations

import copy
from typing import Any, cast

from simkit._optional import require

require("torchrl", extra="torchrl", purpose="simkit.integrations.torchrl")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium.vector import AutoresetMode  # noqa: E402
from torchrl.envs import EnvBase, GymWrapper  # noqa: E402

__all__ = ["torchrl_env", "FinalObsOnly"]

_KEEP = ("final_obs", "_final_obs")


class FinalObsOnly(gym.vector.VectorWrapper):
    """A same-step vector whose infos hold only ``final_obs`` (and its mask): what
    TorchRL's ``GymWrapper`` needs to put an ended episode's last observation in
    ``("next", "observation")``, and nothing whose keys change between steps.

    When every env ended on the same step, TorchRL calls ``reset()`` although the
    vector already started the next episodes; that reset (no seed, no options) returns
    those episodes instead of starting more, so a TorchRL rollout sees the episodes
    (and seeds) the vector's own stepping sees.

    Raises:
        ValueError: the vector does not autoreset in the same step.
    """

    def __init__(self, env: gym.vector.VectorEnv[Any, Any, Any]) -> None:
        super().__init__(env)
        mode = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        if mode is not AutoresetMode.SAME_STEP:
            raise ValueError(
                f"TorchRL reads final observations of a same-step vector: autoreset_mode "
                f"must be {AutoresetMode.SAME_STEP.value}, got {mode.value}"
            )
        self.autoreset_mode = mode
        self._started: Any = None  # observations of episodes every env just began

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        started, self._started = self._started, None
        if started is not None and seed is None and options is None:
            return started, {}
        obs, _ = self.env.reset(seed=cast(Any, seed), options=options)  # simkit takes lists
        return obs, {}

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, infos = self.env.step(actions)
        # A copy: TorchRL writes the final observations into the array it was given.
        everyone = bool(np.all(np.logical_or(terminated, truncated)))
        self._started = copy.deepcopy(obs) if everyone else None
        return obs, reward, terminated, truncated, {k: infos[k] for k in _KEEP if k in infos}


def torchrl_env(vector: gym.vector.VectorEnv[Any, Any, Any], **kwargs: Any) -> EnvBase:
    """A TorchRL env over a simkit vector (:class:`~simkit.vector.VectorEnv`,
    :class:`~simkit.BatchEnv` or :class:`~simkit.clients.RemoteVectorEnv`, left in
    their default same-step autoreset): ``GymWrapper(FinalObsOnly(vector), **kwargs)``.

    Its batch size is ``(num_envs,)``; ``env.set_seed(s)`` then ``env.reset()`` seeds
    the vector with root seed ``s``; ``rollout(..., break_when_any_done=False)`` runs
    through episode ends with the last observation of each in ``("next",
    "observation")``. ``kwargs`` go to ``GymWrapper`` (``device``, ...).
    """
    return GymWrapper(FinalObsOnly(vector), **kwargs)
