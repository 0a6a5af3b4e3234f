"""The inference loop of a stream session: act, step, accumulate ``T``-step fragments.

No sockets and no threads: :class:`RolloutLoop` owns the session's :class:`EnvRows`
and :class:`GroupedPolicy` and turns them into :class:`simkit.Fragment` objects, one
:meth:`~RolloutLoop.step` at a time, so a worker can check for new weights and
credit between any two steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simkit._types import Fragment
from simkit.servers._stream_envs import EnvRows
from simkit.servers._stream_policy import GroupedPolicy

__all__ = ["RolloutLoop", "LoopTimes"]


@dataclass
class LoopTimes:
    """Seconds spent since the last :meth:`RolloutLoop.take_times`.

    Attributes:
        inference: forward passes and sampling.
        env: env steps.
        steps: loop steps.
        rows: policy rows acted on (batch sizes summed).
        inference_calls: ``(rows, seconds)`` of every act.
        env_calls: seconds of every env step.
    """

    inference: float = 0.0
    env: float = 0.0
    steps: int = 0
    rows: int = 0
    inference_calls: list[tuple[int, float]] = field(default_factory=list)
    env_calls: list[float] = field(default_factory=list)


class _Buffer:
    """Arrays of one fragment being collected (fresh per fragment: the previous one may
    still be on its way to the learner, zero-copy)."""

    def __init__(
        self, t: int, r: int, obs: np.ndarray, action_shape: tuple[int, ...], action_dtype: Any
    ) -> None:
        self.obs = np.empty((t, *obs.shape), dtype=obs.dtype)
        self.actions = np.empty((t, r, *action_shape), dtype=action_dtype)
        self.log_probs = np.zeros((t, r), dtype=np.float32)
        self.values = np.zeros((t, r), dtype=np.float32)
        self.rewards = np.zeros((t, r), dtype=np.float64)
        self.terminated = np.zeros((t, r), dtype=np.bool_)
        self.truncated = np.zeros((t, r), dtype=np.bool_)
        self.final_values = np.zeros((t, r), dtype=np.float32)
        self.agent_mask = np.zeros((t, r), dtype=np.bool_)
        self.policy_version = np.zeros(t, dtype=np.int64)
        self.ep_returns: list[float] = []
        self.ep_lengths: list[int] = []
        self.ep_rows: list[int] = []


class RolloutLoop:
    """Collects fragments of ``fragment_length`` steps over every row of ``envs``.

    Step ``t`` stores the observation acted on, the sampled action, its log-prob and
    value, the reward and flags; where an episode was truncated (and not terminated),
    ``final_values`` holds the value of the final observation under the same policy
    version, computed right after the env step for the groups that need it. At the
    end, ``last_obs``/``last_values`` bootstrap the rest.

    Args:
        envs: the session's envs.
        policy: the session's policy.
        fragment_length: ``T``.
        env_offset: global index of env slot 0 (fragments' ``env_ids``).
        with_states: attach the envs' snapshot at step 0 to each fragment.
        source: the name fragments carry.
    """

    def __init__(
        self,
        envs: EnvRows,
        policy: GroupedPolicy,
        *,
        fragment_length: int,
        env_offset: int = 0,
        with_states: bool = False,
        source: str = "",
    ) -> None:
        self.envs = envs
        self.policy = policy
        self.fragment_length = fragment_length
        self.with_states = with_states
        self.source = source
        per_env = envs.agents_per_env
        self.env_ids = np.repeat(np.arange(envs.num_envs, dtype=np.int64) + env_offset, per_env)
        self.action_shape = tuple(envs.action_space.shape or ())
        self.sequence = 0
        self.times = LoopTimes()
        self._obs: np.ndarray | None = None
        self._mask: np.ndarray | None = None
        self._buf: _Buffer | None = None
        self._start_state: dict[str, Any] | None = None
        self._t = 0
        self._ret = np.zeros(envs.num_rows, dtype=np.float64)
        self._len = np.zeros(envs.num_rows, dtype=np.int64)

    def reset(self, seed: int, env_offset: int) -> None:
        """Resets every env (see :meth:`EnvRows.reset`) and drops a partial fragment."""
        self._obs, self._mask = self.envs.reset(seed, env_offset)
        self._buf = None
        self._t = 0
        self._ret[:] = 0.0
        self._len[:] = 0

    @property
    def in_fragment(self) -> bool:
        """Whether a fragment is partly collected."""
        return self._t > 0

    def take_times(self) -> LoopTimes:
        """The times since the last call (and restarts the count)."""
        times, self.times = self.times, LoopTimes()
        return times

    def step(self) -> Fragment | None:
        """One act + env step over every row; the finished fragment after its ``T``-th."""
        if self._obs is None or self._mask is None:
            raise RuntimeError("reset() the loop before stepping")
        policy = self.policy
        if policy.version is None:
            raise RuntimeError("the policy has no weights yet")
        t = self._t
        obs, mask = self._obs, self._mask
        if t == 0:
            self._start_state = self.envs.get_state() if self.with_states else None
            self._buf = _Buffer(
                self.fragment_length,
                self.envs.num_rows,
                obs,
                self.action_shape,
                policy.action_dtype,
            )
        buf = self._buf
        assert buf is not None
        out = policy.act(obs)
        env_start = time.perf_counter()
        step = self.envs.step(out.actions)
        env_s = time.perf_counter() - env_start
        buf.obs[t] = obs
        buf.actions[t] = out.actions
        buf.log_probs[t] = np.where(mask, out.log_probs, 0.0)
        buf.values[t] = np.where(mask, out.values, 0.0)
        buf.rewards[t] = step.reward
        buf.terminated[t] = step.terminated
        buf.truncated[t] = step.truncated
        buf.agent_mask[t] = mask
        buf.policy_version[t] = policy.version
        cut = step.truncated & ~step.terminated & mask
        infer_s = out.seconds
        if cut.any():
            v0 = time.perf_counter()
            buf.final_values[t] = np.where(cut, policy.value(step.final_obs, cut), 0.0)
            infer_s += time.perf_counter() - v0
        self._ret += np.where(mask, step.reward, 0.0)
        self._len += mask
        ended = np.flatnonzero((step.terminated | step.truncated) & mask)
        for row in ended.tolist():
            buf.ep_returns.append(float(self._ret[row]))
            buf.ep_lengths.append(int(self._len[row]))
            buf.ep_rows.append(row)
        self._ret[ended] = 0.0
        self._len[ended] = 0
        self._obs, self._mask = step.obs, step.mask
        times = self.times
        times.inference += infer_s
        times.env += env_s
        times.steps += 1
        times.rows += int(obs.shape[0])
        times.inference_calls.append((int(obs.shape[0]), out.seconds))
        times.env_calls.append(env_s)
        self._t = t + 1
        if self._t < self.fragment_length:
            return None
        return self._finish()

    def _finish(self) -> Fragment:
        buf = self._buf
        assert buf is not None
        assert self._obs is not None
        assert self._mask is not None
        v0 = time.perf_counter()
        last_values = np.where(self._mask, self.policy.value(self._obs), 0.0).astype(np.float32)
        self.times.inference += time.perf_counter() - v0
        order = np.argsort(
            np.asarray(buf.ep_rows, dtype=np.int64), kind="stable"
        )  # by row, then time
        fragment = Fragment(
            obs=buf.obs,
            actions=buf.actions,
            log_probs=buf.log_probs,
            values=buf.values,
            rewards=buf.rewards,
            terminated=buf.terminated,
            truncated=buf.truncated,
            final_values=buf.final_values,
            agent_mask=buf.agent_mask,
            policy_version=buf.policy_version,
            last_obs=self._obs.copy(),
            last_values=last_values,
            env_ids=self.env_ids,
            episode_returns=np.asarray(buf.ep_returns, dtype=np.float64)[order],
            episode_lengths=np.asarray(buf.ep_lengths, dtype=np.int64)[order],
            episode_rows=np.asarray(buf.ep_rows, dtype=np.int64)[order],
            source=self.source,
            sequence=self.sequence,
            start_state=self._start_state,
        )
        self.sequence += 1
        self._t = 0
        self._buf = None
        self._start_state = None
        return fragment
