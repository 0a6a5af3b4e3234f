"""Device-resident steps of a torch :class:`simkit.BatchEnv`: no host round trip per step.

With ``device`` set and the author's :meth:`simkit.BatchEnv.reset_masked` hook, a
whole-batch :meth:`~simkit.BatchEnv.step_batch` keeps everything the contract needs on
the device: step counters, episode counters, every instance's stream key and draw
count, the declared parameters, and running episode statistics. Same-step resets are
masked (``torch.where`` over all N rows, no data-dependent shapes), and the keys and
first draws of the next episodes are gathered from a ring of each instance's next
episodes on the device (the numpy path's rows,
:meth:`simkit._seeding.EpisodeSeeds.rows`, the same keyed draws). The host reads the
episode counters once per window of steps and tops up each instance's ring with the
episodes it lacks for those steps (:class:`simkit._seeding.EpisodeSpan`): only they are
derived and uploaded, so the work is one row per episode started, however far apart
the instances' episode counters drift. So a step never waits on the device. The host
copies (counters, keys, parameters) are brought up to date only when a host-side
operation needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simkit._batch_rows import RefusedRows, RowInfos
from simkit._seeding import EpisodeSpan
from simkit.randomization import Params

__all__ = ["DeviceDraws", "DeviceLoop", "NoStepDraws", "device_infos"]

DEFAULT_WINDOW = 32
"""Steps the next-episode keys on the device cover before the host reads the counters."""

MAX_WINDOW = 256
"""Next episodes each instance's ring on the device may hold: the most steps one read
of the counters covers (an instance starts at most one episode a step)."""

MAX_RING_BYTES = 2**28
"""Device memory the rings of next episodes may take beyond :data:`DEFAULT_WINDOW`
episodes per instance: a larger batch covers fewer steps per read of the counters."""


class DeviceDraws:
    """The reset draws a masked reset hook receives: each row's next uniform doubles of
    its new episode's stream (after the parameters), on the device.

    ``uniform(low, high, size)`` and ``random(size)`` give row ``i`` exactly what
    ``rngs.uniform``/``rngs.random`` give instance ``i`` in ``reset_instances``, bit for
    bit, for every row at once (rows not in the mask hold draws that are not used).
    """

    def __init__(self, doubles: Any, constants: dict[Any, Any] | None = None) -> None:
        self._doubles = doubles
        self._constants = {} if constants is None else constants
        self.taken = 0
        """Draws taken per row so far."""

    @property
    def available(self) -> int:
        """Draws per row the window holds (what the last host reset took)."""
        return int(self._doubles.shape[1])

    def random(self, size: int | tuple[int, ...] = ()) -> Any:
        """``(N, *size)`` float64 tensor: each row's ``Generator.random(size)``.

        Raises:
            ValueError: more draws than the window holds (the last host reset drew
                fewer; draw the same amounts in ``reset_instances``).
        """
        shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if self.taken + count > self.available:
            raise ValueError(
                f"reset_masked drew {self.taken + count} doubles per row, the window holds "
                f"{self.available} (what reset_instances drew); draw the same in both hooks"
            )
        out = self._doubles[:, self.taken : self.taken + count]
        self.taken += count
        return out.reshape(len(out), *shape)

    def uniform(self, low: Any = 0.0, high: Any = 1.0, size: int | tuple[int, ...] = ()) -> Any:
        """Each row's ``Generator.uniform(low, high, size)``: ``low + (high - low) * u``
        (``low``/``high`` floats or arrays broadcast against ``size``; arrays are copied
        to the device once and kept)."""
        u = self.random(size)
        lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
        if lo.ndim == 0 and hi.ndim == 0:
            return float(lo) + float(hi - lo) * u
        key = (lo.tobytes(), hi.tobytes(), lo.shape, hi.shape)
        pair = self._constants.get(key)
        if pair is None:
            import torch

            pair = tuple(torch.as_tensor(x, device=u.device) for x in (lo, hi - lo))
            self._constants[key] = pair
        return pair[0] + pair[1] * u


class NoStepDraws(RefusedRows[Any]):
    """What a step hook receives as ``rngs`` in a device-resident step: the streams live
    on the device there, so a draw raises instead of reading stale host streams."""

    error = RuntimeError
    message = (
        "a device-resident step_batch() keeps the streams on the device: step hooks "
        "cannot draw from rngs there (draw in the reset hooks)"
    )

    def random(self, *args: Any, **kwargs: Any) -> Any:
        return self[0]

    uniform = random


def device_infos(
    n: int,
    base: Sequence[dict[str, Any]] | None,
    done: Any,
    new_params: Any,
    row_of: Callable[[Any], Params],
) -> RowInfos:
    """The per-row infos of a device-resident step, built on first read: the author's
    step infos ``base``, plus ``{"reset_info": {"params": ...}}`` on the rows that ended
    (``done``, ``(n,)`` device bool), their next episodes' parameters made by
    ``row_of(values)`` from their row of ``new_params`` (``(n, m)`` device values, or
    ``None``: no sampled parameters, empty values). Reading any row copies the flags and
    values to the host once; a step whose infos are never read costs nothing here."""
    host: list[tuple[np.ndarray, Any]] = []

    def reset_info(k: int) -> dict[str, Any] | None:
        if not host:
            values = None if new_params is None else new_params.cpu().numpy()
            host.append((done.cpu().numpy(), values))
        ended, values = host[0]
        if not ended[k]:
            return None
        return {"reset_info": {"params": row_of(() if values is None else values[k])}}

    return RowInfos(n, base, reset_info)


class DeviceLoop:
    """The per-instance contract of a batch held on its torch device between host reads.

    Built from the host state (:meth:`push`), advanced by :meth:`step` with no host
    synchronisation, and read back into the host state when a host operation needs it.

    Attributes:
        elapsed, episode, pos: ``(N,)`` int64 step counters, episode counters and draws
            taken from each instance's stream.
        states: ``(N, 4)`` int64 (uint64 bits) each instance's PCG64 start state.
        params: ``(N, m)`` float64, column ``j`` the parameter ``names[j]``.
        ring: ``(N * width, 4 + draws)`` int64 (uint64 bits), each instance's next
            episodes' rows (which ones: ``span``), or ``None`` before the first window.
        steps_left: steps the ring still covers (host count).
    """

    def __init__(self, torch: Any, device: Any, n: int) -> None:
        self.torch = torch
        self.device = device
        self.n = n
        self.ahead = False
        """Whether the device holds state the host copies lack (steps since the last pull)."""
        z = torch.zeros(n, dtype=torch.int64, device=device)
        self.elapsed, self.episode, self.pos = z.clone(), z.clone(), z.clone()
        self.states = torch.zeros((n, 4), dtype=torch.int64, device=device)
        self.names: tuple[str, ...] = ()
        self.sampled: list[int] = []
        self.sampled_idx: Any = None
        self.contiguous = True
        self.params = torch.zeros((n, 0), dtype=torch.float64, device=device)
        self.columns: dict[str, Any] = {}
        self.ring: Any = None
        self.span: EpisodeSpan | None = None
        self.ring_key: tuple[Any, ...] = ()
        self.row_base: Any = None
        self.steps_left = 0
        self.param_draws = 0
        self.rows = torch.arange(n, device=device)
        self.constants: dict[Any, Any] = {}
        self.ret = torch.zeros(n, dtype=torch.float64, device=device)
        self.count = z.clone()
        self.return_sum = torch.zeros(n, dtype=torch.float64, device=device)
        self.length_sum = z.clone()

    def upload(self, array: np.ndarray) -> Any:
        return self.torch.as_tensor(np.ascontiguousarray(array), device=self.device)

    def push(
        self,
        elapsed: np.ndarray,
        episode: np.ndarray,
        states: np.ndarray,
        pos: np.ndarray,
        param_arrays: dict[str, np.ndarray],
        sampled: tuple[str, ...],
    ) -> None:
        """Loads the host state: counters, stream keys, parameters (every numeric one;
        ``sampled`` are redrawn at each reset, the others stay)."""
        self.elapsed = self.upload(elapsed.astype(np.int64))
        self.episode = self.upload(episode.astype(np.int64))
        self.states = self.upload(states.view(np.int64))
        self.pos = self.upload(pos.astype(np.int64))
        names = tuple(name for name, arr in param_arrays.items() if arr.ndim == 1)
        self.names = names
        self.sampled = [names.index(name) for name in sampled]
        self.sampled_idx = self.upload(np.array(self.sampled, dtype=np.int64))
        self.contiguous = self.sampled == list(range(len(self.sampled)))
        host = np.empty((self.n, len(names)), dtype=np.float64)
        for j, name in enumerate(names):
            host[:, j] = param_arrays[name]
        self.params = self.upload(host)
        self.columns = {name: self.params[:, j] for j, name in enumerate(names)}
        self.steps_left = 0  # the ring stays: its rows depend only on its key

    def load_ring(
        self,
        first: np.ndarray,
        steps: int,
        key: tuple[Any, ...],
        columns: int,
        rows_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
        param_draws: int,
    ) -> None:
        """Makes every instance's ring hold its episodes ``first[i]`` on for ``steps``
        steps (as many as the ring holds, at most): an instance short of them gets the
        episodes it lacks, ``rows_of(envs, episodes)`` computing their
        ``(k, columns)`` uint64 rows on the host (:meth:`EpisodeSeeds.rows`), uploaded
        into their slots. ``key`` names what the rows depend on (root, env offset,
        draws, parameter scaling): a new key starts a new ring. The first
        ``param_draws`` doubles of a row are parameters."""
        width = min(max(steps, DEFAULT_WINDOW), MAX_WINDOW)
        width = max(DEFAULT_WINDOW, min(width, MAX_RING_BYTES // (8 * columns * self.n)))
        span = self.span
        if span is None or self.ring_key != key or span.width < width:
            span = self.span = EpisodeSpan(self.n, width)
            self.ring_key = key
            self.ring = self.torch.zeros(
                (self.n * width, columns), dtype=self.torch.int64, device=self.device
            )
            self.row_base = self.rows * width
        cover = min(steps, span.width)
        envs, episodes = span.extend(None, first, cover)
        if len(envs):
            rows = rows_of(envs, episodes)
            self.ring[self.upload(span.flat(envs, episodes))] = self.upload(rows.view(np.int64))
        self.steps_left = cover
        self.param_draws = param_draws

    def step(
        self, reward: Any, terminated: Any, max_steps: int | None
    ) -> tuple[Any, Any, Any, DeviceDraws, Any]:
        """Counts the step and starts the next episode of every ended row, masked.

        Returns:
            ``(truncated, done, new parameter values (N, k) or None, the rows' reset
            draws, the parameter columns)``.
        """
        torch = self.torch
        self.ahead = True
        self.steps_left -= 1
        self.elapsed += 1
        limit = self.elapsed >= max_steps if max_steps is not None else None
        truncated = torch.zeros_like(terminated) if limit is None else limit
        done = terminated | truncated
        self.ret += reward
        self.count += done
        self.return_sum += torch.where(done, self.ret, 0.0)
        self.length_sum += torch.where(done, self.elapsed, 0)
        self.ret.masked_fill_(done, 0.0)
        self.elapsed.masked_fill_(done, 0)
        self.episode += done
        assert self.span is not None
        slots = self.row_base + self.episode.remainder(self.span.width)
        rows = self.ring.index_select(0, slots)
        self.states = torch.where(done[:, None], rows[:, :4], self.states)
        doubles = rows[:, 4:].view(torch.float64)
        m = self.param_draws
        new = None
        if m:
            new = doubles[:, :m]
            if self.contiguous:
                cols = self.params[:, :m]
                cols.copy_(torch.where(done[:, None], new, cols))
            else:
                cols = self.params.index_select(1, self.sampled_idx)
                self.params.index_copy_(1, self.sampled_idx, torch.where(done[:, None], new, cols))
        return truncated, done, new, DeviceDraws(doubles[:, m:], self.constants), self.columns

    def restart(self, ids: np.ndarray) -> None:
        """Instances ``ids`` start episodes on the host (a reset): the episodes they were
        in end uncounted, their running returns start again."""
        self.ret[self.upload(ids)] = 0.0

    def record(
        self, ids: np.ndarray, reward: np.ndarray, done: np.ndarray, lengths: np.ndarray
    ) -> None:
        """Counts a host-path step of ``ids`` (unique) in the episode statistics:
        their rewards, which rows ended, and the ended episodes' lengths."""
        torch = self.torch
        idx = self.upload(ids)
        ended = self.upload(done)
        ret = self.ret[idx] + self.upload(reward)
        self.count.index_add_(0, idx, ended.to(torch.int64))
        self.return_sum.index_add_(0, idx, torch.where(ended, ret, 0.0))
        self.length_sum.index_add_(0, idx, self.upload(np.where(done, lengths, 0)))
        self.ret[idx] = torch.where(ended, 0.0, ret)

    def record_known(self, reward: Any, done: np.ndarray, lengths: np.ndarray) -> None:
        """Counts a whole-batch step whose ended rows the host knows (``done``, host
        bool) in the episode statistics: ``reward`` stays on the device, and only a step
        where rows end uploads them and their lengths."""
        self.ret += reward
        if not done.any():
            return
        torch = self.torch
        ended = self.upload(done)
        self.count += ended
        self.return_sum += torch.where(ended, self.ret, 0.0)
        self.length_sum += self.upload(np.where(done, lengths, 0))
        self.ret.masked_fill_(ended, 0.0)

    def took(self, done: Any, draws: int) -> None:
        """Ended rows have taken ``draws`` from their new streams."""
        self.pos.masked_fill_(done, draws)
