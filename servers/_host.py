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
from gymnasium.vector.utils import concatenate, create_empty_array

import simkit
from simkit._contract import ContractCore
from simkit._seeding import MAX_ROOT_SEED, episode_seed
from simkit._types import BatchStep
from simkit._validation import ActionBounds
from simkit.errors import InvalidState, ResetNeeded
from simkit.protocol import EnvFault, Unsupported, error_code_of
from simkit.vector._actions import check_batch, split_rows
from simkit.vector._pool import WorkerPool

__all__ = ["EnvListHost", "make_env_factory", "batch_spec_of", "GYM_PREFIX"]

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


def batch_spec_of(env_id: str) -> simkit.EnvSpec | None:
    """The registry spec of ``env_id`` if it is a :class:`simkit.BatchEnv`, else None."""
    if env_id.startswith(GYM_PREFIX):
        return None
    env_spec = simkit.spec(env_id)
    return env_spec if env_spec.kind is simkit.EnvKind.BATCH else None


_LEAF = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def require_params_capability(
    capabilities: frozenset[str], options: Mapping[str, Any] | None, params: Any
) -> None:
    """Refuses randomization overrides (``params``) for a host that cannot take them.

    Raises:
        Unsupported: overrides were given and ``params`` is not a capability.
    """
    if ((options and "params" in options) or params) and "params" not in capabilities:
        raise Unsupported(
            "this env takes no randomization overrides", expected="no params", got="params"
        )


def plan_reset_seed(
    roots: list[int | None],
    episode: np.ndarray,
    i: int,
    k: int,
    seed: int | None,
    seeds: Sequence[int] | None,
) -> int | None:
    """Updates env ``i``'s seeding bookkeeping for a reset; returns its explicit seed.

    The seeding of :class:`simkit.vector.VectorEnv`: a root ``seed`` restarts env ``i``
    at episode 0 under that root; ``seeds[k]`` (``k``: its position in the request)
    resets it with exactly that seed (returned) and no root; neither starts its next
    episode under its root (a random root on a first reset).
    """
    if seed is not None:
        roots[i] = seed
        episode[i] = -1
        return None
    if seeds is not None:
        roots[i] = None
        episode[i] = -1
        return seeds[k]
    if roots[i] is None and episode[i] < 0:
        roots[i] = int(np.random.SeedSequence().entropy) % (MAX_ROOT_SEED + 1)  # type: ignore[arg-type]
    return None


class EnvListHost:
    """N single-agent envs stepped in one process, with per-env fault isolation.

    The step path does what :class:`simkit.vector.VectorEnv` does: the batch of
    actions is checked once (simkit envs are switched to ``validate_actions=False``)
    and each env writes its row straight into the reply's arrays. With
    ``num_threads > 1`` the envs are split into contiguous chunks stepped on a
    :class:`simkit.vector` worker pool (the calling thread steps the last chunk);
    MuJoCo releases the GIL in ``mj_step``, so MuJoCo envs step in parallel. Results do
    not depend on the thread count.

    Args:
        envs: the env instances (all with equal spaces).
        num_threads: worker threads (1 = inline, no threads); at most ``len(envs)``.
    """

    def __init__(self, envs: Sequence[gym.Env[Any, Any]], *, num_threads: int = 1) -> None:
        if not envs:
            raise ValueError("a host needs at least one env, got none")
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
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
        self._simkit = all(isinstance(e.unwrapped, ContractCore) for e in self.envs)
        # simkit envs: one batch check here instead of one per env in env.step.
        self._check = self._simkit and all(
            getattr(e.unwrapped, "validate_actions", False) for e in self.envs
        )
        if self._check:
            for env in self.envs:
                setattr(env.unwrapped, "validate_actions", False)  # noqa: B010
        bounds = getattr(self.envs[0].unwrapped, "action_bounds", ActionBounds.CLIP)
        self._bounds = bounds if isinstance(bounds, ActionBounds) else ActionBounds.CLIP
        self._leaf_obs = isinstance(self.observation_space, _LEAF)
        workers = min(num_threads, self.num_envs)
        self.num_threads = workers
        self._owner = np.zeros(self.num_envs, dtype=np.int64)
        for w, chunk in enumerate(np.array_split(np.arange(self.num_envs), workers)):
            self._owner[chunk] = w
        self._pool = WorkerPool(workers, name="simkit-host") if workers > 1 else None
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
        self._all_reset = False  # every env has an observation (skips a per-step scan)
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
        require_params_capability(self.capabilities, options, params)
        self._env_offset = env_offset
        obs_rows, infos = [], []
        for k, i in enumerate(env_ids.tolist()):
            explicit = plan_reset_seed(self._roots, self._episode, i, k, seed, seeds)
            obs, info = self._reset_one(i, params[k] if params else None, options, explicit)
            obs_rows.append(obs)
            infos.append(info)
        return self._rows(obs_rows), infos

    def step(self, env_ids: np.ndarray, actions: Any) -> tuple[BatchStep, list[EnvFault]]:
        """Steps ``env_ids``; an env that raises ends its episode (truncated) and resets.

        Raises:
            ResetNeeded: an env was never reset.
            InvalidAction: the batch does not fit the action space (nothing moved).
        """
        n = env_ids.size
        ids = env_ids.tolist()
        if not self._all_reset:
            never = [i for i in ids if self._obs[i] is None]
            if never:
                raise ResetNeeded(f"envs {never} were never reset; send reset first")
            self._all_reset = all(obs is not None for obs in self._obs)
        if self._check:
            rows = check_batch(self.action_space, actions, env_ids, self._bounds)
        else:
            rows = split_rows(self.action_space, actions, n)
        out = _StepOut(n, self.observation_space if self._leaf_obs else None)
        if self._pool is None:
            self._step_rows((range(n), ids, rows, out))
        else:
            parts: list[list[int]] = [[] for _ in range(self._pool.size)]
            for k, i in enumerate(ids):
                parts[int(self._owner[i])].append(k)
            self._fan_out([(p, ids, rows, out) for p in parts])
        if len(out.faults) > 1:
            out.faults.sort(key=lambda f: f[0])  # threads finish in any order
        step = BatchStep(
            obs=out.obs if self._leaf_obs else self._rows(out.obs),
            reward=out.reward,
            terminated=out.terminated,
            truncated=out.truncated,
            final_obs=out.final_obs if self._leaf_obs else self._rows(out.final_obs),
            env_ids=np.asarray(env_ids, dtype=np.int64),
            infos=out.infos,
        )
        return step, [f for _, f in out.faults]

    def _fan_out(self, jobs: list[tuple[list[int], list[int], list[Any], _StepOut]]) -> None:
        """Runs the jobs on the pool, the last one on this thread; waits for all."""
        assert self._pool is not None
        sent = 0
        for w, job in enumerate(jobs[:-1]):
            if job[0]:
                self._pool.submit(w, self._step_rows, job, None)
                sent += 1
        error: BaseException | None = None
        try:
            self._step_rows(jobs[-1])
        except BaseException as exc:  # re-raised once every worker is done
            error = exc
        for _ in range(sent):
            _, _, failure = self._pool.get()
            error = error or failure
        if error is not None:
            raise error

    def _step_rows(self, job: tuple[Sequence[int], list[int], list[Any], _StepOut]) -> None:
        """Steps the rows ``ks`` (indices into ``ids``); runs on any thread."""
        ks, ids, rows, out = job
        for k in ks:
            i = ids[k]
            if self._broken[i]:
                out.faults.append(
                    (k, EnvFault(i, "reset_needed", f"env {i} failed to reset; reset it"))
                )
                out.obs[k] = out.final_obs[k] = self._obs[i]
                out.truncated[k] = True
                out.infos[k] = {}
                continue
            try:
                obs, r, term, trunc, info = self.envs[i].step(rows[k])
                out.reward[k] = r
                out.terminated[k] = term
                out.truncated[k] = trunc
                info = dict(info)
                ended = bool(term or trunc)
            except Exception as exc:  # fault isolation: this env's episode ends, others go on
                out.faults.append(
                    (k, EnvFault(i, error_code_of(exc), f"{type(exc).__name__}: {exc}"))
                )
                obs, info, ended = self._obs[i], {}, True
                out.reward[k] = 0.0
                out.terminated[k] = False
                out.truncated[k] = True
            out.final_obs[k] = obs
            if ended:
                try:
                    obs, info["reset_info"] = self._reset_one(i, None, None)
                except Exception as exc:
                    message = f"reset failed: {type(exc).__name__}: {exc}"
                    out.faults.append((k, EnvFault(i, error_code_of(exc), message)))
                    self._broken[i] = True
            else:
                self._obs[i] = obs
            out.obs[k] = obs
            out.infos[k] = info

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
        """Stops the worker threads and closes every env."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for env in self.envs:
            env.close()


class _StepOut:
    """One step's results, written row by row (from any worker thread).

    With a leaf observation space ``obs``/``final_obs`` are the reply's arrays
    (allocated once per step, since the reply may still be in flight on the socket);
    otherwise they are lists of rows, concatenated afterwards.
    """

    __slots__ = ("faults", "final_obs", "infos", "obs", "reward", "terminated", "truncated")

    def __init__(self, n: int, leaf_space: spaces.Space[Any] | None) -> None:
        self.obs: Any
        self.final_obs: Any
        if leaf_space is not None:
            shape = (n, *(leaf_space.shape or ()))
            self.obs = np.empty(shape, dtype=leaf_space.dtype)
            self.final_obs = np.empty(shape, dtype=leaf_space.dtype)
        else:
            self.obs = [None] * n
            self.final_obs = [None] * n
        self.reward = np.zeros(n, dtype=np.float64)
        self.terminated = np.zeros(n, dtype=np.bool_)
        self.truncated = np.zeros(n, dtype=np.bool_)
        self.infos: list[dict[str, Any]] = [{}] * n
        self.faults: list[tuple[int, EnvFault]] = []
