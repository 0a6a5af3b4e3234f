"""Stable-Baselines3's ``VecEnv`` over simkit's vectors (the ``sb3`` extra).

SB3 does not take a ``gymnasium.vector.VectorEnv``: its algorithms want their own
``VecEnv`` (reset returns only observations, step returns ``(obs, rewards, dones,
infos)`` with one info dict per env, and an ended episode's last observation in
``infos[i]["terminal_observation"]``). :class:`SB3VecEnv` is that interface over a
:class:`simkit.vector.VectorEnv`, a :class:`simkit.BatchEnv` or a
:class:`simkit.clients.RemoteVectorEnv`, built on their typed ``step_batch``, which
always autoresets in the same step and keeps the final observation apart: nothing is
stepped twice and nothing is lost.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from simkit._optional import require

require("stable_baselines3", extra="sb3", purpose="simkit.integrations.sb3")

import gymnasium as gym  # noqa: E402
from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.vec_env.base_vec_env import (  # noqa: E402
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from simkit._seeding import episode_seed, random_root  # noqa: E402
from simkit._validation import check_seed  # noqa: E402
from simkit.vector._vector import info_row  # noqa: E402

__all__ = ["SB3VecEnv"]


def _numpy(x: Any) -> np.ndarray:
    """``x`` as a fresh, writable numpy array (a torch tensor is read back from its
    device; a remote reply's read-only view is copied)."""
    if hasattr(x, "detach"):
        return np.array(x.detach().cpu().numpy())
    return np.array(x)


def _obs(space: spaces.Space[Any], obs: Any) -> VecEnvObs:
    """A batch of observations in SB3's form: an array, a dict of arrays keyed as the
    ``Dict`` space, or a tuple of arrays for a ``Tuple`` space."""
    if isinstance(space, spaces.Dict):
        return {key: _numpy(obs[key]) for key in space.spaces}
    if isinstance(space, spaces.Tuple):
        return tuple(_numpy(part) for part in obs)
    return _numpy(obs)


def _row(obs: VecEnvObs, i: int) -> Any:
    """Env ``i``'s observation out of a batch in SB3's form."""
    if isinstance(obs, dict):
        return {key: value[i] for key, value in obs.items()}
    if isinstance(obs, tuple):
        return tuple(part[i] for part in obs)
    return obs[i]


class SB3VecEnv(VecEnv):
    """A Stable-Baselines3 ``VecEnv`` over a simkit vector of envs.

    ``PPO("MlpPolicy", SB3VecEnv(RemoteVectorEnv(...)))`` trains on rollout servers;
    a local :class:`~simkit.vector.VectorEnv` or a :class:`~simkit.BatchEnv` works the
    same. Episode ends follow SB3's ``DummyVecEnv`` exactly:

    - ``dones[i] = terminated or truncated``; the returned observation of an ended env
      is already the next episode's first (simkit autoresets in the same step);
    - ``infos[i]["terminal_observation"]`` holds the episode's last observation and
      ``infos[i]["TimeLimit.truncated"]`` is ``truncated and not terminated``;
    - the new episode's reset info lands in ``reset_infos[i]``;
    - rewards are float32, dones bool, observations fresh numpy arrays (a device
      batch's tensors are read back to the host).

    Seeding: ``seed(s)`` takes effect at the next ``reset()``, as in SB3, and resets
    the vector with root seed ``s``: env ``i``'s episode ``k`` gets simkit's
    ``episode_seed(s, i, k)``, so the stream does not depend on how many envs end when
    (SB3's own vectors give env ``i`` the seed ``s + i`` instead). ``seed`` returns the
    first episode's seed of each env. ``set_options`` takes one options dict for every
    env (simkit's vectors reset all envs with the same options).

    Per-env attributes (``get_attr``, ``set_attr``, ``env_method``, ``env_is_wrapped``)
    reach each env of a :class:`~simkit.vector.VectorEnv`; a batch or remote vector has
    no per-env objects, so ``get_attr`` reads (and ``set_attr`` of every env writes)
    the vector's own attribute, ``env_is_wrapped`` is ``False`` and ``env_method``
    raises ``NotImplementedError``: call the method on :attr:`vector`.

    Args:
        vector: the simkit vector to adapt (it should not be stepped by anyone else
            while this adapter uses it). :meth:`close` closes it.

    Raises:
        TypeError: ``vector`` has no ``step_batch``, or its spaces are not Gymnasium's.
    """

    def __init__(self, vector: gym.vector.VectorEnv[Any, Any, Any]) -> None:
        if not callable(getattr(vector, "step_batch", None)):
            raise TypeError(
                "SB3VecEnv wants a simkit vector (simkit.vector.VectorEnv, simkit.BatchEnv "
                f"or simkit.clients.RemoteVectorEnv), got {type(vector).__name__}"
            )
        for what in ("single_observation_space", "single_action_space"):
            space = getattr(vector, what, None)
            if not isinstance(space, spaces.Space):
                raise TypeError(
                    f"{type(vector).__name__}.{what} must be a gymnasium space, "
                    f"got {type(space).__name__}"
                )
        self.vector: Any = vector  # a simkit vector: step_batch, and device where batched
        self._per_env: list[Any] | None = getattr(vector, "envs", None)
        self._root_seed: int | None = None
        self._actions: Any = None
        super().__init__(
            int(vector.num_envs), vector.single_observation_space, vector.single_action_space
        )
        self._on_device = getattr(vector, "xp", np) is not np

    # ------------------------------------------------------------------ reset / step

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Makes the next :meth:`reset` reset the vector with root seed ``seed``
        (a random root when ``None``, as SB3 draws one); returns each env's first episode seed."""
        self._root_seed = random_root() if seed is None else check_seed(seed)
        self._seeds = [episode_seed(self._root_seed, i, 0) for i in range(self.num_envs)]
        return self._seeds

    def set_options(self, options: list[dict[str, Any]] | dict[str, Any] | None = None) -> None:
        """Options for the next :meth:`reset`: one dict for every env (a list of dicts
        must hold the same dict for each env; simkit resets a vector with one)."""
        if isinstance(options, list):
            if len(options) != self.num_envs:
                raise ValueError(
                    f"options must hold one dict per env ({self.num_envs}), got {len(options)}"
                )
            if any(o != options[0] for o in options[1:]):
                raise ValueError(
                    "options must be the same dict for every env (simkit resets a vector "
                    f"with one options dict), got {options!r}"
                )
        super().set_options(options)

    def reset(self) -> VecEnvObs:
        """Resets every env (with the seed and options set since the last reset, once)
        and returns the observations; the reset infos land in ``reset_infos``."""
        options = self._options[0] or None
        obs, infos = self.vector.reset(seed=self._root_seed, options=options)
        self._root_seed = None
        self._reset_seeds()
        self._reset_options()
        self.reset_infos = [info_row(infos, i) for i in range(self.num_envs)]
        self._actions = None
        return _obs(self.observation_space, obs)

    def step_async(self, actions: np.ndarray) -> None:
        """Keeps ``actions`` for :meth:`step_wait` (one row per env)."""
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """Steps every env with the kept actions; see the class docstring for how
        episode ends are reported."""
        if self._actions is None:
            raise RuntimeError("step_wait() called without step_async(actions) before it")
        actions, self._actions = self._actions, None
        if self._on_device:
            import torch

            actions = torch.as_tensor(actions, device=self.vector.device)
        step = self.vector.step_batch(actions)
        obs = _obs(self.observation_space, step.obs)
        terminated = _numpy(step.terminated).astype(bool)
        truncated = _numpy(step.truncated).astype(bool)
        dones = terminated | truncated
        n = self.num_envs
        rows = list(step.infos) if len(step.infos) == n else [{} for _ in range(n)]
        infos: list[dict[str, Any]] = []
        final: VecEnvObs | None = None
        for i in range(n):
            info = dict(rows[i])
            reset_info = info.pop("reset_info", None)
            info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            if dones[i]:
                if final is None:
                    final = _obs(self.observation_space, step.final_obs)
                info["terminal_observation"] = _row(final, i)
                self.reset_infos[i] = dict(reset_info or {})
            infos.append(info)
        rewards = _numpy(step.reward).astype(np.float32)
        return obs, rewards, dones, infos

    def close(self) -> None:
        """Closes the vector (a remote one ends its sessions)."""
        self.vector.close()

    # ------------------------------------------------------------- per-env access

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Each env's attribute ``attr_name`` (a batch or remote vector: its own)."""
        ids = self._ids(indices)
        if self._per_env is not None:
            return [self._per_env[i].get_wrapper_attr(attr_name) for i in ids]
        value = getattr(self.vector, attr_name)
        return [value for _ in ids]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Sets ``attr_name`` on each env (a batch or remote vector: on itself, and only
        for every env at once)."""
        ids = self._ids(indices)
        if self._per_env is not None:
            for i in ids:
                setattr(self._per_env[i], attr_name, value)
            return
        if sorted(ids) != list(range(self.num_envs)):
            raise ValueError(
                f"{type(self.vector).__name__} has no per-env attributes: set_attr needs "
                f"indices=None (all {self.num_envs} envs), got {ids}"
            )
        setattr(self.vector, attr_name, value)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Calls ``method_name`` on each env of a :class:`~simkit.vector.VectorEnv`."""
        ids = self._ids(indices)
        if self._per_env is None:
            raise NotImplementedError(
                f"{type(self.vector).__name__} steps its envs as one batch and has no "
                f"per-env {method_name!r} to call; call it on SB3VecEnv.vector instead"
            )
        return [
            self._per_env[i].get_wrapper_attr(method_name)(*method_args, **method_kwargs)
            for i in ids
        ]

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Whether each env is wrapped in ``wrapper_class`` (never, for a batch or
        remote vector: its envs are not Gymnasium objects here)."""
        ids = self._ids(indices)
        if self._per_env is None:
            return [False for _ in ids]
        from stable_baselines3.common.env_util import is_wrapped

        return [is_wrapped(self._per_env[i], wrapper_class) for i in ids]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` image (a :class:`~simkit.vector.VectorEnv` made with
        ``render_mode="rgb_array"``)."""
        if self._per_env is None:
            raise NotImplementedError(
                f"{type(self.vector).__name__} has no per-env images; render the vector itself"
            )
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but get_images() needs 'rgb_array'",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return [env.render() for env in self._per_env]

    def _ids(self, indices: VecEnvIndices) -> list[int]:
        ids = [int(i) for i in self._get_indices(indices)]
        for i in ids:
            if not 0 <= i < self.num_envs:
                raise ValueError(f"env indices must lie in [0, {self.num_envs}), got {i}")
        return ids
