"""The envs of a rollout as policy rows, through the local execution core.

:class:`EnvRows` steps a :class:`simkit.vector.VectorEnv`, a :class:`simkit.BatchEnv` or
a :class:`simkit.vector.MultiAgentVectorEnv` alike, through the row face each offers
(``reset_rows`` / ``step_rows``: ``R`` rows, env slots or (env slot, agent) pairs, with
an agent mask, the layout of :class:`simkit.Fragment`) and ``get_state``.

A BatchEnv that steps subsets can also be driven in two *parts* (halves of the env
slots) through its EnvPool-style ``send``/``recv``: the physics of one part runs on the
env's background thread while the caller evaluates the policy for the other
(:class:`simkit.rollout._loop.RolloutLoop` with ``double_buffer``). Each
instance's trajectory is the one a whole-batch step gives it (the BatchEnv contract).

:class:`DeviceRows` presents a torch BatchEnv with device-resident steps the same way,
its rows staying on the device as tensors: the device loop's envs.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit._batch_rows import host_rows
from simkit._types import RowStep
from simkit.registry import EnvKind, spec
from simkit.vector import MultiAgentVectorEnv, VectorEnv

__all__ = [
    "DeviceRows",
    "EnvRows",
    "RowStep",
    "make_device_rows",
    "make_env_rows",
    "ENV_KINDS",
]

ENV_KINDS = ("single", "batch", "multi_agent")


class EnvRows:
    """``num_envs`` envs of one kind as ``num_rows`` policy rows.

    Args:
        env: the vector (owned: :meth:`close` closes it).
        kind: ``"single"`` (VectorEnv), ``"batch"`` (BatchEnv) or ``"multi_agent"``.
    """

    def __init__(self, env: Any, kind: str) -> None:
        if kind not in ENV_KINDS:
            raise ValueError(f"kind must be one of {ENV_KINDS}, got {kind!r}")
        self.env = env
        self.kind = kind
        self.num_envs: int = env.num_envs
        self.agents: list[str] | None = (
            [str(a) for a in env.possible_agents] if kind == "multi_agent" else None
        )
        self.agents_per_env = len(self.agents) if self.agents else 1
        self.num_rows = self.num_envs * self.agents_per_env
        self.observation_space: spaces.Space[Any] = env.single_observation_space
        self.action_space: spaces.Space[Any] = env.single_action_space
        self._all_rows = np.ones(self.num_rows, dtype=np.bool_)
        self.closed = False
        self.parts: list[slice] = [slice(0, self.num_rows)]
        """Row ranges stepped apart (:meth:`send`/:meth:`recv`); one unless split."""
        self._part_ids: list[np.ndarray] = []
        self._pending: RowStep | None = None
        self.device: Any = None
        """The torch device the rows stay on (:class:`DeviceRows`); None: the host."""

    def begin(self) -> None:
        """Called before the first step of each fragment (nothing to do on the host)."""

    @property
    def can_split(self) -> bool:
        """Whether the envs can step in two parts (:meth:`split`): a BatchEnv that steps
        subsets, with an even number of instances and ``batch_size`` half of them."""
        env = self.env
        return (
            self.kind == "batch"
            and bool(getattr(env, "subset_steps", False))
            and self.num_envs % 2 == 0
            and getattr(env, "batch_size", 0) == self.num_envs // 2
        )

    def split(self) -> None:
        """Steps the envs as two halves from now on (:attr:`can_split` must hold).

        Raises:
            ValueError: the envs cannot be split.
        """
        if not self.can_split:
            raise ValueError(
                "only a BatchEnv with subset steps, an even num_envs and batch_size = "
                f"num_envs / 2 steps in two parts, got a {self.kind} env of {self.num_envs} "
                f"with batch_size {getattr(self.env, 'batch_size', None)}"
            )
        half = self.num_envs // 2
        self.parts = [slice(0, half), slice(half, self.num_envs)]
        self._part_ids = [
            np.arange(half, dtype=np.int64),
            np.arange(half, self.num_envs, dtype=np.int64),
        ]

    def reset(self, seed: int, env_offset: int) -> tuple[np.ndarray, np.ndarray]:
        """Resets every env under root ``seed`` with the envs' own episode seeding.

        Slot ``i`` starts episode ``k`` with ``episode_seed(seed, env_offset + i, k)``
        (:class:`simkit._seeding.EpisodeSeeds`), as a step session's envs do, so envs
        split across servers produce what one server's envs produce.

        Returns:
            ``(obs, mask)`` of every row.
        """
        self.env.seeds.env_offset = env_offset
        reset: tuple[np.ndarray, np.ndarray] = self.env.reset_rows(seed)
        return reset

    def send(self, part: int, actions: np.ndarray) -> None:
        """Starts stepping part ``part`` with one action per row of it; :meth:`recv` it.

        With one part this is the env's row face, ``step_rows`` (its result waits for
        :meth:`recv`); with two, the BatchEnv's ``send`` (its physics runs in the
        background).
        """
        if len(self.parts) == 1:
            self._pending = self.env.step_rows(actions)
        else:
            self.env.send(actions, self._part_ids[part])

    def recv(self, part: int) -> RowStep:
        """The step of part ``part`` (parts are received in the order they were sent).

        Raises:
            RuntimeError: nothing was sent, or another part came back.
        """
        if len(self.parts) == 1:
            step = self._pending
            if step is None:
                raise RuntimeError("recv() without a send()")
            self._pending = None
            return step
        batch = self.env.recv()
        ids = self._part_ids[part]
        if not np.array_equal(batch.env_ids, ids):
            raise RuntimeError(
                f"recv() returned envs {batch.env_ids.tolist()}, expected part {part}'s "
                f"{ids.tolist()} (parts are received in the order they were sent)"
            )
        return host_rows(batch, self._all_rows[self.parts[part]])

    def get_state(self) -> dict[str, Any]:
        """The vector's snapshot (its ``get_state()``: plain data)."""
        state: dict[str, Any] = self.env.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores :meth:`get_state` through the vector's ``set_state`` (all or nothing).

        Raises:
            simkit.errors.InvalidState: the snapshot does not fit these envs.
        """
        self.env.set_state(state)

    def close(self) -> None:
        """Closes the envs (idempotent)."""
        if not self.closed:
            self.closed = True
            self.env.close()


class DeviceRows(EnvRows):
    """A torch :class:`simkit.BatchEnv`'s slots as rows that stay on its device: the
    device loop's envs. Its steps' tensors pass as they are (no host copy, no host
    read); ``Box`` actions are clamped there (the env is built without action
    validation, which reads them on the host); each fragment begins with
    :meth:`~simkit.BatchEnv.prepare_device_steps` (one host read of the episode
    counters).

    Args:
        env: a torch batch env with device-resident steps (owned).
        steps: steps per fragment.
        name: what errors call the env (its id).
    """

    def __init__(self, env: Any, steps: int, name: str = "") -> None:
        import torch

        super().__init__(env, "batch")
        self._torch = torch
        self.device = torch.device(env.device)
        self.steps = steps
        self.name = name or type(env).__name__
        self._live = torch.ones(self.num_rows, dtype=torch.bool, device=self.device)
        space = self.action_space
        self._bounds = (
            (
                torch.as_tensor(space.low, device=self.device),
                torch.as_tensor(space.high, device=self.device),
            )
            if isinstance(space, spaces.Box)
            else None
        )

    def begin(self) -> None:
        """Prepares the env for a fragment of device-resident steps.

        Raises:
            ValueError: the env's steps fall back to the host path.
        """
        if not self.env.prepare_device_steps(self.steps):
            raise ValueError(
                f"the device loop cannot run {self.name}: its steps fall back "
                "to the host path (per-instance randomization overrides or non-scalar "
                "parameters, or resets on the host on a backend that computes there)"
            )

    def reset(self, seed: int, env_offset: int) -> tuple[Any, Any]:
        """:meth:`EnvRows.reset` on the device (and checks the steps stay there)."""
        self.env.seeds.env_offset = env_offset
        obs, _ = self.env.reset(seed=seed)
        self.begin()
        return obs, self._live.clone()

    def send(self, part: int, actions: Any) -> None:
        """Steps every env with one action tensor per row, on the device (the device
        loop runs one part); :meth:`recv` returns it."""
        del part
        torch = self._torch
        if self._bounds is not None:
            actions = torch.clamp(actions, *self._bounds)
        step = self.env.step_batch(actions)
        self._pending = RowStep(
            obs=step.obs,
            mask=self._live,
            reward=step.reward.to(torch.float64),
            terminated=step.terminated,
            truncated=step.truncated,
            final_obs=step.final_obs,
        )


def make_env_rows(
    env_id: str,
    num_envs: int,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    num_threads: int = 1,
    halves: bool = False,
) -> EnvRows:
    """Builds ``num_envs`` envs of ``env_id`` as rows (``gym:<id>`` for Gymnasium envs).

    ``halves``: build a BatchEnv with ``batch_size = num_envs // 2``, so that it can
    :meth:`~EnvRows.split` (other kinds ignore it; check :attr:`EnvRows.can_split`).

    Raises:
        simkit.errors.UnknownEnv: the id is not registered.
        ValueError: a multi-agent id that is not a simkit MultiAgentEnv.
    """
    kwargs = dict(env_kwargs or {})
    env_spec = spec(env_id)
    if env_spec.kind is EnvKind.BATCH:
        if (
            halves
            and num_envs % 2 == 0
            and "batch_size" not in kwargs
            and _takes(env_spec.load(), "batch_size")
        ):
            kwargs["batch_size"] = num_envs // 2
        return EnvRows(env_spec.make(num_envs=num_envs, **kwargs), "batch")
    if env_spec.kind is EnvKind.MULTI_AGENT:
        return EnvRows(MultiAgentVectorEnv(env_id, num_envs, env_kwargs=kwargs), "multi_agent")
    return EnvRows(
        VectorEnv(env_id, num_envs, num_threads=num_threads, env_kwargs=kwargs), "single"
    )


def _takes(factory: Any, name: str) -> bool:
    """Whether ``factory`` accepts the keyword ``name`` (by name or through ``**kwargs``):
    an author's BatchEnv may fix its constructor's arguments."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: do not guess
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def make_device_rows(
    env_id: str,
    num_envs: int,
    steps: int,
    device: Any,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
) -> DeviceRows:
    """Builds ``num_envs`` slots of the batch env ``env_id`` on ``device`` as
    :class:`DeviceRows` (fragments of ``steps``), without action validation.

    Raises:
        simkit.errors.UnknownEnv: the id is not registered.
        ValueError: the env's steps fall back to the host path (checked at its reset).
    """
    built = {"num_envs": num_envs, "device": device, "validate_actions": False}
    env = spec(env_id).make(**{**dict(env_kwargs or {}), **built})
    return DeviceRows(env, steps, env_id)
