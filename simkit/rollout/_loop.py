"""The inference loop of a stream session: act, step, accumulate ``T``-step fragments.

No sockets: :class:`RolloutLoop` owns the session's :class:`EnvRows` and
:class:`RowPolicy` and turns them into :class:`simkit.Fragment` objects, one
:meth:`~RolloutLoop.step` at a time, so a worker can check for new weights and
credit between any two steps.

Where the envs were split in two parts (:meth:`EnvRows.split`, double-buffered
sampling), a step is pipelined: the physics of one part runs on the env's background
thread while the policy evaluates the other, and a step's env results are collected in
the next call (:meth:`RolloutLoop.settle` collects them at once). Every row acts, steps
and is recorded exactly as in the one-part loop, so the fragments are the same bits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simkit._types import Fragment
from simkit.models import PolicyWeights
from simkit.rollout._policy import RowPolicy
from simkit.rollout._rows import EnvRows

__all__ = ["RolloutLoop", "LoopTimes"]


@dataclass
class LoopTimes:
    """Seconds spent since the last :meth:`RolloutLoop.take_times`.

    Attributes:
        inference: forward passes and sampling.
        env: env steps (per part: from its send to its results; parts overlap).
        steps: loop steps.
        rows: policy rows acted on (batch sizes summed).
        inference_calls: ``(rows, seconds)`` of every act.
        env_calls: seconds of every env step (of every part).
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
        self.final_obs: list[np.ndarray] = []
        self.final_index: list[np.ndarray] = []


class RolloutLoop:
    """Collects fragments of ``fragment_length`` steps over every row of ``envs``.

    Step ``t`` stores the observation acted on, the sampled action, its log-prob and
    value, the reward and flags; where an episode was truncated (and not terminated),
    ``final_values`` holds the value of the final observation under the same policy
    version, computed right after the env step for the rows that need it. At the
    end, ``last_obs``/``last_values`` bootstrap the rest.

    With ``envs`` split in two parts, the parts are acted
    on and stepped one after the other through ``send``/``recv``, so one part's physics
    overlaps the other's forward pass. Weights must not change while a step is in
    flight: load them with :meth:`set_weights`, which settles first.

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
        policy: RowPolicy,
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
        self.parts = list(envs.parts)
        # The one-part loop acts on every row at once (the policy's whole-batch path).
        self._act_parts: list[slice | None] = [*self.parts] if len(self.parts) > 1 else [None]
        per_env = envs.agents_per_env
        self.env_ids = np.repeat(np.arange(envs.num_envs, dtype=np.int64) + env_offset, per_env)
        self.action_shape = tuple(envs.action_space.shape or ())
        self.sequence = 0
        self.times = LoopTimes()
        self._obs: list[np.ndarray] = []
        self._mask: list[np.ndarray] = []
        self._sent = [0.0] * len(self.parts)
        self._in_flight = False
        self._buf: _Buffer | None = None
        self._start_state: dict[str, Any] | None = None
        self._t = 0
        self._ret = np.zeros(envs.num_rows, dtype=np.float64)
        self._len = np.zeros(envs.num_rows, dtype=np.int64)
        self._final: list[tuple[int, slice, np.ndarray, Callable[[], np.ndarray]]] = []
        """Final values asked for and not yet written: (step, part, rows, result)."""

    @property
    def double_buffered(self) -> bool:
        """Whether the envs step in two overlapping parts."""
        return len(self.parts) > 1

    def reset(self, seed: int, env_offset: int) -> None:
        """Resets every env (see :meth:`EnvRows.reset`) and drops a partial fragment."""
        self.settle()
        obs, mask = self.envs.reset(seed, env_offset)
        self._obs = [obs[part] for part in self.parts]
        self._mask = [mask[part] for part in self.parts]
        self._buf = None
        self._final.clear()
        self._t = 0
        self._ret[:] = 0.0
        self._len[:] = 0

    def boundary_state(self) -> dict[str, Any]:
        """What the loop keeps between fragments, as copies: the envs' snapshot
        (:meth:`EnvRows.get_state`), the observations and mask the next step acts on,
        the running episode returns and lengths and the next sequence number (which
        also fixes the step count the sampling noise is keyed by).

        Raises:
            RuntimeError: a fragment is partly collected (only a boundary is a state).
            TypeError: the envs have no snapshots (Gymnasium envs).
        """
        if self.in_fragment or self._in_flight:
            raise RuntimeError("the loop is inside a fragment; its state exists only between two")
        if not self._obs:
            raise RuntimeError("reset() the loop first")
        return {
            "envs": self.envs.get_state(),
            "obs": np.concatenate(self._obs) if len(self._obs) > 1 else self._obs[0].copy(),
            "agent_mask": np.concatenate(self._mask),
            "episode_returns": self._ret.copy(),
            "episode_lengths": self._len.copy(),
            "sequence": self.sequence,
        }

    def restore_boundary(self, state: dict[str, Any]) -> None:
        """Restores :meth:`boundary_state`: everything is checked before anything
        changes, and the envs restore all or nothing, so on error the loop is unchanged.

        Raises:
            RuntimeError: a fragment is partly collected.
            ValueError: an array does not fit (expected and actual in the message).
            simkit.errors.InvalidState: the envs reject their snapshot.
        """
        if self.in_fragment or self._in_flight:
            raise RuntimeError("the loop is inside a fragment; restore it between two")
        if not self._obs:
            raise RuntimeError("reset() the loop first")
        r = self.envs.num_rows
        current = np.concatenate(self._obs)
        want: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {
            "obs": (current.shape, current.dtype),
            "agent_mask": ((r,), np.dtype(np.bool_)),
            "episode_returns": ((r,), np.dtype(np.float64)),
            "episode_lengths": ((r,), np.dtype(np.int64)),
        }
        for name, (shape, dtype) in want.items():
            arr = np.asarray(state[name])
            if arr.shape != shape or arr.dtype != dtype:
                raise ValueError(f"{name} must be {dtype} {shape}, got {arr.dtype} {arr.shape}")
        self.envs.set_state(state["envs"])
        obs = np.array(state["obs"])
        mask = np.array(state["agent_mask"], dtype=np.bool_)
        self._obs = [obs[part] for part in self.parts]
        self._mask = [mask[part] for part in self.parts]
        self._ret[:] = state["episode_returns"]
        self._len[:] = state["episode_lengths"]
        self.sequence = int(state["sequence"])
        self._buf = None
        self._t = 0

    @property
    def in_fragment(self) -> bool:
        """Whether a fragment is partly collected."""
        return self._t > 0

    def take_times(self) -> LoopTimes:
        """The times since the last call (and restarts the count)."""
        times, self.times = self.times, LoopTimes()
        return times

    def step(self) -> Fragment | None:
        """One act + env step over every row; the finished fragment after its ``T``-th.

        Double-buffered, the step's env results are collected by the next call (or
        :meth:`settle`); the ``T``-th step collects its own.
        """
        if not self._obs:
            raise RuntimeError("reset() the loop before stepping")
        policy = self.policy
        if policy.version is None:
            raise RuntimeError("the policy has no weights yet")
        t = self._t
        if t == 0:
            self._start_state = self.envs.get_state() if self.with_states else None
            self._buf = _Buffer(
                self.fragment_length,
                self.envs.num_rows,
                np.concatenate(self._obs) if len(self._obs) > 1 else self._obs[0],
                self.action_shape,
                policy.action_dtype,
            )
        buf = self._buf
        assert buf is not None
        times = self.times
        for k, part in enumerate(self.parts):
            if self._in_flight:
                self._collect(k, t - 1)
            obs, mask = self._obs[k], self._mask[k]
            out = policy.act(obs, self.sequence * self.fragment_length + t, self._act_parts[k])
            self._sent[k] = time.perf_counter()
            self.envs.send(k, out.actions)
            buf.obs[t, part] = obs
            buf.actions[t, part] = out.actions
            buf.log_probs[t, part] = np.where(mask, out.log_probs, 0.0)
            buf.values[t, part] = np.where(mask, out.values, 0.0)
            buf.agent_mask[t, part] = mask
            times.inference += out.seconds
            times.rows += int(obs.shape[0])
            times.inference_calls.append((int(obs.shape[0]), out.seconds))
        self._write_final_values()
        buf.policy_version[t] = policy.version
        self._in_flight = True
        self._t = t + 1
        times.steps += 1
        if not self.double_buffered or self._t == self.fragment_length:
            self.settle()
        if self._t < self.fragment_length:
            return None
        return self._finish()

    def set_weights(self, weights: PolicyWeights) -> None:
        """Loads ``weights`` between two steps: a step in flight is settled first, so
        its final values come from the weights that acted (unchanged on error)."""
        self.settle()
        self._write_final_values()
        self.policy.set_weights(weights)

    def settle(self) -> None:
        """Collects the env results of the step in flight, if any (double-buffered)."""
        if self._in_flight:
            for k in range(len(self.parts)):
                self._collect(k, self._t - 1)
            self._in_flight = False

    def _collect(self, k: int, t: int) -> None:
        """Receives part ``k``'s env step ``t`` and records it."""
        step = self.envs.recv(k)
        env_s = time.perf_counter() - self._sent[k]
        part = self.parts[k]
        buf = self._buf
        assert buf is not None
        mask = self._mask[k]
        buf.rewards[t, part] = step.reward
        buf.terminated[t, part] = step.terminated
        buf.truncated[t, part] = step.truncated
        cut = step.truncated & ~step.terminated & mask
        times = self.times
        if cut.any():  # resolved after the next act (one synchronisation per step on CUDA)
            v0 = time.perf_counter()
            self._final.append((t, part, cut, self.policy.value_later(step.final_obs, cut, part)))
            times.inference += time.perf_counter() - v0
        ret, length = self._ret[part], self._len[part]  # views
        ret += np.where(mask, step.reward, 0.0)
        length += mask
        ended = np.flatnonzero((step.terminated | step.truncated) & mask)
        first = part.start or 0
        if len(ended):
            buf.final_obs.append(np.asarray(step.final_obs)[ended])
            buf.final_index.append(t * self.envs.num_rows + first + ended)
        for row in ended.tolist():
            buf.ep_returns.append(float(ret[row]))
            buf.ep_lengths.append(int(length[row]))
            buf.ep_rows.append(first + row)
        ret[ended] = 0.0
        length[ended] = 0
        self._obs[k], self._mask[k] = step.obs, step.mask
        times.env += env_s
        times.env_calls.append(env_s)

    def _write_final_values(self) -> None:
        """Writes the final values asked for since the last call into the fragment."""
        if not self._final:
            return
        v0 = time.perf_counter()
        buf = self._buf
        assert buf is not None
        for t, part, cut, result in self._final:
            buf.final_values[t, part] = np.where(cut, result(), 0.0)
        self._final.clear()
        self.times.inference += time.perf_counter() - v0

    def _finish(self) -> Fragment:
        self._write_final_values()
        buf = self._buf
        assert buf is not None
        obs = np.concatenate(self._obs) if len(self._obs) > 1 else self._obs[0].copy()
        mask = np.concatenate(self._mask) if len(self._mask) > 1 else self._mask[0]
        v0 = time.perf_counter()
        last_values = np.where(mask, self.policy.value(obs), 0.0).astype(np.float32)
        self.times.inference += time.perf_counter() - v0
        order = np.argsort(
            np.asarray(buf.ep_rows, dtype=np.int64), kind="stable"
        )  # by row, then time
        if buf.final_index:
            final_index = np.concatenate(buf.final_index).astype(np.int64, copy=False)
            in_order = np.argsort(final_index, kind="stable")
            final_index = final_index[in_order]
            final_obs = np.concatenate(buf.final_obs)[in_order]
        else:
            final_index = np.zeros(0, dtype=np.int64)
            final_obs = np.zeros((0, *obs.shape[1:]), dtype=obs.dtype)
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
            last_obs=obs,
            last_values=last_values,
            env_ids=self.env_ids,
            episode_returns=np.asarray(buf.ep_returns, dtype=np.float64)[order],
            episode_lengths=np.asarray(buf.ep_lengths, dtype=np.int64)[order],
            episode_rows=np.asarray(buf.ep_rows, dtype=np.int64)[order],
            source=self.source,
            sequence=self.sequence,
            start_state=self._start_state,
            final_obs=final_obs,
            final_index=final_index,
        )
        self.sequence += 1
        self._t = 0
        self._buf = None
        self._start_state = None
        return fragment
