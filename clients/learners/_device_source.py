"""The whole loop on one device: a torch :class:`simkit.BatchEnv`, the keyed noise, the
policy and the fragment storage on the learner's device, with no host round trip.

:class:`DeviceSource` is the in-process fragment source of a run whose env is a batch
env with device-resident steps (:meth:`simkit.BatchEnv.reset_masked`): it builds the env
on the learner's device (``device=``, ``validate_actions=False``), acts with its own copy
of the policy there (``model.act`` on the device-resident observations), samples from
the run's keyed noise computed on the device (:class:`simkit._noise.TorchSlotNoise`, a
whole fragment's noise at once: the bits :class:`~simkit._noise.SlotNoise` gives on the
host; a Gaussian head's normal noise is drawn on the host once per fragment and copied,
as :class:`~simkit.rollout._policy.RowPolicy` does) and writes every step into
tensors preallocated ``[T, N, ...]`` on the device. A fragment is a
:class:`DeviceFragment` of those tensors; :meth:`simkit.clients.learners.ppo.PPO.update`
computes reward scaling, GAE and the update from them where they are.

Per fragment the host does: one :meth:`~simkit.BatchEnv.prepare_device_steps` (one read
of the episode counters), the noise's few PCG64 states (a copy to the device) and one
:meth:`~simkit.BatchEnv.read_episode_stats` (the episode statistics, read back once at
the fragment's end). Nothing in the per-step loop reads a tensor back. On ``cpu`` the
same code runs, which is how the tests cover it.

Its fragments are not bit-identical to :class:`~simkit.clients.learners._local_source.LocalSource`'s
(which acts through the numpy ``LeanMLP``): the actions come from the same keyed noise,
but the forward pass is torch's on a batch, whose last bits may differ. A sync run is
deterministic (same seed, same device: same parameters) and resumes exactly.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from simkit._batch import BatchEnv
from simkit._noise import SlotNoise, TorchSlotNoise
from simkit._types import Fragment, FragmentShape
from simkit.models import ActorCritic
from simkit.registry import EnvKind, make, spec

__all__ = ["DeviceFragment", "DeviceSource", "device_loop_support", "use_device_loop"]


@dataclass
class DeviceFragment(FragmentShape):
    """``T`` steps of ``N`` env slots held as tensors on the rollout's device: the
    fields of :class:`simkit.Fragment` a PPO update reads, single-agent (every row acts).

    The tensors are the source's preallocated storage, overwritten by its next
    fragment: a sync learner consumes a fragment before asking for the next one.

    Attributes:
        obs, actions, log_probs, values, rewards, terminated, truncated, final_values:
            ``(T, N, ...)`` tensors, as :class:`simkit.Fragment` describes them.
        last_obs, last_values: ``(N, ...)`` the observation after the last step and its
            value.
        policy_version: ``(T,)`` int64 (host) version of the weights of each step.
        episode_returns, episode_lengths: ``(E,)`` float64 (host): each slot's mean
            return and length over the ``k`` episodes it completed in this fragment,
            repeated ``k`` times (from :meth:`simkit.BatchEnv.read_episode_stats`, which
            keeps sums: their mean is the exact mean over the fragment's episodes).
        episode_rows: ``(E,)`` int64 (host): the slot of each, in slot order.
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
        never the device loop itself; the episode lengths, per-slot means, rounded
        down to integers)."""
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
            episode_lengths=self.episode_lengths.astype(np.int64),
            episode_rows=self.episode_rows.copy(),
            source=self.source,
            sequence=self.sequence,
        )


def device_loop_support(
    env_id: str, env_kwargs: Mapping[str, Any] | None = None, device: Any = None
) -> str | None:
    """Why ``env_id`` cannot run the device loop, or ``None`` where it can: a batch env
    whose class has the masked reset hook (:meth:`simkit.BatchEnv.reset_masked`) or
    declares :attr:`~simkit.BatchEnv.time_limit_only` (resets scheduled on the host),
    so its whole-batch steps stay on the device. A MuJoCo batch (built with
    ``env_kwargs`` on ``device``; None: the class alone is judged) computes on the device
    only on MuJoCo Warp, which needs the ``gpu`` extra."""
    if env_id.startswith("gym:"):
        return f"{env_id} is a Gymnasium env (the device loop needs a simkit batch env)"
    env_spec = spec(env_id)
    if env_spec.kind is not EnvKind.BATCH:
        return f"{env_id} is a {env_spec.kind.value} env (the device loop needs a batch env)"
    factory = env_spec.load()
    hook = getattr(factory, "reset_masked", None)
    if not isinstance(factory, type) or (
        (hook is BatchEnv.reset_masked or hook is None)
        and not getattr(factory, "time_limit_only", False)
    ):
        return (
            f"{env_id} has no device-resident steps (its class does not implement "
            "BatchEnv.reset_masked)"
        )
    if device is not None and _is_mujoco_batch(factory):
        from simkit._batch_mujoco import resolve_backend

        backend = resolve_backend((env_kwargs or {}).get("backend", "auto"), device)
        if backend != "mjwarp":
            return (
                f"{env_id} computes on the host on backend {backend!r} (the device loop "
                "needs --env-kwarg backend=mjwarp, or a CUDA --device)"
            )
        if importlib.util.find_spec("mujoco_warp") is None:
            return f"{env_id} on the device needs MuJoCo Warp (pip install 'simkit[gpu]')"
    return None


def _is_mujoco_batch(factory: type) -> bool:
    """Whether ``factory`` is a :class:`simkit.BatchMujocoEnv` (importing MuJoCo only
    where the env's own module did)."""
    module = sys.modules.get("simkit._batch_mujoco")
    return module is not None and issubclass(factory, module.BatchMujocoEnv)


def use_device_loop(
    *,
    env_id: str,
    choice: str,
    device: torch.device,
    mode: str,
    servers: int,
    connect: bool,
    ray: bool,
    record: bool,
    env_kwargs: Mapping[str, Any] | None = None,
) -> bool:
    """Whether a PPO run rolls out in the device loop (``--device-loop``, ``choice``):
    ``on`` where the run can (else a ``ValueError`` saying why), ``off`` never, ``auto``
    where it can and ``device`` is not the CPU (a CPU run keeps the host rollout, and its
    bits, unless it asks).

    Raises:
        ValueError: ``choice`` is ``on`` and the run cannot (one line, naming why).
    """
    if choice == "off":
        return False
    why: str | None
    if servers or connect or ray:
        why = "it rolls out in the learner's process (--servers 0, no --connect or --ray)"
    elif mode != "sync":
        why = f"it runs in sync mode only, got --mode {mode}"
    elif record:
        why = "--record records host fragments (the device loop's never leave the device)"
    else:
        why = device_loop_support(env_id, env_kwargs, device)
    if choice == "on":
        if why is not None:
            raise ValueError(f"--device-loop on: {why}")
        return True
    return why is None and device.type != "cpu"


class DeviceSource:
    """Rolls out ``model`` over a torch batch env on ``device`` and yields
    :class:`DeviceFragment` s (sync mode: a fragment when the learner asks for one,
    with the weights it last pushed).

    Args:
        env_id: a batch env id with device-resident steps (:func:`device_loop_support`).
        model: the policy; the source keeps its own copy on ``device`` and only reads
            pushed weights.
        device: where the env, the policy and the fragments live.
        env_kwargs: more constructor arguments of the env (``backend="mjwarp"``).
        num_envs: env slots (``N``).
        num_steps: ``T``, steps per fragment.
        seed: root seed of the env and of the sampling noise.

    Raises:
        ValueError: the env cannot run on the device, or ``num_steps`` < 1.
    """

    mode = "sync"

    def __init__(
        self,
        env_id: str,
        model: ActorCritic,
        *,
        num_envs: int,
        num_steps: int,
        seed: int,
        device: torch.device,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        why = device_loop_support(env_id)
        if why is not None:
            raise ValueError(f"the device loop cannot run {env_id}: {why}")
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.env_id = env_id
        self.name = f"device:{env_id}"
        self.device = device
        self.num_envs = self.num_rows = num_envs
        self.num_steps = num_steps
        built = {"num_envs": num_envs, "device": device, "validate_actions": False}
        self.env: Any = make(env_id, **{**dict(env_kwargs or {}), **built})
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self.model = copy.deepcopy(model).to(device)
        self.model.eval()
        head = self.model.head
        self.host_noise = SlotNoise(
            seed,
            first_slot=0,
            num_slots=num_envs,
            rows_per_slot=1,
            width=head.noise_width,
            kind="normal" if head.noise_kind == "normal" else "uniform",
        )
        self.noise = (
            TorchSlotNoise(self.host_noise, device) if self.host_noise.kind == "uniform" else None
        )
        self._bounds: tuple[torch.Tensor, torch.Tensor] | None = None
        if isinstance(self.action_space, spaces.Box):
            # What validate_actions does under ActionBounds.CLIP, on the device.
            self._bounds = (
                torch.as_tensor(self.action_space.low, device=device),
                torch.as_tensor(self.action_space.high, device=device),
            )
        self.env.seeds.env_offset = 0
        obs, _ = self.env.reset(seed=seed)
        if not self.env.prepare_device_steps(num_steps):
            self.env.close()
            raise ValueError(
                f"the device loop cannot run {env_id}: its steps fall back to the host path "
                "(per-instance randomization overrides or non-scalar parameters, or "
                "resets on the host on a backend that computes there)"
            )
        self._obs: torch.Tensor = obs
        self._ret = torch.zeros(num_envs, dtype=torch.float64, device=device)
        """Each slot's running episode return (for checkpoints: the env's snapshot does
        not hold it)."""
        self._carry: np.ndarray | None = None
        """Resumed: each slot's return before the resume, added to its first episode."""
        self.sequence = 0
        self.version = 0
        self._own: tuple[list[str], list[torch.Tensor]] | None = None
        self._buf: dict[str, torch.Tensor] | None = None
        self._times = {"env": 0.0, "inference": 0.0}
        self.not_exact: str | None = None
        """Always None: batch envs have snapshots, so a resume continues exactly."""

    # ------------------------------------------------------------------ weights

    def push_weights(self, weights: torch.nn.Module, *, version: int | None = None) -> int:
        """New weights (normalisation statistics included), used from the next fragment
        on: one fused device-to-device copy into the source's own model."""
        tensors = weights.state_dict()
        own = self._own
        if own is None or own[0] != list(tensors):
            mine = self.model.state_dict()
            if set(mine) != set(tensors):
                self.model.load_state_dict(tensors)  # raises, naming the difference
            own = self._own = (list(tensors), [mine[k] for k in tensors])
        with torch.no_grad():
            torch._foreach_copy_(own[1], [t.detach() for t in tensors.values()])
        self.version = self.version + 1 if version is None else version
        return self.version

    # ------------------------------------------------------------------ rollout

    def _storage(self, obs: torch.Tensor, actions: torch.Tensor) -> dict[str, torch.Tensor]:
        t, n, dev = self.num_steps, self.num_envs, self.device

        def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.empty((t, n, *shape), dtype=dtype, device=dev)

        obs_shape = tuple(obs.shape[1:])
        return {
            "obs": empty(obs_shape, obs.dtype),
            "final_obs": empty(obs_shape, obs.dtype),
            "actions": empty(tuple(actions.shape[1:]), actions.dtype),
            "log_probs": empty((), torch.float32),
            "values": empty((), torch.float32),
            "rewards": empty((), torch.float64),
            "terminated": empty((), torch.bool),
            "truncated": empty((), torch.bool),
        }

    def _fragment_noise(self) -> torch.Tensor:
        """``(T, N, width)`` float32 on the device: the keyed noise of this fragment's
        steps (global step ``sequence * T + t``, as :class:`RolloutLoop` keys it)."""
        first = self.sequence * self.num_steps
        if self.noise is not None:
            return self.noise.draw_steps(first, self.num_steps)
        host = torch.from_numpy(
            np.stack([self.host_noise.draw(first + t) for t in range(self.num_steps)])
        )
        if self.device.type == "cuda":
            host = host.pin_memory()  # a pageable copy would wait for the device's queue
        return host.to(self.device, non_blocking=True)

    @torch.no_grad()
    def rollout(self) -> DeviceFragment:
        """Steps ``T`` times with the current weights and returns the fragment."""
        env, model = self.env, self.model
        t0 = time.perf_counter()
        env.prepare_device_steps(self.num_steps)
        noise = self._fragment_noise()
        inference = 0.0
        obs = self._obs
        buf = self._buf
        for t in range(self.num_steps):
            a0 = time.perf_counter()
            out = model.act(obs, noise=noise[t])
            if buf is None:
                buf = self._buf = self._storage(obs, out.actions)
            buf["obs"][t] = obs
            buf["actions"][t] = out.actions
            buf["log_probs"][t] = out.log_probs
            buf["values"][t] = out.values
            actions = out.actions
            if self._bounds is not None:
                actions = torch.clamp(actions, *self._bounds)
            inference += time.perf_counter() - a0
            step = env.step_batch(actions)
            buf["rewards"][t] = step.reward
            buf["terminated"][t] = step.terminated
            buf["truncated"][t] = step.truncated
            buf["final_obs"][t] = step.final_obs
            obs = step.obs
        assert buf is not None
        self._obs = obs
        v0 = time.perf_counter()
        t, n = self.num_steps, self.num_envs
        cut = buf["truncated"] & ~buf["terminated"]
        final = model.value(buf["final_obs"].reshape(t * n, *buf["final_obs"].shape[2:]))
        final_values = torch.where(cut, final.reshape(t, n), 0.0)
        last_values = model.value(obs)
        inference += time.perf_counter() - v0
        ret = self._ret
        for k in range(t):
            ret = (ret + buf["rewards"][k]).masked_fill_(
                buf["terminated"][k] | buf["truncated"][k], 0.0
            )
        self._ret = ret
        returns, lengths, rows = self._episodes(self._carried(env.read_episode_stats()))
        fragment = DeviceFragment(
            obs=buf["obs"],
            actions=buf["actions"],
            log_probs=buf["log_probs"],
            values=buf["values"],
            rewards=buf["rewards"],
            terminated=buf["terminated"],
            truncated=buf["truncated"],
            final_values=final_values,
            last_obs=obs.clone(),
            last_values=last_values,
            policy_version=np.full(self.num_steps, self.version, dtype=np.int64),
            episode_returns=returns,
            episode_lengths=lengths,
            episode_rows=rows,
            sequence=self.sequence,
            source=self.name,
        )
        self.sequence += 1
        self._times["inference"] += inference
        self._times["env"] += time.perf_counter() - t0 - inference
        return fragment

    def _carried(self, stats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``stats`` with the returns from before a resume added to each slot's first
        episode after it (the env restarts its running returns on restore)."""
        carry = self._carry
        if carry is not None:
            ended = stats["episodes"] > 0
            stats["return_sum"] = stats["return_sum"] + np.where(ended, carry, 0.0)
            carry[ended] = 0.0
            if not carry.any():
                self._carry = None
        return stats

    @staticmethod
    def _episodes(stats: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each slot's mean return and length over its episodes, and the slot, once per
        episode (in slot order)."""
        count = stats["episodes"]
        done = count > 0
        k = count[done]
        returns = np.repeat(stats["return_sum"][done] / k, k)
        lengths = np.repeat(stats["length_sum"][done] / k, k)
        rows = np.repeat(np.flatnonzero(done), k)
        return returns.astype(np.float64), lengths.astype(np.float64), rows.astype(np.int64)

    def fragments(self) -> Iterator[DeviceFragment]:
        """Fragments forever, rolled out on demand."""
        while True:
            yield self.rollout()

    def pending(self) -> bool:
        """Never: fragments are rolled out on demand."""
        return False

    def timings(self) -> dict[str, float]:
        """Host seconds spent stepping the env and in inference since the last call (on
        CUDA the time to launch the work: the kernels run asynchronously)."""
        out, self._times = self._times, {"env": 0.0, "inference": 0.0}
        return out

    # ------------------------------------------------------------------ state

    def get_state(self, *, include_envs: bool = True) -> dict[str, Any]:
        """Plain data to resume the rollout exactly (read back from the device: a
        checkpoint's host operation): the env's snapshot, the observations the next
        step acts on, the running episode returns and the sequence number that keys
        the noise."""
        return {
            "envs": self.env.get_state() if include_envs else None,
            "obs": self._obs.cpu().numpy().copy(),
            "episode_returns": self._ret.cpu().numpy().copy(),
            "sequence": self.sequence,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` (the env all or nothing; checked first).

        Raises:
            ValueError: the observations do not fit the env.
            simkit.errors.InvalidState: the env rejects its snapshot.
        """
        obs = np.asarray(state["obs"])
        want = (tuple(self._obs.shape), self._obs.cpu().numpy().dtype)
        if (obs.shape, obs.dtype) != want:
            raise ValueError(f"obs must be {want[1]} {want[0]}, got {obs.dtype} {obs.shape}")
        returns = np.asarray(state["episode_returns"])
        if returns.shape != (self.num_envs,) or returns.dtype != np.float64:
            raise ValueError(
                f"episode_returns must be float64 ({self.num_envs},), got {returns.dtype} "
                f"{returns.shape}"
            )
        sequence = int(state["sequence"])
        if state.get("envs") is not None:
            self.env.set_state(state["envs"])
        self._obs = torch.from_numpy(obs.copy()).to(self.device)
        self._ret = torch.from_numpy(returns.copy()).to(self.device)
        self._carry = returns.copy() if returns.any() else None
        self.sequence = sequence

    def close(self) -> None:
        """Closes the env."""
        self.env.close()
