"""An in-process fragment source: the learner's local loop and the baseline of the stream.

:class:`LocalSource` steps a :class:`simkit.vector.VectorEnv` (single-agent ids and
``gym:<id>``) or a :class:`simkit.vector.MultiAgentVectorEnv` (multi-agent ids, one row
per (env, agent)) with one batched forward per step, sampling with its own seeded
``torch.Generator``, and cuts :class:`simkit.Fragment` s of ``T`` steps with exactly the
semantics of that type's docstring. It satisfies :class:`FragmentSource`, the small
interface the PPO learner consumes, which a stream of rollout servers satisfies too.

Sync mode rolls out a fragment when the learner asks for one, with the weights it last
pushed (exactly on-policy, deterministic). Async mode rolls out on a thread with the
newest weights it has, at most ``prefetch`` fragments ahead, so the learner's update
overlaps the next rollout.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

import simkit
from simkit._types import Fragment
from simkit.models import ActorCritic, numpy_actions
from simkit.models._lean import LeanMLP
from simkit.vector import MultiAgentVectorEnv, VectorEnv

__all__ = ["FragmentSource", "LocalSource", "GYM_PREFIX", "is_multi_agent", "make_vector"]

GYM_PREFIX = "gym:"


class FragmentSource(Protocol):
    """What the learner needs from whoever produces experience (``PolicyStream`` too)."""

    def fragments(self) -> Iterator[Fragment | None]: ...

    def push_weights(self, weights: torch.nn.Module, *, version: int | None = None) -> int: ...

    def close(self) -> None: ...


def is_multi_agent(env_id: str) -> bool:
    """Whether ``env_id`` names a simkit multi-agent env (``gym:<id>`` never does)."""
    return (
        not env_id.startswith(GYM_PREFIX) and simkit.spec(env_id).kind is simkit.EnvKind.MULTI_AGENT
    )


def make_vector(
    env_id: str, num_envs: int, num_threads: int = 1, *, render_mode: str | None = None
) -> VectorEnv | MultiAgentVectorEnv:
    """The local vector of ``env_id`` (``gym:<id>`` builds the installed Gymnasium env).

    ``render_mode`` (e.g. ``"rgb_array"``) is passed to every env's constructor.
    """
    kwargs: dict[str, Any] = {} if render_mode is None else {"render_mode": render_mode}
    if env_id.startswith(GYM_PREFIX):
        gym_id = env_id[len(GYM_PREFIX) :]
        gym.spec(gym_id)
        return VectorEnv([lambda: gym.make(gym_id, **kwargs)] * num_envs, num_threads=num_threads)
    if is_multi_agent(env_id):
        return MultiAgentVectorEnv(env_id, num_envs, env_kwargs=kwargs)
    if simkit.spec(env_id).kind is simkit.EnvKind.BATCH:
        raise ValueError(f"{env_id!r} is a batch env; train it through a rollout server")
    return VectorEnv(env_id, num_envs, num_threads=num_threads, env_kwargs=kwargs)


class LocalSource:
    """Rolls out ``model`` over a local vector and yields :class:`Fragment` s.

    Args:
        env_id: a simkit id (single or multi-agent) or ``gym:<id>``.
        model: the policy; the source keeps its own copy and only reads pushed weights.
        num_envs: env slots.
        num_steps: ``T``, steps per fragment.
        seed: root seed of the envs and of the sampling generator.
        mode: ``"sync"`` or ``"async"``.
        prefetch: async only, fragments rolled out ahead of the learner.
        num_threads: env stepping threads (MuJoCo releases the GIL).
        lean: act through :class:`~simkit.models._lean.LeanMLP` (numpy) where the
            model is a plain MLP; else ``model.act`` (torch).
    """

    def __init__(
        self,
        env_id: str,
        model: ActorCritic,
        *,
        num_envs: int,
        num_steps: int,
        seed: int,
        mode: str = "sync",
        prefetch: int = 1,
        num_threads: int = 1,
        lean: bool = True,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.env_id = env_id
        self.mode = mode
        self.num_steps = num_steps
        self.name = f"local:{env_id}"
        self.vector = make_vector(env_id, num_envs, num_threads)
        self.multi_agent = isinstance(self.vector, MultiAgentVectorEnv)
        self.observation_space = self.vector.single_observation_space
        self.action_space = self.vector.single_action_space
        self.num_rows = self.vector.num_rows if self.multi_agent else num_envs  # type: ignore[union-attr]  # num_rows exists on the multi-agent vector
        self.model = copy.deepcopy(model)
        self.model.eval()
        self.lean = LeanMLP.of(self.model) if lean else None
        """The numpy act path (:mod:`simkit.models._lean`), None for other models."""
        self.version = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.sequence = 0
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self.num_envs = num_envs
        self._lock = threading.Lock()
        self._times = {"env": 0.0, "inference": 0.0}
        if isinstance(self.vector, MultiAgentVectorEnv):
            obs, self._mask, _ = self.vector.reset(seed=seed)
        else:
            obs, _ = self.vector.reset(seed=seed)
            self._mask = np.ones(num_envs, dtype=np.bool_)
        self._obs = np.asarray(obs)
        self._ep_return = np.zeros(self.num_rows)
        self._ep_length = np.zeros(self.num_rows, dtype=np.int64)
        self._queue: queue.Queue[Fragment | BaseException] = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ weights

    def push_weights(self, weights: torch.nn.Module, *, version: int | None = None) -> int:
        """New weights (normalisation buffers included), used from the next fragment on."""
        v = self.version + 1 if version is None else version
        copied = {k: t.detach().clone() for k, t in weights.state_dict().items()}
        with self._lock:
            self._pending = (v, copied)
        if self.mode == "sync":
            self._swap()
        return v

    def _swap(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self.version, tensors = pending
            self.model.load_state_dict(tensors)
            if self.lean is not None:
                self.lean.load()

    # ------------------------------------------------------------------ rollout

    def rollout(self) -> Fragment:
        """Steps ``T`` times with the current weights and returns the fragment."""
        T, R = self.num_steps, self.num_rows
        model, gen, lean = self.model, self.generator, self.lean
        obs_buf = np.empty((T, *self._obs.shape), dtype=self._obs.dtype)
        act_list: list[np.ndarray] = []
        logp = np.empty((T, R), dtype=np.float32)
        values = np.empty((T, R), dtype=np.float32)
        rewards = np.empty((T, R), dtype=np.float64)
        term = np.empty((T, R), dtype=np.bool_)
        trunc = np.empty((T, R), dtype=np.bool_)
        final_values = np.zeros((T, R), dtype=np.float32)
        mask = np.empty((T, R), dtype=np.bool_)
        ep_returns: list[float] = []
        ep_lengths: list[int] = []
        ep_rows: list[int] = []
        t_env = t_inf = 0.0
        start_seq = self.sequence
        for t in range(T):
            t0 = time.perf_counter()
            obs_buf[t] = self._obs
            mask[t] = self._mask
            if lean is not None:
                actions, logp[t], values[t] = lean.act(self._obs, gen)
            else:
                out = model.act(self._obs, generator=gen)
                actions = numpy_actions(out.actions)
                logp[t] = out.log_probs.numpy()
                values[t] = out.values.numpy()
            act_list.append(actions)
            t1 = time.perf_counter()
            if self.multi_agent:
                step: Any = self.vector.step(actions)
                acted = step.acted
                self._mask = step.agent_mask
            else:
                step = self.vector.step_batch(actions)  # type: ignore[union-attr]  # single-agent vector
                acted = self._mask
            t2 = time.perf_counter()
            r = np.where(acted, step.reward, 0.0)
            rewards[t] = r
            term[t] = step.terminated & acted
            trunc[t] = step.truncated & acted
            cut = trunc[t] & ~term[t]
            if cut.any():
                rows = np.flatnonzero(cut)
                final = np.asarray(step.final_obs)[rows]
                final_values[t, rows] = self._value(final)
            self._ep_return += r
            self._ep_length += acted
            for row in np.flatnonzero(term[t] | trunc[t]):
                ep_returns.append(float(self._ep_return[row]))
                ep_lengths.append(int(self._ep_length[row]))
                ep_rows.append(int(row))
                self._ep_return[row] = 0.0
                self._ep_length[row] = 0
            self._obs = np.asarray(step.obs)
            t3 = time.perf_counter()
            t_inf += (t1 - t0) + (t3 - t2)
            t_env += t2 - t1
        t0 = time.perf_counter()
        last_values = self._value(self._obs)
        t_inf += time.perf_counter() - t0
        with self._lock:
            self._times["env"] += t_env
            self._times["inference"] += t_inf
        self.sequence += 1
        return Fragment(
            obs=obs_buf,
            actions=np.stack(act_list),
            log_probs=logp,
            values=values,
            rewards=rewards,
            terminated=term,
            truncated=trunc,
            final_values=final_values,
            agent_mask=mask,
            policy_version=np.full(T, self.version, dtype=np.int64),
            last_obs=self._obs.copy(),
            last_values=last_values.astype(np.float32),
            env_ids=np.arange(R, dtype=np.int64) // (R // self.vector.num_envs),
            episode_returns=np.asarray(ep_returns, dtype=np.float64),
            episode_lengths=np.asarray(ep_lengths, dtype=np.int64),
            episode_rows=np.asarray(ep_rows, dtype=np.int64),
            source=self.name,
            sequence=start_seq,
        )

    def _value(self, obs: np.ndarray) -> np.ndarray:
        if self.lean is not None:
            return self.lean.value(obs)
        with torch.no_grad():
            out: np.ndarray = self.model.value(obs).numpy()
        return out

    def _produce(self) -> None:
        try:
            while not self._stop.is_set():
                self._swap()
                fragment = self.rollout()
                while not self._stop.is_set():
                    try:
                        self._queue.put(fragment, timeout=0.05)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the learner, which re-raises it
            self._queue.put(exc)

    def fragments(self) -> Iterator[Fragment]:
        """Fragments forever: rolled out on demand (sync) or by the rollout thread (async)."""
        if self.mode == "sync":
            while True:
                yield self.rollout()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._produce, name="simkit-rollout", daemon=True
            )
            self._thread.start()
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    def timings(self) -> dict[str, float]:
        """Seconds spent stepping envs and in inference since the last call."""
        with self._lock:
            out, self._times = self._times, {"env": 0.0, "inference": 0.0}
        return out

    # ------------------------------------------------------------------ state

    def get_state(self, *, include_envs: bool = True) -> dict[str, Any]:
        """Plain data to resume the rollout exactly (sync mode): envs, obs, generator, counters.

        The env snapshot is ``None`` for envs without ``get_state`` (Gymnasium's) and
        without ``include_envs`` (async mode, where the rollout thread owns the envs);
        such envs restart with a fresh reset on resume.
        """
        vector_state: Any = None
        if include_envs:
            try:
                vector_state = self.vector.get_state()
            except TypeError:
                vector_state = None
        return {
            "vector": vector_state,
            "obs": self._obs.copy(),
            "mask": self._mask.copy(),
            "ep_return": self._ep_return.copy(),
            "ep_length": self._ep_length.copy(),
            "generator": self.generator.get_state().numpy().copy(),
            "sequence": self.sequence,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` (the vector's snapshot only where one was taken)."""
        if state["vector"] is not None:
            self.vector.set_state(state["vector"])
            self._obs = np.asarray(state["obs"]).copy()
            self._mask = np.asarray(state["mask"], dtype=np.bool_).copy()
            self._ep_return = np.asarray(state["ep_return"], dtype=np.float64).copy()
            self._ep_length = np.asarray(state["ep_length"], dtype=np.int64).copy()
        self.generator.set_state(
            torch.from_numpy(np.asarray(state["generator"], dtype=np.uint8).copy())
        )
        self.sequence = int(state["sequence"])

    def close(self) -> None:
        """Stops the rollout thread and closes the envs."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.vector.close()
