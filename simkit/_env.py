"""``simkit.Env``: a ``gymnasium.Env`` whose base class owns the contract."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, SupportsFloat, TypeVar, Unpack

import gymnasium as gym
import numpy as np

from simkit._contract import ContractCore, ContractOptions, EnvKind
from simkit._validation import reward_of, validate_action
from simkit.randomization import Params

__all__ = ["Env"]

ObsType = TypeVar("ObsType")
ActType = TypeVar("ActType")


class Env(ContractCore, gym.Env[ObsType, ActType], Generic[ObsType, ActType]):
    """A deterministic, resettable, randomizable single-agent environment.

    Authors set ``observation_space``/``action_space`` in ``__init__`` (calling
    ``super().__init__(**kwargs)``) and implement two hooks; the base class owns
    seeding, randomization, action validation, time-limit truncation and snapshots:

    - :meth:`reset_episode` ``(rng, params, options) -> (obs, info)``
    - :meth:`step_episode` ``(action, rng) -> (obs, reward, terminated, info)``

    plus either ``state_attributes`` or ``get_env_state``/``set_env_state``.

    ``reset`` reports the episode's sampled parameters in ``info["params"]``.

    Args:
        max_episode_steps: time limit; ``truncated`` becomes True at this many steps.
            Defaults to the class attribute.
        params: per-env randomization overrides: name to a fixed value or a narrower
            distribution, each inside the declared domain.
        render_mode: one of ``metadata["render_modes"]`` or None; another mode is kept
            with a warning, as Gymnasium does.
        validate_actions: check every action (shape, dtype, NaN, range). ``False`` is
            the fast path for trusted callers such as simkit's own vector envs.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    env_kind: ClassVar[EnvKind] = EnvKind.SINGLE

    def __init__(self, **options: Unpack[ContractOptions]) -> None:
        self._init_contract(**options)

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[ObsType, dict[str, Any]]:
        """Starts an episode: draw initial state from ``rng``, apply ``params``.

        Returns:
            The first observation and an info dict.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement reset_episode()")

    def step_episode(
        self, action: ActType, rng: np.random.Generator
    ) -> tuple[ObsType, SupportsFloat, bool, dict[str, Any]]:
        """Advances one step with a validated ``action``; noise comes only from ``rng``.

        Returns:
            ``(obs, reward, terminated, info)``; truncation is the base class's job.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement step_episode()")

    def render(self) -> Any:
        """Gymnasium's ``render``; this base draws nothing (``metadata["render_modes"]``
        is empty), so it says so instead of Gymnasium's bare ``NotImplementedError``,
        which a vector's ``render()`` passed on with no word of which env or why."""
        raise NotImplementedError(
            f"{type(self).__name__} does not render: its metadata['render_modes'] is "
            f"{self.metadata.get('render_modes', [])!r} (an env that draws overrides "
            "render(), as simkit.MujocoEnv does)"
        )

    def _prepare_episode(self, params: Params) -> None:
        """Runs before ``reset_episode``; simulator bases reset physics here."""
        del params

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsType, dict[str, Any]]:
        """Starts a new episode; the same ``seed`` always gives the same episode.

        Args:
            seed: reseeds the env's generator; None continues the current stream.
            options: ``{"params": {name: value or Distribution}}`` overrides this
                episode's randomization; other keys are passed to ``reset_episode``.
        """
        rng, params, opts = self._begin_episode(seed, options)
        self._prepare_episode(params)
        obs, info = self.reset_episode(rng, params, opts)
        info = dict(info)
        info["params"] = params
        return obs, info

    def step(self, action: ActType) -> tuple[ObsType, SupportsFloat, bool, bool, dict[str, Any]]:
        """Applies ``action``; raises ``InvalidAction`` or ``ResetNeeded`` on misuse."""
        self._require_active("step()")
        if self.validate_actions:
            action = validate_action(self.action_space, action, bounds=self.action_bounds)
        assert self._np_random is not None
        obs, reward, terminated, info = self.step_episode(action, self._np_random)
        reward = reward_of(reward)
        truncated = self._count_step()
        terminated = bool(terminated)
        if terminated or truncated:
            self._episode_active = False
        return obs, reward, terminated, truncated, info
