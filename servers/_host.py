"""Hosts: N envs behind the :class:`simkit.protocol.Host` interface, with same-step autoreset.

:class:`EnvListHost` steps a list of single-agent envs (simkit or plain Gymnasium) in
one process. Seeding follows :class:`simkit.BatchEnv`: a root seed ``r`` gives env
``i`` the seed ``episode_seed(r, i, k)`` for its ``k``-th episode, so remote data
equals local data bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

import simkit
from simkit._contract import ContractCore
from simkit._seeding import MAX_ROOT_SEED, episode_seed
from simkit._types import BatchStep
from simkit.errors import InvalidState, ResetNeeded
from simkit.protocol import EnvFault, Unsupported, error_code_of

__all__ = ["EnvListHost", "make_env_factory", "GYM_PREFIX"]

GYM_PREFIX = "gym:"


def make_env_factory(env_id: str, **kwargs: Any) -> Callable[[], gym.Env[Any, Any]]:
    """A zero-argument constructor for ``env_id``.

    ``"gym:CartPole-v1"`` builds the installed Gymnasium env; any other id is looked
    up in the simkit registry (raising :class:`simkit.errors.UnknownEnv` now, not later).
    """
    if env_id.startswith(GYM_PREFIX):
        gym_id = env_id[len(GYM_PREFIX) :]
        gym.spec(gym_id)  # raises for unknown ids before any client connects
        return lambda: gym.make(gym_id, **kwargs)
    env_spec = simkit.spec(env_id)
    if env_spec.kind is not simkit.EnvKind.SINGLE:
        raise ValueError(
            f"the rollout server hosts single-agent envs; {env_id!r} is {env_spec.kind.value}"
        )
    return lambda: env_spec.make(**kwargs)


class EnvListHost:
    """N single-agent envs stepped one after another, with per-env fault isolation.

    Args:
        envs: the env instances (all with equal spaces).
    """

    def __init__(self, envs: Sequence[gym.Env[Any, Any]]) -> None:
        if not envs:
            raise ValueError("a host needs at least one env, got none")
        self.envs = list(envs)
        self.num_envs = len(self.envs)
        self.observation_space: spaces.Space[Any] = self.envs[0].observation_space
        self.action_space: spaces.Space[Any] = self.envs[0].action_space
        for env in self.envs[1:]:
            if (
                env.observation_space != self.observation_space
                or env.action_space != self.action_space
            ):
                raise ValueError("every env of a host must have the same spaces")
        self._batched_actions = batch_space(self.action_space, self.num_envs)
        self._simkit = all(isinstance(e.unwrapped, ContractCore) for e in self.envs)
        caps: set[str] = set()
        if self._simkit:
            caps.update({"state", "params"})
            if getattr(self.envs[0].unwrapped, "randomization", None):
                caps.add("randomization")
        self.capabilities = frozenset(caps)
        self._roots: list[int | None] = [None] * self.num_envs
        self._episode = np.full(self.num_envs, -1, dtype=np.int64)
        self._obs: list[Any] = [None] * self.num_envs
        self._broken = np.zeros(self.num_envs, dtype=bool)
        self._env_offset = 0

    def _rows(self, items: list[Any]) -> Any:
        out: Any = create_empty_array(self.observation_space, len(items))
        return concatenate(self.observation_space, items, out)

    def _reset_one(
        self,
        i: int,
        params: Mapping[str, Any] | None,
        options: Mapping[str, Any] | None,
        seed: int | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Starts env ``i``'s next episode: with ``seed`` exactly, else from its root."""
        self._episode[i] += 1
        if seed is None and self._roots[i] is not None:
            seed = episode_seed(self._roots[i], self._env_offset + i, int(self._episode[i]))  # type: ignore[arg-type]
        opts = dict(options or {})
        if params:
            opts["params"] = {**dict(opts.get("params") or {}), **params}
        obs, info = self.envs[i].reset(seed=seed, options=opts or None)
        self._obs[i] = obs
        self._broken[i] = False
        return obs, dict(info)

    def reset(
        self,
        env_ids: np.ndarray,
        *,
        seed: int | None,
        seeds: list[int] | None,
        options: dict[str, Any] | None,
        params: list[dict[str, Any]] | None,
        env_offset: int = 0,
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets ``env_ids`` with the seeding of :class:`simkit.vector.VectorEnv`.

        ``env_offset``: seeds index env ``i`` as ``env_offset + i`` (a client joining
        several servers into one vector), until the next reset.

        ``seed`` (root): env ``i`` restarts at episode 0 with ``episode_seed(seed, i, 0)``
        and derives its later episodes the same way. ``seeds``: env ``env_ids[k]`` is reset
        with ``seeds[k]`` exactly and later episodes continue its own generator.
        Neither: each env starts its next episode (a random root on a first reset).
        """
        if ((options and "params" in options) or params) and "params" not in self.capabilities:
            raise Unsupported(
                "this env takes no randomization overrides", expected="no params", got="params"
            )
        self._env_offset = env_offset
        obs_rows, infos = [], []
        for k, i in enumerate(env_ids.tolist()):
            explicit: int | None = None
            if seed is not None:
                self._roots[i] = seed
                self._episode[i] = -1
            elif seeds is not None:
                self._roots[i] = None
                self._episode[i] = -1
                explicit = seeds[k]
            elif self._roots[i] is None and self._episode[i] < 0:
                self._roots[i] = int(np.random.SeedSequence().entropy) % (MAX_ROOT_SEED + 1)  # type: ignore[arg-type]
            obs, info = self._reset_one(i, params[k] if params else None, options, explicit)
            obs_rows.append(obs)
            infos.append(info)
        return self._rows(obs_rows), infos

    def step(self, env_ids: np.ndarray, actions: Any) -> tuple[BatchStep, list[EnvFault]]:
        """Steps ``env_ids``; an env that raises ends its episode (truncated) and resets."""
        n = env_ids.size
        never = [i for i in env_ids.tolist() if self._obs[i] is None]
        if never:
            raise ResetNeeded(f"envs {never} were never reset; send reset first")
        batched = batch_space(self.action_space, n) if n != self.num_envs else self._batched_actions
        per_env = list(iterate(batched, actions))
        obs_rows, final_rows = [], []
        reward = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        infos: list[dict[str, Any]] = []
        faults: list[EnvFault] = []
        for k, i in enumerate(env_ids.tolist()):
            env = self.envs[i]
            if self._broken[i]:
                faults.append(EnvFault(i, "reset_needed", f"env {i} failed to reset; reset it"))
                obs_rows.append(self._obs[i])
                final_rows.append(self._obs[i])
                truncated[k] = True
                infos.append({})
                continue
            try:
                obs, r, term, trunc, info = env.step(per_env[k])
                reward[k] = float(r)
                terminated[k], truncated[k] = bool(term), bool(trunc)
                info = dict(info)
            except Exception as exc:  # fault isolation: this env's episode ends, others go on
                faults.append(EnvFault(i, error_code_of(exc), f"{type(exc).__name__}: {exc}"))
                obs, info = self._obs[i], {}
                truncated[k] = True
            final_rows.append(obs)
            if terminated[k] or truncated[k]:
                try:
                    next_obs, reset_info = self._reset_one(i, None, None)
                    info["reset_info"] = reset_info
                except Exception as exc:
                    faults.append(
                        EnvFault(
                            i, error_code_of(exc), f"reset failed: {type(exc).__name__}: {exc}"
                        )
                    )
                    self._broken[i] = True
                    next_obs = obs
            else:
                next_obs = obs
                self._obs[i] = obs
            obs_rows.append(next_obs)
            infos.append(info)
        step = BatchStep(
            obs=self._rows(obs_rows),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=self._rows(final_rows),
            env_ids=env_ids.astype(np.int64),
            infos=infos,
        )
        return step, faults

    def get_state(self, env_ids: np.ndarray) -> list[dict[str, Any]]:
        """Snapshots of ``env_ids``: the env's own plus this host's seeding bookkeeping."""
        if "state" not in self.capabilities:
            raise Unsupported("this env has no snapshots", expected="state capability", got="none")
        out = []
        for i in env_ids.tolist():
            if self._obs[i] is None:
                raise ResetNeeded(f"env {i}: get_state before reset; reset first")
            out.append(
                {
                    "env": self.envs[i].unwrapped.get_state(),
                    "root_seed": self._roots[i],
                    "episode_index": int(self._episode[i]),
                    "obs": copy.deepcopy(self._obs[i]),
                }
            )
        return out

    def set_state(self, env_ids: np.ndarray, states: list[dict[str, Any]]) -> None:
        """Restores snapshots from :meth:`get_state`."""
        if "state" not in self.capabilities:
            raise Unsupported("this env has no snapshots", expected="state capability", got="none")
        for i, state in zip(env_ids.tolist(), states, strict=True):
            if not isinstance(state, Mapping) or {"env", "root_seed", "episode_index", "obs"} - set(
                state
            ):
                raise InvalidState(
                    "a host snapshot holds env, root_seed, episode_index and obs",
                )
            self.envs[i].unwrapped.set_state(state["env"])
            self._roots[i] = state["root_seed"]
            self._episode[i] = int(state["episode_index"])
            self._obs[i] = state["obs"]
            self._broken[i] = False

    def close(self) -> None:
        """Closes every env."""
        for env in self.envs:
            env.close()
