"""The rollout loop: act, step, store, autoreset, over env rows on the host or on a device.

No sockets: :class:`RolloutLoop` owns a rollout's :class:`EnvRows` and :class:`RowPolicy`
and turns them into fragments, one :meth:`~RolloutLoop.step` at a time, so a worker can
check for new weights and credit between any two steps.

The loop is written once over an array namespace (:class:`Arrays`): numpy, where the rows
are on the host (a stream session's, the learner's in-process rollout: fragments are
:class:`simkit.Fragment`), or torch on one device, where the rows stay on that device
(:class:`~simkit.rollout._rows.DeviceRows`, the device loop: fragments are
:class:`DeviceFragment` of tensors there). No step reads the rows back: the episodes'
returns and ends go into the fragment's storage, read once at the fragment's end, and the
final values of truncated episodes are computed in one batch before the weights change
or the fragment ends.

Where the envs were split in two parts (:meth:`EnvRows.split`, double-buffered
sampling), a step is pipelined: the physics of one part runs on the env's background
thread while the policy evaluates the other, and a step's env results are collected in
the next call (:meth:`RolloutLoop.settle` collects them at once). Every row acts, steps
and is recorded exactly as in the one-part loop, so the fragments are the same bits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import torch

from simkit._batch_rows import host_arrays
from simkit._types import Fragment, FragmentShape
from simkit.models import PolicyWeights
from simkit.rollout._policy import RowPolicy
from simkit.rollout._rows import EnvRows

__all__ = ["Arrays", "DeviceFragment", "RolloutLoop", "LoopTimes"]

Array: TypeAlias = Any
"""A numpy array, or a tensor on the loop's device (:class:`Arrays` says which)."""


@dataclass
class DeviceFragment(FragmentShape):
    """``T`` steps of ``N`` env slots held as tensors on the rollout's device: the
    fields of :class:`simkit.Fragment` a PPO update reads, single-agent (every row acts).

    Attributes:
        obs, actions, log_probs, values, rewards, terminated, truncated, final_values:
            ``(T, N, ...)`` tensors, as :class:`simkit.Fragment` describes them.
        last_obs, last_values: ``(N, ...)`` the observation after the last step and its
            value.
        policy_version: ``(T,)`` int64 (host) version of the weights of each step.
        episode_returns, episode_lengths: ``(E,)`` float64 and int64 (host): the
            episodes that ended in the fragment, by slot, then by step.
        episode_rows: ``(E,)`` int64 (host): the slot of each.
        sequence: the source's running fragment number, from 0.
        source: who produced it.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    final_values: torch.Tensor
    last_obs: torch.Tensor
    last_values: torch.Tensor
    policy_version: np.ndarray
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    episode_rows: np.ndarray
    sequence: int = 0
    source: str = ""

    def to_host(self) -> Fragment:
        """A numpy :class:`simkit.Fragment` of the same steps (a copy; tests and tools,
        never the device loop itself)."""
        t, n = self.num_steps, self.num_rows

        def host(x: torch.Tensor) -> np.ndarray:
            out: np.ndarray = x.detach().cpu().numpy().copy()
            return out

        return Fragment(
            obs=host(self.obs),
            actions=host(self.actions),
            log_probs=host(self.log_probs),
            values=host(self.values),
            rewards=host(self.rewards),
            terminated=host(self.terminated),
            truncated=host(self.truncated),
            final_values=host(self.final_values),
            agent_mask=np.ones((t, n), dtype=np.bool_),
            policy_version=self.policy_version.copy(),
            last_obs=host(self.last_obs),
            last_values=host(self.last_values),
            env_ids=np.arange(n, dtype=np.int64),
            episode_returns=self.episode_returns.copy(),
            episode_lengths=self.episode_lengths.copy(),
            episode_rows=self.episode_rows.copy(),
            source=self.source,
            sequence=self.sequence,
        )


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


class Arrays:
    """The array namespace of a rollout: numpy on the host (``device`` None), or torch
    on one device, where the loop's rows, storage and fragments stay."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Array:
        """Zeros of ``dtype`` (a numpy dtype, or the dtype of an array of this namespace)."""
        if self.device is None:
            return np.zeros(shape, dtype=dtype)
        if not isinstance(dtype, torch.dtype):
            dtype = torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def where(self, cond: Array, x: Array, other: float) -> Array:
        """``x`` where ``cond``, else ``other``."""
        if self.device is None:
            return np.where(cond, x, other)
        return torch.where(cond, x, other)

    def join(self, parts: list[Array]) -> Array:
        """The rows of ``parts`` as one new array."""
        if self.device is None:
            return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        return torch.cat(parts) if len(parts) > 1 else parts[0].clone()

    def host(self, x: Array) -> np.ndarray:
        """``x`` on the host (a copy: a read back from a device)."""
        out: np.ndarray = np.array(host_arrays(x))
        return out

    def from_host(self, x: np.ndarray) -> Array:
        """``x`` in this namespace (a copy)."""
        if self.device is None:
            return np.array(x)
        return torch.from_numpy(np.array(x)).to(self.device)


class _Buffer:
    """Arrays of one fragment being collected (fresh per fragment: the previous one may
    still be on its way to the learner, zero-copy, or in its update). Beside the
    fragment's fields: every row's final observation and, at each step, the return and
    length its episode had (read where the episode ended)."""

    def __init__(
        self, xp: Arrays, t: int, r: int, obs: Array, action_shape: tuple[int, ...], actions: Any
    ) -> None:
        rows = (t, r)
        self.obs = xp.zeros((t, r, *obs.shape[1:]), obs.dtype)
        self.final_obs = xp.zeros((t, r, *obs.shape[1:]), obs.dtype)
        self.actions = xp.zeros((t, r, *action_shape), actions)
        self.log_probs = xp.zeros(rows, np.float32)
        self.values = xp.zeros(rows, np.float32)
        self.rewards = xp.zeros(rows, np.float64)
        self.terminated = xp.zeros(rows, np.bool_)
        self.truncated = xp.zeros(rows, np.bool_)
        self.final_values = xp.zeros(rows, np.float32)
        self.agent_mask = xp.zeros(rows, np.bool_)
        self.ep_returns = xp.zeros(rows, np.float64)
        self.ep_lengths = xp.zeros(rows, np.int64)
        self.policy_version = np.zeros(t, dtype=np.int64)


class RolloutLoop:
    """Collects fragments of ``fragment_length`` steps over every row of ``envs``.

    Step ``t`` stores the observation acted on, the sampled action, its log-prob and
    value, the reward and flags; where an episode was truncated (and not terminated),
    ``final_values`` holds the value of the final observation under the policy version
    that acted, computed for the steps since the last weight change in one batch. At
    the end, ``last_obs``/``last_values`` bootstrap the rest.

    With ``envs`` split in two parts, the parts are acted on and stepped one after the
    other through ``send``/``recv``, so one part's physics overlaps the other's forward
    pass. Weights must not change while a step is in flight: load them with
    :meth:`set_weights`, which settles first.

    Args:
        envs: the rollout's envs (:class:`~simkit.rollout._rows.DeviceRows`: on their
            device, the loop's arrays there too).
        policy: the rollout's policy (acting where the rows are).
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
        self.xp = Arrays(envs.device)
        self.parts = list(envs.parts)
        # The one-part loop acts on every row at once (the policy's whole-batch path).
        self._act_parts: list[slice | None] = [*self.parts] if len(self.parts) > 1 else [None]
        per_env = envs.agents_per_env
        self.env_ids = np.repeat(np.arange(envs.num_envs, dtype=np.int64) + env_offset, per_env)
        self.action_shape = tuple(envs.action_space.shape or ())
        self.sequence = 0
        self.times = LoopTimes()
        self._obs: list[Array] = []
        self._mask: list[Array] = []
        self._sent = [0.0] * len(self.parts)
        self._in_flight = False
        self._buf: _Buffer | None = None
        self._start_state: dict[str, Any] | None = None
        self._t = 0
        self._valued = 0
        """Steps whose final values are written (the rest wait for a batch)."""
        self._ret: Array = self.xp.zeros((envs.num_rows,), np.float64)
        self._len: Array = self.xp.zeros((envs.num_rows,), np.int64)

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
        self._t = 0
        self._ret[:] = 0.0
        self._len[:] = 0

    def boundary_state(self) -> dict[str, Any]:
        """What the loop keeps between fragments, as host copies: the envs' snapshot
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
        xp = self.xp
        return {
            "envs": self.envs.get_state(),
            "obs": xp.host(xp.join(self._obs)),
            "agent_mask": xp.host(xp.join(self._mask)),
            "episode_returns": xp.host(self._ret),
            "episode_lengths": xp.host(self._len),
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
        xp, r = self.xp, self.envs.num_rows
        current = xp.host(xp.join(self._obs))
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
        obs = xp.from_host(state["obs"])
        mask = xp.from_host(state["agent_mask"])
        self._obs = [obs[part] for part in self.parts]
        self._mask = [mask[part] for part in self.parts]
        self._ret = xp.from_host(state["episode_returns"])
        self._len = xp.from_host(state["episode_lengths"])
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

    def step(self) -> Fragment | DeviceFragment | None:
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
            self.envs.begin()
            self._start_state = self.envs.get_state() if self.with_states else None
            self._valued = 0
            self._buf = _Buffer(
                self.xp,
                self.fragment_length,
                self.envs.num_rows,
                self._obs[0],
                self.action_shape,
                policy.action_dtype,
            )
        buf = self._buf
        assert buf is not None
        times, where = self.times, self.xp.where
        for k, part in enumerate(self.parts):
            if self._in_flight:
                self._collect(k, t - 1)
            obs, mask = self._obs[k], self._mask[k]
            out = policy.act(obs, self.sequence * self.fragment_length + t, self._act_parts[k])
            self._sent[k] = time.perf_counter()
            self.envs.send(k, out.actions)
            buf.obs[t, part] = obs
            buf.actions[t, part] = out.actions
            buf.log_probs[t, part] = where(mask, out.log_probs, 0.0)
            buf.values[t, part] = where(mask, out.values, 0.0)
            buf.agent_mask[t, part] = mask
            times.inference += out.seconds
            times.rows += int(obs.shape[0])
            times.inference_calls.append((int(obs.shape[0]), out.seconds))
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
        """Receives part ``k``'s env step ``t`` and records it: the step, and each row's
        episode return and length so far (kept where its episode ended, then zeroed)."""
        step = self.envs.recv(k)
        env_s = time.perf_counter() - self._sent[k]
        part = self.parts[k]
        buf = self._buf
        assert buf is not None
        where, mask = self.xp.where, self._mask[k]
        buf.rewards[t, part] = step.reward
        buf.terminated[t, part] = step.terminated
        buf.truncated[t, part] = step.truncated
        buf.final_obs[t, part] = step.final_obs
        ret, length = self._ret[part], self._len[part]  # views
        ret += where(mask, step.reward, 0.0)
        length += mask
        buf.ep_returns[t, part] = ret
        buf.ep_lengths[t, part] = length
        ended = (step.terminated | step.truncated) & mask
        ret[...] = where(ended, 0.0, ret)
        length[...] = where(ended, 0, length)
        self._obs[k], self._mask[k] = step.obs, step.mask
        self.times.env += env_s
        self.times.env_calls.append(env_s)

    def _write_final_values(self) -> None:
        """Writes the final values of the truncations collected since the last call, in
        one batch, under the weights that acted."""
        buf, first, end = self._buf, self._valued, self._t
        if buf is None or end <= first:
            return
        v0 = time.perf_counter()
        cut = buf.truncated[first:end] & ~buf.terminated[first:end] & buf.agent_mask[first:end]
        buf.final_values[first:end] = self.policy.final_values(buf.final_obs[first:end], cut)
        self._valued = end
        self.times.inference += time.perf_counter() - v0

    def _finish(self) -> Fragment | DeviceFragment:
        self._write_final_values()
        buf = self._buf
        assert buf is not None
        xp = self.xp
        obs, mask = xp.join(self._obs), xp.join(self._mask)
        v0 = time.perf_counter()
        last_values = xp.where(mask, self.policy.value(obs), 0.0)
        self.times.inference += time.perf_counter() - v0
        ended = xp.host((buf.terminated | buf.truncated) & buf.agent_mask)
        rows, steps = np.nonzero(ended.T)  # by row, then step
        returns, lengths = xp.host(buf.ep_returns), xp.host(buf.ep_lengths)
        common: dict[str, Any] = {
            "obs": buf.obs,
            "actions": buf.actions,
            "log_probs": buf.log_probs,
            "values": buf.values,
            "rewards": buf.rewards,
            "terminated": buf.terminated,
            "truncated": buf.truncated,
            "final_values": buf.final_values,
            "policy_version": buf.policy_version,
            "last_obs": obs,
            "episode_returns": returns[steps, rows],
            "episode_lengths": lengths[steps, rows],
            "episode_rows": rows.astype(np.int64),
            "sequence": self.sequence,
            "source": self.source,
        }
        fragment: Fragment | DeviceFragment
        if xp.device is not None:
            fragment = DeviceFragment(last_values=last_values, **common)
        else:
            at_step, at_row = np.nonzero(ended)  # by step, then row: the flat index order
            fragment = Fragment(
                last_values=last_values.astype(np.float32),
                agent_mask=buf.agent_mask,
                env_ids=self.env_ids,
                start_state=self._start_state,
                final_obs=buf.final_obs[at_step, at_row],
                final_index=(at_step * ended.shape[1] + at_row).astype(np.int64),
                **common,
            )
        self.sequence += 1
        self._t = 0
        self._buf = None
        self._start_state = None
        return fragment
