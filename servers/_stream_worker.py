"""One stream session's worker thread: builds the envs and the policy, then loops.

The worker owns everything of its session (the :class:`StreamServerSession`, envs,
model) and never touches the server's ROUTER socket: messages from the learner arrive
in :attr:`StreamWorker.inbox` (a thread-safe queue filled by the socket thread), and
replies and fragments leave through the worker's own PUSH socket to an inproc PULL the
socket thread forwards from (ZeroMQ sockets are not thread-safe).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Any

import numpy as np
import torch
import zmq

from simkit._noise import NORMAL_NOISE_VERSION
from simkit._types import Fragment
from simkit._version import __version__
from simkit.errors import InvalidAction, InvalidState, InvalidWeights, UnknownModel
from simkit.models import ActorCritic, ModelSpec, PolicyWeights, build_model
from simkit.protocol import (
    InternalError,
    InvalidField,
    InvalidSessionState,
    InvalidWeightsError,
    ProtocolError,
    SessionSnapshot,
    SessionStateError,
    StaleVersion,
    StreamConfig,
    StreamInfo,
    UnknownModelError,
    Unsupported,
    message_bytes,
    space_to_plain,
)
from simkit.protocol._stream_session import (
    CloseCommand,
    CreditCommand,
    OpenCommand,
    PingCommand,
    RestoreCommand,
    StateCommand,
    StreamServerSession,
    WeightsCommand,
)
from simkit.rollout._loop import RolloutLoop
from simkit.rollout._policy import RowPolicy
from simkit.rollout._rows import EnvRows, make_env_rows
from simkit.servers._memory import Reservation, SlotCosts
from simkit.servers._stream_metrics import StreamMetrics
from simkit.servers._stream_settings import TAG_DONE, TAG_FRAGMENT, TAG_REPLY, StreamSettings

__all__ = ["StreamWorker"]

_IDLE_WAIT_S = 0.05

log = logging.getLogger("simkit.servers")


class StreamWorker(threading.Thread):
    """Runs one stream session until it is closed, expires or the server stops.

    Args:
        identity: the learner's ROUTER identity (prefixes every outgoing message).
        open_frames: the ``stream_open`` request.
        settings: the server's defaults.
        context: the ZeroMQ context (the worker makes its own PUSH socket in it).
        address: the inproc endpoint the socket thread pulls from.
        metrics: the server's stream metrics.
        held: what the session holds of the server's memory budget: it reserves its
            envs (``costs``) before building them and then what it may hold (its
            fragments and model), and gives it all back when it ends.
        costs: what one env slot costs, measured once per env.
    """

    def __init__(
        self,
        identity: bytes,
        open_frames: list[Any],
        settings: StreamSettings,
        context: zmq.Context[Any],
        address: str,
        metrics: StreamMetrics,
        held: Reservation,
        costs: SlotCosts,
    ) -> None:
        super().__init__(name=f"simkit-stream-{identity.hex()[:8]}", daemon=True)
        self.identity = identity
        self.settings = settings
        self.inbox: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
        self.inbox.put(open_frames)
        self.inbox_in = message_bytes(open_frames)
        """Bytes of the messages put in the inbox (by the socket thread)."""
        self.inbox_out = 0
        """Bytes of the inbox's messages handled (by this thread)."""
        self.done = threading.Event()
        self.envs_closed = threading.Event()
        self.last_seen = time.monotonic()
        self._context = context
        self._address = address
        self._metrics = metrics
        self._stopping = threading.Event()
        self._push: zmq.Socket[Any] | None = None
        self.session = StreamServerSession(
            limits=settings.limits,
            inline_threshold=settings.inline_threshold,
            max_credit=settings.max_credit,
        )
        self._held = held
        self._costs = costs
        self._model_bytes = 0
        self._leaving: list[zmq.MessageTracker] = []
        """Trackers of fragments handed to ZeroMQ and not yet released by it."""
        self._network_wait = _NETWORK_WAIT_S / 2
        self._loop: RolloutLoop | None = None
        self._deferred: list[WeightsCommand] = []

    @property
    def session_name(self) -> str:
        """The session token (the identity in hex)."""
        return self.identity.hex()

    @property
    def inbox_waiting(self) -> int:
        """Bytes of the messages in the inbox not handled yet."""
        return self.inbox_in - self.inbox_out

    def stop(self) -> None:
        """Asks the worker to finish (it closes its envs on the way out)."""
        self._stopping.set()
        self.inbox.put(None)

    # ------------------------------------------------------------------------ loop

    def run(self) -> None:
        push = self._context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self._address)
        self._push = push
        try:
            self._serve()
        except ProtocolError as exc:  # the session cannot go on: say why, free everything
            log.warning("stream session %s ended: %s", self.session_name, exc)
            self._metrics.errors.labels(exc.code).inc()
            self._send(self.session.error(exc))
        except Exception:  # a bug: log it, tell the learner, free everything
            log.exception("stream session %s failed", self.session_name)
            err = InternalError("internal error in the stream session (a bug; see the server log)")
            self._send(self.session.error(err))
        finally:
            self.done.set()
            if self._loop is not None:
                self._loop.envs.close()
            self._loop = None
            for cmd in self._deferred:  # every request is answered, these too
                ended = SessionStateError(
                    "the stream session ended before these weights could be applied",
                    expected="an open stream session",
                    got=f"weights version {cmd.version}",
                )
                self._refuse(ended, cmd.id, "weights")
            self._deferred.clear()
            self._held.release()
            self.envs_closed.set()
            self._send(None)
            push.close(linger=0)

    def _send(self, frames: list[Any] | None, tag: bytes = TAG_REPLY) -> None:
        """Hands ``frames`` to the socket thread, after the identity and a tag frame
        (:data:`TAG_FRAGMENT`, :data:`TAG_REPLY`; ``None`` sends :data:`TAG_DONE`)."""
        push = self._push
        if push is None or push.closed:
            return
        if frames is None:
            tag, frames = TAG_DONE, []
        elif tag == TAG_FRAGMENT:
            self._metrics.queue_depth.inc()
            # Tracked: ZeroMQ releases the last frame once the whole message left the
            # process (or was dropped), which is when the fragment stops costing memory.
            last = zmq.Frame(frames[-1], copy=False, track=True)
            assert last.tracker is not None
            self._leaving.append(last.tracker)
            frames = [*frames[:-1], last]
        parts = [self.identity, tag, *frames]
        try:
            push.send_multipart(parts, copy=False)
        except zmq.ZMQError as exc:  # the server is shutting down
            log.debug("stream %s: %s", self.session_name, exc)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self._drain()
            if self.session.state.value == "closed" or self._stopping.is_set():
                return
            loop = self._loop
            if loop is None:  # not open: wait for the next message
                self._handle(self.inbox.get())
                continue
            if self.session.mode == "sync" and self._deferred and not loop.in_fragment:
                self._apply(self._deferred.pop(0))
                continue
            why = self.session.waiting_for() if not loop.in_fragment else None
            if why is None and not loop.in_fragment:  # fragments still on their way out
                self._leaving = [t for t in self._leaving if not t.done]
                if len(self._leaving) > 1:
                    why = "network"
            if why is not None:
                waited = time.perf_counter()
                wait = _IDLE_WAIT_S
                if why == "network":  # look again soon, then less often while it lasts
                    wait = self._network_wait = min(_IDLE_WAIT_S, 2 * self._network_wait)
                try:
                    item = self.inbox.get(timeout=wait)
                except queue.Empty:
                    item = None
                    if self._stopping.is_set():
                        return
                spent = time.perf_counter() - waited
                if why in ("credit", "network"):
                    self._metrics.stalled_seconds.inc(spent)
                else:
                    self._metrics.waiting_weights_seconds.inc(spent)
                self._handle(item)  # None: nothing came
                continue
            self._network_wait = _NETWORK_WAIT_S / 2
            self._step(loop)

    def _step(self, loop: RolloutLoop) -> None:
        """One step of the session's loop; a finished fragment goes to the learner.

        Raises:
            InvalidWeightsError: the policy's outputs are not finite (weights that pass
                every check can still overflow float32); the fragment cannot be
                finished, so the session ends with this error.
        """
        try:
            fragment = loop.step()
        except InvalidAction as exc:  # the envs refused the policy's actions
            raise _policy_failed(loop, f"actions the envs refuse ({exc})") from exc
        if fragment is None:
            return
        assert isinstance(fragment, Fragment)  # a session's rows are on the host
        bad = [name for name in _POLICY_OUTPUTS if not np.isfinite(getattr(fragment, name)).all()]
        if bad:
            raise _policy_failed(loop, f"non-finite {', '.join(bad)} (NaN/inf)")
        frames = self.session.fragment_frames(fragment)
        self._send(frames, TAG_FRAGMENT)
        times = loop.take_times()
        newest = self.session.version or 0
        lag = newest - fragment.policy_version
        self._metrics.fragment(
            steps=times.steps * loop.envs.num_envs,
            env_calls=times.env_calls,
            inference=times.inference_calls,
            lag=(int(lag.min()), float(lag.mean()), int(lag.max())),
            credit=self.session.credit,
        )

    def _drain(self) -> None:
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if item is None:
                return
            self._handle(item)
            if self.session.state.value == "closed":
                return

    # ------------------------------------------------------------------- messages

    def _handle(self, frames: list[Any] | None) -> None:
        if frames is None:
            return
        try:
            cmd = self.session.receive(frames)
        except ProtocolError as exc:
            self._refuse(exc)
            return
        finally:
            self.inbox_out += message_bytes(frames)
        if isinstance(cmd, PingCommand):
            self._send(self.session.reply("ping", cmd.id))
        elif isinstance(cmd, CreditCommand):
            self._metrics.credit.set(self.session.credit)
        elif isinstance(cmd, CloseCommand):
            self._send(self.session.reply("close", cmd.id))
        elif isinstance(cmd, OpenCommand):
            self._open(cmd)
        elif isinstance(cmd, StateCommand | RestoreCommand):
            kind = "stream_state" if isinstance(cmd, StateCommand) else "stream_restore"
            try:
                self._send(self._state_reply(cmd, kind))
            except ProtocolError as err:
                self._refuse(err, cmd.id, kind)
        elif isinstance(cmd, WeightsCommand):
            loop = self._loop
            if self.session.mode != "sync" or loop is None or not loop.in_fragment:
                self._apply(cmd)
                return
            size = sum(t.nbytes for t in cmd.tensors.values())
            if size > self._model_bytes:
                refusal: ProtocolError = InvalidWeightsError(
                    f"weights of {size:,} bytes for a model of {self._model_bytes:,}; "
                    f"the session keeps version {self.session.version}",
                    expected=f"<= {self._model_bytes:,} bytes",
                    got=size,
                )
            elif len(self._deferred) >= MAX_DEFERRED_WEIGHTS:
                refusal = SessionStateError(
                    "too many weights wait for this sync fragment's end; push the next "
                    "version after its fragment arrived",
                    expected=f"<= {MAX_DEFERRED_WEIGHTS} waiting",
                    got=len(self._deferred) + 1,
                )
            else:
                self._deferred.append(cmd)
                return
            self._refuse(refusal, cmd.id, "weights")

    def _refuse(self, exc: ProtocolError, request_id: int | None = None, kind: str = "") -> None:
        """Sends the error reply of ``exc`` and counts it; with ``request_id``, as the
        answer to that request of ``kind``."""
        if request_id is not None:
            exc.request_id = request_id  # type: ignore[attr-defined]
            exc.request_kind = kind  # type: ignore[attr-defined]
        self._metrics.errors.labels(exc.code).inc()
        self._send(self.session.error(exc))

    def _state_reply(self, cmd: StateCommand | RestoreCommand, kind: str) -> list[Any]:
        """The reply to ``stream_state`` (the session's snapshot) or ``stream_restore``
        (applied); both only between two fragments, else a :class:`ProtocolError` and
        nothing changes."""
        loop = self._loop
        assert loop is not None
        if loop.in_fragment or self._deferred:
            raise SessionStateError(
                f"{kind} is only allowed between two fragments; this session is inside one",
                expected="a fragment boundary (request it before the next weights)",
                got=f"inside a fragment of {loop.fragment_length} steps",
            )
        config = self.session.config
        assert config is not None
        layout = {
            "env_id": self._info_env_id,
            "num_envs": loop.envs.num_envs,
            "num_rows": loop.envs.num_rows,
            "env_offset": config.env_offset,
            "fragment_length": loop.fragment_length,
        }
        if isinstance(cmd, StateCommand):
            try:
                state = loop.boundary_state()
            except TypeError as exc:
                raise self._unsupported("have no snapshots", "get_state", exc) from exc
            snap = SessionSnapshot(**layout, **state)
            return self.session.state_frames(cmd.id, snap)
        snap = cmd.snapshot
        got = {k: getattr(snap, k) for k in layout}
        if got != layout:
            bad = sorted(k for k in layout if got[k] != layout[k])
            raise InvalidSessionState(
                f"the snapshot belongs to another session layout (differs in {bad})",
                expected={k: layout[k] for k in bad},
                got={k: got[k] for k in bad},
            )
        keys = ("envs", "obs", "agent_mask", "episode_returns", "episode_lengths", "sequence")
        state = {k: getattr(snap, k) for k in keys}
        try:
            loop.restore_boundary(state)
        except (InvalidState, ValueError) as exc:
            raise InvalidSessionState(
                f"snapshot rejected, the session is unchanged: {exc}",
                expected=getattr(exc, "expected", None),
                got=getattr(exc, "got", None),
            ) from exc
        except TypeError as exc:
            raise self._unsupported("cannot be restored", "set_state", exc) from exc
        self.session.restored(snap.sequence)
        return self.session.reply("stream_restore", cmd.id, {"sequence": snap.sequence})

    def _unsupported(self, lack: str, method: str, exc: TypeError) -> Unsupported:
        """The ``unsupported`` error of a snapshot request (``stream_state``,
        ``stream_restore``) that this session's envs cannot serve: they lack ``method``
        (Gymnasium envs), as ``exc`` says."""
        return Unsupported(
            f"this session's envs {lack}: {exc}",
            expected=f"simkit envs ({method})",
            got=self._info_env_id,
        )

    def _apply(self, cmd: WeightsCommand) -> None:
        loop = self._loop
        assert loop is not None
        current = self.session.version
        if current is not None and cmd.version <= current:
            exc: ProtocolError = StaleVersion(
                f"policy versions must increase; the session keeps version {current}",
                expected=f"version > {current}",
                got=cmd.version,
            )
        else:
            try:
                loop.set_weights(PolicyWeights(version=cmd.version, tensors=cmd.tensors))
            except (InvalidWeights, ValueError, TypeError) as bad:
                exc = InvalidWeightsError(
                    f"weights rejected, the session keeps version {self.session.version}: {bad}",
                    expected=getattr(bad, "expected", None),
                    got=getattr(bad, "got", None),
                )
            else:
                self.session.weights_applied(cmd.version)
                self._metrics.policy_version.set(cmd.version)
                self._send(self.session.reply("weights", cmd.id, {"version": cmd.version}))
                return
        self._refuse(exc, cmd.id, "weights")

    def _open(self, cmd: OpenCommand) -> None:
        try:
            info = self._build(cmd.config)
        except ProtocolError as exc:
            self._refuse(exc, cmd.id, "stream_open")
            self._stopping.set()  # nothing was built; the slot is freed
            return
        self._send(self.session.reply("stream_open", cmd.id, info.to_plain()))

    def _build(self, config: StreamConfig) -> StreamInfo:
        s = self.settings
        env_id, env_kwargs = s.admit_env(config.env_id, config.env_kwargs)
        self._info_env_id = env_id
        num_envs = config.num_envs or s.num_envs
        if num_envs > s.max_envs:
            raise InvalidField(
                "too many env slots for one session", expected=f"<= {s.max_envs}", got=num_envs
            )
        # Before anything is built: a deep model costs memory and time even when narrow.
        hidden = (config.model.get("kwargs") or {}).get("hidden_sizes")
        if isinstance(hidden, list) and len(hidden) > s.max_model_layers:
            raise InvalidField(
                f"model {config.model.get('name')!r} asks for {len(hidden):,} hidden layers",
                expected=f"<= {s.max_model_layers} layers",
                got=len(hidden),
            )
        device = _device(config.device or s.device)
        envs = self._make_envs(env_id, env_kwargs, num_envs)
        length = config.fragment_length or s.fragment_length
        try:  # a refusal after the envs are built closes them
            fragment_bytes = _check_sizes(s, envs, length, config.model)
            model, obs_plain, act_plain = self._admit_model(config, envs, fragment_bytes)
            # the policy over the session's rows, and the loop, reset to config's seed
            policy = RowPolicy(
                model,
                device,
                seed=config.seed,
                first_slot=config.env_offset,
                num_slots=envs.num_envs,
                rows_per_slot=envs.agents_per_env,
                action_space=envs.action_space,
            )
            self._loop = loop = RolloutLoop(
                envs,
                policy,
                fragment_length=length,
                env_offset=config.env_offset,
                with_states=config.with_states,
                source=self.session_name,
            )
            try:
                loop.reset(config.seed, config.env_offset)
            except Exception as exc:
                self._loop = None
                raise InvalidField(f"env {self._info_env_id!r} failed to reset: {exc}") from exc
        except ProtocolError:
            envs.close()
            raise
        return StreamInfo(
            session=self.session_name,
            env_id=env_id,
            env_kind=envs.kind,
            agents=envs.agents,
            observation_space=obs_plain,
            action_space=act_plain,
            num_envs=num_envs,
            num_rows=envs.num_rows,
            fragment_length=length,
            mode=config.mode,
            device=str(device),
            heartbeat_timeout=s.heartbeat_timeout,
            server=s.server or f"simkit {__version__}",
            double_buffered=loop.double_buffered,
            max_credit=s.max_credit,
            normal_noise=NORMAL_NOISE_VERSION,
        )

    def _make_envs(self, env_id: str, env_kwargs: Any, num_envs: int) -> EnvRows:
        """The session's env rows; in two halves where the server double-buffers and
        the envs can step a subset (an even number of slots)."""
        s = self.settings
        halves = s.double_buffer and num_envs % 2 == 0

        def build(n: int, split: bool = False) -> EnvRows:
            kw = {"env_kwargs": env_kwargs, "num_threads": s.num_threads, "halves": split}
            return make_env_rows(env_id, n, **kw)

        key = f"{env_id} {sorted(env_kwargs.items())!r}"
        try:
            slot = self._costs.per_slot(key, build)
        except (KeyError, ValueError, TypeError, ImportError) as exc:
            raise InvalidField(f"cannot build env {env_id!r}: {exc}", got=env_id) from exc
        self._held.add(num_envs * slot, f"{num_envs} env slots of {slot:,} bytes each")
        try:
            envs = build(num_envs, halves)
        except (KeyError, ValueError, TypeError, ImportError) as exc:
            raise InvalidField(f"cannot build env {env_id!r}: {exc}", got=env_id) from exc
        if halves and envs.can_split:
            envs.split()
        return envs

    def _admit_model(
        self, config: StreamConfig, envs: EnvRows, fragment_bytes: int
    ) -> tuple[ActorCritic, Any, Any]:
        """The learner's model built for ``envs``' spaces, within the server's parameter
        cap, with the session's memory reserved; and the spaces as the reply carries
        them. Any refusal names what was wrong."""
        s = self.settings
        try:
            spec = ModelSpec.from_plain(config.model)
            model = build_model(spec, envs.observation_space, envs.action_space)
            params = sum(p.numel() for p in model.parameters())
            if params > s.max_model_params:
                raise InvalidField(
                    f"model {spec.name!r} has {params:,} parameters",
                    expected=f"<= {s.max_model_params:,}",
                    got=params,
                )
            if model.head.noise_kind == "normal" and config.normal_noise != NORMAL_NOISE_VERSION:
                raise InvalidField(
                    f"the learner samples Gaussian actions from normal noise version "
                    f"{config.normal_noise} and this server (simkit {__version__}) draws "
                    f"version {NORMAL_NOISE_VERSION}: run one simkit version on both sides",
                    expected=f"normal_noise {NORMAL_NOISE_VERSION}",
                    got=config.normal_noise,
                )
            # What the session may hold: two fragments (one on its way out, one being
            # filled: a session does not start a third while an older one is still in the
            # process) and its model four times (the model, its CPU act copy and the
            # weights that may wait for a sync fragment's end).
            self._model_bytes = model_bytes = sum(t.nbytes for t in model.state_dict().values())
            held = 2 * fragment_bytes + (2 + MAX_DEFERRED_WEIGHTS) * model_bytes
            self._held.add(held, "its fragments and model")
            obs_plain = space_to_plain(envs.observation_space)
            act_plain = space_to_plain(envs.action_space)
        except UnknownModel as exc:
            raise UnknownModelError(
                str(exc),
                expected="a model registered in the simkit.models entry-point group",
                got=config.model.get("name"),
            ) from exc
        except ProtocolError:
            raise
        except (KeyError, ValueError, TypeError) as exc:
            raise InvalidField(
                f"model {config.model.get('name')!r} rejected its spec: {exc}",
                expected="kwargs the model accepts",
                got=config.model.get("kwargs"),
            ) from exc
        return model, obs_plain, act_plain

    _info_env_id = ""


_POLICY_OUTPUTS = ("log_probs", "values", "final_values", "last_values")
"""The fragment arrays the policy computes (its actions are checked by the envs)."""


def _policy_failed(loop: RolloutLoop, what: str) -> InvalidWeightsError:
    """The error that ends a session whose policy produced ``what``."""
    version = loop.policy.version
    return InvalidWeightsError(
        f"policy version {version} produced {what}: its weights cannot act (values that "
        "overflow float32, say), and the fragment cannot be finished, so the session "
        "ended; open a new session and send weights whose outputs stay finite",
        expected="finite policy outputs",
        got=f"version {version}: {what}"[:200],
    )


MAX_DEFERRED_WEIGHTS = 2
"""Weights a sync session keeps waiting for its fragment's end (a learner pushes one
version per fragment; more are refused, not queued without bound)."""

_NETWORK_WAIT_S = 0.002
"""How soon a session stalled on its learner's connection first looks again (then
twice as long each time, up to the idle wait)."""


def _check_sizes(s: StreamSettings, envs: Any, length: int, model: dict[str, Any]) -> int:
    """Refuses, before anything large is allocated, a session whose fragments or
    built-in MLP would exceed the server's limits; returns the bytes of one fragment.

    Raises:
        InvalidField: naming the limit, what it allows and what was asked.
    """
    obs, act = envs.observation_space, envs.action_space
    obs_bytes = int(np.prod(obs.shape or (1,))) * np.dtype(obs.dtype or np.float32).itemsize
    act_bytes = int(np.prod(act.shape or (1,))) * max(8, np.dtype(act.dtype or np.int64).itemsize)
    row_bytes = obs_bytes + act_bytes + 4 + 4 + 8 + 1 + 1 + 4 + 1  # logp, value, reward, flags
    fragment = length * envs.num_rows * row_bytes
    if fragment > s.max_fragment_bytes:
        raise InvalidField(
            f"a fragment of {envs.num_rows} rows x {length} steps would hold {fragment:,} "
            "bytes; ask for fewer env slots or a shorter fragment_length",
            expected=f"<= {s.max_fragment_bytes:,} bytes",
            got=fragment,
        )
    name = model.get("name")
    if name not in _TRUNKS:
        return fragment
    kwargs = model.get("kwargs") or {}
    hidden = kwargs.get("hidden_sizes", _TRUNKS[name][1])
    if not isinstance(hidden, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in hidden
    ):
        return fragment  # the model itself refuses malformed kwargs
    trunks = 1 if kwargs.get("shared_trunk") is True else _TRUNKS[name][0]
    widths = [int(np.prod(obs.shape or (1,))), *hidden, 64]
    estimate = trunks * sum(a * b for a, b in itertools.pairwise(widths))
    if estimate > s.max_model_params:
        raise InvalidField(
            f"model {name!r} with hidden_sizes of {len(hidden)} layers would have about "
            f"{estimate:,} parameters",
            expected=f"<= {s.max_model_params:,}",
            got=estimate,
        )
    return fragment


_TRUNKS: dict[str, tuple[int, list[int]]] = {"mlp": (2, [64, 64]), "sac_mlp": (1, [256, 256])}
"""Built-in models whose size is estimated from the spec: trunks (actor and critic, or
the actor alone) and the default ``hidden_sizes``."""


def _device(name: str) -> torch.device:
    """The torch device ``name`` when this server can run a policy on it.

    Raises:
        InvalidField: not a device name, a device type other than cpu and cuda (meta,
            mps, ...), or a CUDA device this machine does not have.
    """
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise InvalidField("unknown torch device", expected="cpu or cuda[:k]", got=name) from exc
    if device.type not in ("cpu", "cuda"):
        raise InvalidField(
            f"policies run on cpu or cuda devices, not on {device.type!r}",
            expected="cpu or cuda[:k]",
            got=name,
        )
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InvalidField("this server has no CUDA device", expected="cpu", got=name)
        if device.index is not None and device.index >= count:
            raise InvalidField(
                f"this server has {count} CUDA device(s)",
                expected=f"cuda:k with k < {count}",
                got=name,
            )
    return device
