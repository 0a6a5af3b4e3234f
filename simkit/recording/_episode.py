"""The typed episode and its encoding into one record (meta map + array blob)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from simkit import snapshot
from simkit.errors import CorruptRecording, InvalidState

__all__ = [
    "Trajectory",
    "Episode",
    "EpisodeStats",
    "encode_episode",
    "decode_episode",
    "stats_from_meta",
    "trajectory_arrays",
    "decode_origin",
    "undecodable",
    "DECODE_ERRORS",
    "encode_trajectory",
    "decode_trajectory",
    "checked_infos",
    "plain_infos",
    "plain_body",
    "pack_record",
    "unpack_record",
    "version_range",
    "leaves_of",
]

RECORD_FORMAT = 1
_U64 = struct.Struct("<Q")


class Trajectory:
    """What a single-agent :class:`Episode` and one agent's part of a multi-agent episode
    (:class:`~simkit.recording.AgentEpisode`) share: one trajectory of ``T`` steps
    (observation and action trees, rewards, flags, infos, policy versions), encoded and
    decoded by the same functions (:func:`encode_trajectory`, :func:`decode_trajectory`)."""

    obs: Any
    actions: Any
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: list[dict[str, Any]]
    policy_version: np.ndarray | None

    @property
    def length(self) -> int:
        """``T``, the number of steps."""
        return int(self.rewards.shape[0])

    @property
    def total_return(self) -> float:
        """Sum of the rewards."""
        return float(np.sum(self.rewards, dtype=np.float64))


@dataclass
class Episode(Trajectory):
    """One recorded episode of one env (single-agent) with what re-simulates it.

    ``T`` is the number of steps. Observations and actions are trees (dict / tuple of
    arrays, as the spaces give them) whose leaves are stacked over time.

    Attributes:
        env_id: the registered env id.
        obs: ``(T + 1, ...)`` leaves: the reset observation, then what every action led
            to (the final observation included); ``(T, ...)`` where
            ``origin["final_obs"]`` is ``False`` (fragment episodes: no final observation).
        actions: ``(T, ...)`` leaves: the actions as sent.
        rewards: ``(T,)`` float64.
        terminated: ``(T,)`` bool.
        truncated: ``(T,)`` bool.
        infos: the ``T`` step infos (without the next episode's ``reset_info``).
        reset_info: the reset info (``params`` included).
        seed: the seed the env was reset with (``None``: not known, not replayable).
        options: the reset options (``None`` for none).
        params: the sampled randomization parameters (``reset_info["params"]``).
        env_kwargs: the env's constructor arguments.
        policy_version: ``(T,)`` int64 version of the policy per step, -1 where unknown.
        snapshots: ``{step: env.get_state()}`` taken before step ``step`` (0 = after reset).
        versions: simkit / env module / mujoco / gymnasium versions at recording time.
        origin: where it came from: ``root_seed``, ``env_index``, ``episode_index``
            (the ``episode_seed`` triple), ``source``, ``kind``.
        kernels: the recording process's kernels (:func:`simkit._kernels.kernel_mode`:
            ``{"reproducible": bool, "simd": str}``): bits made without
            ``--reproducible`` repeat only on a CPU with the same SIMD features; ``None``
            for records written before simkit stored it.
    """

    env_id: str
    obs: Any
    actions: Any
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: list[dict[str, Any]] = field(default_factory=list)
    reset_info: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    options: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    policy_version: np.ndarray | None = None
    snapshots: dict[int, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    origin: dict[str, Any] = field(default_factory=dict)
    kernels: dict[str, Any] | None = None


@dataclass(frozen=True)
class EpisodeStats:
    """Episode-level figures kept in the record meta: read without decoding any array."""

    env_id: str
    length: int
    total_return: float
    terminated: bool
    truncated: bool
    seed: int | None
    policy_version_min: int
    policy_version_max: int
    path: str
    offset: int
    agent_returns: dict[Any, float] | None = None
    """Multi-agent episodes: each agent's return (``total_return`` is their sum);
    ``None`` for single-agent episodes."""
    kernels: dict[str, Any] | None = None
    """The recording process's kernels (:attr:`Episode.kernels`); ``None``: not stored."""


def _flatten(tree: Any, leaves: list[Any]) -> Any:
    if isinstance(tree, dict):
        return {"d": [[k, _flatten(v, leaves)] for k, v in tree.items()]}
    if isinstance(tree, tuple | list):
        return {"t": [_flatten(v, leaves) for v in tree]}
    leaves.append(tree)
    return {"a": len(leaves) - 1}


def _unflatten(spec: Any, leaves: list[np.ndarray]) -> Any:
    if "d" in spec:
        return {k: _unflatten(v, leaves) for k, v in spec["d"]}
    if "t" in spec:
        return tuple(_unflatten(v, leaves) for v in spec["t"])
    return leaves[spec["a"]]


def _numeric(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{name}: only numeric/bool arrays can be recorded, got {arr.dtype}")
    return np.ascontiguousarray(arr)


def trajectory_arrays(
    prefix: str,
    what: str,
    obs: Any,
    actions: Any,
    columns: dict[str, Any],
    n_obs: int,
) -> tuple[Any, Any, list[tuple[str, np.ndarray]]]:
    """``(obs_tree, action_tree, [(name, array), ...])`` of one trajectory, checked.

    ``columns`` holds ``rewards``, ``terminated``, ``truncated`` and ``policy_version``
    (``None``: unknown); ``T`` is the length of ``rewards``. ``prefix`` starts every
    array name (``""`` for a single-agent episode, ``"agents/J/"`` for agent ``J``),
    ``what`` every error message.
    """
    t = int(np.shape(columns["rewards"])[0])
    arrays: list[tuple[str, np.ndarray]] = []
    obs_leaves: list[Any] = []
    obs_tree = _flatten(obs, obs_leaves)
    act_leaves: list[Any] = []
    act_tree = _flatten(actions, act_leaves)
    for k, leaf in enumerate(obs_leaves):
        arr = _numeric(np.asarray(leaf), f"{what}obs leaf {k}")
        if arr.shape[:1] != (n_obs,):
            raise ValueError(
                f"{what}obs leaf {k} must have {n_obs} rows (T = {t}), got {arr.shape}"
            )
        arrays.append((f"{prefix}obs/{k}", arr))
    for k, leaf in enumerate(act_leaves):
        arr = _numeric(np.asarray(leaf), f"{what}action leaf {k}")
        if arr.shape[:1] != (t,):
            raise ValueError(f"{what}action leaf {k} must have T = {t} rows, got {arr.shape}")
        arrays.append((f"{prefix}actions/{k}", arr))
    pv = columns["policy_version"]
    version = np.full(t, -1, np.int64) if pv is None else np.asarray(pv, np.int64)
    for name, arr, dtype in (
        ("rewards", columns["rewards"], np.float64),
        ("terminated", columns["terminated"], np.bool_),
        ("truncated", columns["truncated"], np.bool_),
        ("policy_version", version, np.int64),
    ):
        a = np.asarray(arr)
        if a.shape != (t,) or a.dtype != dtype:
            raise ValueError(
                f"{what}{name} must be ({t},) {np.dtype(dtype)}, got {a.shape} {a.dtype}"
            )
        arrays.append((f"{prefix}{name}", np.ascontiguousarray(a)))
    return obs_tree, act_tree, arrays


def plain_infos(infos: list[dict[str, Any]], t: int, what: str) -> list[dict[str, Any]]:
    """The ``T`` step infos as plain data (``{}`` for an empty one)."""
    if len(infos) != t:
        raise ValueError(f"{what}infos must hold T = {t} dicts, got {len(infos)}")
    if not t or (not infos[0] and infos.count(infos[0]) == t):  # one identity scan when shared
        return [{}] * t
    return [snapshot.to_plain(x, f"{what}infos[{k}]") if x else {} for k, x in enumerate(infos)]


def pack_map(body: dict[str, Any]) -> bytes:
    """``msgpack.packb(body)``, byte for byte, with a value that is a list of empty maps
    (the infos of an episode without any) written as its array header and one byte
    per map instead of going through the packer item by item."""
    packer = msgpack.Packer(use_bin_type=True)
    parts = [packer.pack_map_header(len(body))]
    for key, value in body.items():
        parts.append(packer.pack(key))
        if type(value) is list and value and value[0] == {} and value.count(value[0]) == len(value):
            parts.append(packer.pack_array_header(len(value)) + b"\x80" * len(value))
        else:
            parts.append(packer.pack(value))
    return b"".join(parts)


def pack_record(
    body: dict[str, Any], arrays: list[tuple[str, np.ndarray]]
) -> tuple[list[list[Any]], bytes]:
    """``(array descriptors, blob)``: ``u64 body_len``, the msgpack body, then the arrays.

    ``body`` must already be plain data (:func:`snapshot.to_plain`).
    """
    packed = pack_map(body)
    descriptors = []
    parts: list[bytes | memoryview] = [_U64.pack(len(packed)), packed]
    offset = _U64.size + len(packed)
    for name, arr in arrays:
        data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
        descriptors.append([name, arr.dtype.str, list(arr.shape), offset, len(data)])
        parts.append(data)
        offset += len(data)
    return descriptors, b"".join(parts)


def unpack_record(meta: dict[str, Any], blob: bytes) -> tuple[Any, dict[str, np.ndarray]]:
    """Inverse of :func:`pack_record`: the decoded body and the arrays by name (read-only
    views of ``blob``).

    Raises:
        ValueError: a wrong record format, dtype or extent (the caller names the file).
    """
    if meta.get("format") != RECORD_FORMAT:
        raise ValueError(f"record format {meta.get('format')!r}, expected {RECORD_FORMAT}")
    (body_len,) = _U64.unpack_from(blob, 0)
    body = snapshot.from_plain(
        msgpack.unpackb(blob[_U64.size : _U64.size + body_len], raw=False, strict_map_key=True),
        "episode",
    )
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape, start, nbytes in meta["arrays"]:
        dt = np.dtype(dtype)
        if dt.kind not in "biufc" or start + nbytes > len(blob):
            raise ValueError(f"array {name!r}: bad dtype {dtype} or extent")
        arrays[name] = np.frombuffer(blob, dt, count=nbytes // max(dt.itemsize, 1), offset=start)
        arrays[name] = arrays[name].reshape(tuple(shape))
    return body, arrays


def plain_body(fields: dict[str, Any], what: str) -> dict[str, Any]:
    """``fields`` as plain data, or :class:`TypeError` naming what is not."""
    try:
        return snapshot.to_plain(fields, what)
    except InvalidState as exc:
        raise TypeError(f"episode infos/options/snapshots must be plain data: {exc}") from exc


def version_range(versions: list[np.ndarray]) -> list[int] | None:
    """``[min, max]`` of the known (>= 0) policy versions, ``None`` if none is known."""
    known = np.concatenate([np.zeros(0, np.int64), *(v[v >= 0] for v in versions)])
    return [int(known.min()), int(known.max())] if known.size else None


def record_origin_meta(ep: Episode | Any) -> dict[str, Any]:
    """The meta fields every record kind starts with: the format, and what re-simulates
    the episode (env id and kwargs, seed, params, versions, origin, and the kernels where
    known: a record from before they were stored re-encodes to its own bytes)."""
    meta = {
        "format": RECORD_FORMAT,
        "env_id": ep.env_id,
        "env_kwargs": snapshot.to_plain(ep.env_kwargs, "env_kwargs"),
        "seed": ep.seed,
        "params": snapshot.to_plain(ep.params, "params"),
        "versions": dict(ep.versions),
        "origin": snapshot.to_plain(ep.origin, "origin"),
    }
    if ep.kernels is not None:
        meta["kernels"] = _kernels_meta(ep.kernels)
    return meta


def _kernels_meta(kernels: Any) -> dict[str, Any]:
    """A record's ``kernels`` map, checked: ``{"reproducible": bool, "simd": str}``.

    Raises:
        TypeError: anything else (naming what came).
    """
    if (
        not isinstance(kernels, dict)
        or set(kernels) != {"reproducible", "simd"}
        or not isinstance(kernels["reproducible"], bool)
        or not isinstance(kernels["simd"], str)
    ):
        raise TypeError(f'kernels must be {{"reproducible": bool, "simd": str}}, got {kernels!r}')
    return {"reproducible": kernels["reproducible"], "simd": kernels["simd"]}


def encode_trajectory(
    traj: Trajectory, prefix: str, what: str, n_obs: int
) -> tuple[Any, Any, list[tuple[str, np.ndarray]], list[dict[str, Any]]]:
    """``(obs_tree, action_tree, arrays, infos)`` of one trajectory: its arrays named
    ``prefix...`` (:func:`trajectory_arrays`) and its ``T`` infos as plain data."""
    columns = {
        "rewards": traj.rewards,
        "terminated": traj.terminated,
        "truncated": traj.truncated,
        "policy_version": traj.policy_version,
    }
    obs_tree, act_tree, arrays = trajectory_arrays(
        prefix, what, traj.obs, traj.actions, columns, n_obs
    )
    try:
        infos = plain_infos(traj.infos, traj.length, what)
    except InvalidState as exc:
        raise TypeError(f"episode infos/options/snapshots must be plain data: {exc}") from exc
    return obs_tree, act_tree, arrays, infos


def decode_trajectory(
    arrays: dict[str, np.ndarray],
    prefix: str,
    obs_tree: Any,
    action_tree: Any,
    *,
    length: int,
    final_obs: bool = True,
) -> dict[str, Any]:
    """The array fields of a trajectory (``obs``, ``actions``, ``rewards``, the flags,
    ``policy_version``: ``None`` where no step's version is known), inverse of
    :func:`encode_trajectory`, held to the writer's rules (:func:`trajectory_arrays`:
    dtypes, ``T`` rows, ``T + 1`` observations with ``final_obs``) and to ``length``
    steps, so a record re-packed with other arrays is refused, not misread.

    Raises:
        ValueError, TypeError, IndexError: the arrays break those rules.
    """
    version = arrays[prefix + "policy_version"]
    if version.dtype != np.int64:  # the writer casts any numbers; a reader must not
        raise ValueError(f"recorded policy_version must be int64, got {version.dtype}")
    columns = {name: arrays[prefix + name] for name in ("rewards", "terminated", "truncated")}
    obs = _unflatten(obs_tree, leaves_of(arrays, prefix + "obs"))
    actions = _unflatten(action_tree, leaves_of(arrays, prefix + "actions"))
    trajectory_arrays(
        prefix,
        "recorded ",
        obs,
        actions,
        {**columns, "policy_version": version},
        length + final_obs,
    )
    if len(columns["rewards"]) != length:
        raise ValueError(
            f"the record says {length} steps, its rewards hold {len(columns['rewards'])}"
        )
    return {
        "obs": obs,
        "actions": actions,
        **columns,
        "policy_version": None if bool(np.all(version < 0)) else version,
    }


def encode_episode(ep: Episode) -> tuple[dict[str, Any], bytes]:
    """``(meta, blob)`` of one record (see docs/recording.md, "Episode records")."""
    t = ep.length
    final = 0 if ep.origin.get("final_obs") is False else 1
    obs_tree, act_tree, arrays, infos = encode_trajectory(ep, "", "", t + final)
    body = plain_body(
        {
            "reset_info": ep.reset_info,
            "options": ep.options,
            "snapshots": [[int(k), v] for k, v in sorted(ep.snapshots.items())],
        },
        "episode",
    ) | {"infos": infos}
    descriptors, blob = pack_record(body, arrays)
    meta = {
        **record_origin_meta(ep),
        "length": t,
        "return": ep.total_return,
        "terminated": bool(t and ep.terminated[-1]),
        "truncated": bool(t and ep.truncated[-1]),
        "policy_version": version_range([dict(arrays)["policy_version"]]),
        "obs_tree": obs_tree,
        "action_tree": act_tree,
        "arrays": descriptors,
    }
    return meta, blob


def stats_from_meta(meta: dict[str, Any], path: str, offset: int) -> EpisodeStats:
    """The :class:`EpisodeStats` of a record meta map."""
    try:
        pv = meta["policy_version"]
        return EpisodeStats(
            env_id=str(meta["env_id"]),
            length=int(meta["length"]),
            total_return=float(meta["return"]),
            terminated=bool(meta["terminated"]),
            truncated=bool(meta["truncated"]),
            seed=None if meta["seed"] is None else int(meta["seed"]),
            policy_version_min=-1 if pv is None else int(pv[0]),
            policy_version_max=-1 if pv is None else int(pv[1]),
            path=path,
            offset=offset,
            agent_returns=(
                None
                if "agents" not in meta
                else {a["id"]: float(a["return"]) for a in meta["agents"]}
            ),
            kernels=None if meta.get("kernels") is None else _kernels_meta(meta["kernels"]),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CorruptRecording(
            f"{path}: record meta at offset {offset} is malformed: {exc!r}",
            path=path,
            offset=offset,
        ) from exc


DECODE_ERRORS = (KeyError, TypeError, ValueError, IndexError, struct.error, InvalidState)
"""What a malformed meta or body raises while an episode is decoded."""


def undecodable(path: str, offset: int, exc: BaseException) -> CorruptRecording:
    """The :class:`CorruptRecording` of a record that does not decode."""
    return CorruptRecording(
        f"{path}: record at offset {offset} does not decode: {exc!r}", path=path, offset=offset
    )


def decode_origin(meta: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The episode fields of :func:`record_origin_meta` and the body's ``options`` and
    ``snapshots``, decoded (every record kind has them)."""
    return {
        "seed": meta["seed"],
        "options": body["options"],
        "params": snapshot.from_plain(meta["params"]),
        "env_kwargs": snapshot.from_plain(meta["env_kwargs"]),
        "snapshots": {int(k): v for k, v in body["snapshots"]},
        "versions": dict(meta["versions"]),
        "origin": snapshot.from_plain(meta["origin"]),
        "kernels": None if meta.get("kernels") is None else _kernels_meta(meta["kernels"]),
    }


def decode_episode(meta: dict[str, Any], blob: bytes, path: str, offset: int) -> Episode:
    """Inverse of :func:`encode_episode` (the blob already checked and decompressed)."""
    try:
        body, arrays = unpack_record(meta, blob)
        origin = decode_origin(meta, body)
        fields = decode_trajectory(
            arrays,
            "",
            meta["obs_tree"],
            meta["action_tree"],
            length=int(meta["length"]),
            final_obs=origin["origin"].get("final_obs") is not False,
        )
        return Episode(
            env_id=str(meta["env_id"]),
            **fields,
            infos=checked_infos(body["infos"], int(meta["length"])),
            reset_info=body["reset_info"],
            **origin,
        )
    except DECODE_ERRORS as exc:
        raise undecodable(path, offset, exc) from exc


def checked_infos(infos: Any, length: int) -> list[dict[str, Any]]:
    """A record's ``T`` step infos, as the writer stores them (one map per step).

    Raises:
        ValueError: another count, or an entry that is no map.
    """
    if not isinstance(infos, list) or len(infos) != length:
        got = len(infos) if isinstance(infos, list) else type(infos).__name__
        raise ValueError(f"a record holds {length} step infos, got {got}")
    if not all(isinstance(info, dict) for info in infos):
        raise ValueError("a record's step infos must be maps")
    return infos


def leaves_of(arrays: dict[str, np.ndarray], prefix: str) -> list[np.ndarray]:
    out = []
    k = 0
    while f"{prefix}/{k}" in arrays:
        out.append(arrays[f"{prefix}/{k}"])
        k += 1
    return out
