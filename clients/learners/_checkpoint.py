"""Training checkpoints without pickle, written atomically, verified before any of it is used.

A checkpoint is a directory::

    manifest.json        format, and per file its size and sha256
    model.safetensors    the policy's tensors (parameters and observation statistics)
    optimizer.safetensors  Adam's per-parameter state, flattened to ``state.<i>.<key>``
    state.msgpack        args, counters, RNG states, reward scaler, param groups and
                         the source's env snapshots (simkit.snapshot encoding)
    replay.safetensors.zst  SAC only: the replay buffer (:class:`ReplayBuffer`'s file)

It is written into a temporary sibling directory and renamed into place, then
``latest`` (a one-line file naming the newest checkpoint) is replaced atomically, so a
crash mid-write leaves the previous checkpoint and pointer intact. Loading checks the
manifest (sizes, hashes) and parses every file before returning anything; any problem
raises :class:`simkit.errors.InvalidCheckpoint` naming the file and what is wrong.

A policy snapshot (``policy.safetensors``, the model's tensors with the model spec and
env id in the safetensors metadata) is written beside the checkpoints after every
update, for evaluation while training goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import reprlib
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from simkit import snapshot
from simkit.clients.learners._args import flag
from simkit.errors import InvalidCheckpoint, InvalidState, WriteFailed
from simkit.models._weights import canonical_safetensors

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "NO_ENV_STATES_LINE",
    "no_snapshots_line",
    "check_resumed_state",
    "resumed_settings",
    "CHECKPOINT_FORMAT",
    "Checkpoint",
    "save_checkpoint",
    "load_checkpoint",
    "resolve_checkpoint",
    "checkpoint_algo",
    "checkpoint_args",
    "save_policy",
    "load_policy",
    "write_atomically",
    "flatten_optimizer",
    "unflatten_optimizer",
]

CHECKPOINT_FORMAT = "simkit.ppo.checkpoint/2"
POLICY_FORMAT = "simkit.ppo.policy/1"
_FILES = ("model.safetensors", "optimizer.safetensors", "state.msgpack")
EXTRA_FILES = ("replay.safetensors.zst",)
"""Files a checkpoint may hold beyond :data:`_FILES`, written by their owners."""
_T = TypeVar("_T")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded, verified checkpoint."""

    path: Path
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    state: dict[str, Any]
    extra: dict[str, Path] = field(default_factory=dict)
    """Verified extra files (:data:`EXTRA_FILES`) by name."""


def flatten_optimizer(opt_state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """``optimizer.state_dict()`` as named tensors plus plain param groups."""
    tensors: dict[str, torch.Tensor] = {}
    for index, per_param in opt_state["state"].items():
        for key, value in per_param.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"state.{int(index)}.{key}"] = tensor.detach().cpu().contiguous()
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()}
        for group in opt_state["param_groups"]
    ]
    return tensors, groups


def unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list[Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten_optimizer`: a dict for ``optimizer.load_state_dict``."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = tensor
    param_groups = [
        {k: (tuple(v) if k == "betas" else v) for k, v in dict(group).items()} for group in groups
    ]
    return {"state": state, "param_groups": param_groups}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_entry(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_atomically(path: Path, data: bytes) -> None:
    """Writes ``path`` through a temporary sibling (fsynced) and a rename; on failure
    the temporary is removed and ``path`` keeps its previous content (the OSError is
    raised as it came)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        _write_file(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_LEFTOVER = re.compile(r"^\..+\.(?:tmp|old)-(\d+)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or no pid at all
        return False
    except PermissionError:  # another user's
        return True
    return True


def _remove_leftovers(directory: Path) -> None:
    """Removes what a writer killed mid-checkpoint left (``.NAME.tmp-PID``,
    ``.NAME.old-PID``): only where that process is gone."""
    for entry in directory.iterdir():
        m = _LEFTOVER.match(entry.name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()


def _previous(directory: Path) -> str:
    """What a failed write leaves intact: the checkpoint ``latest`` names, if any."""
    try:
        name = (directory / "latest").read_text().strip()
    except (OSError, UnicodeDecodeError):
        name = ""
    if name and "/" not in name and (directory / name / "manifest.json").is_file():
        return f"; the previous checkpoint {directory / name} is intact"
    return "; no earlier checkpoint was kept"


def save_checkpoint(
    directory: Path,
    name: str,
    *,
    model: dict[str, torch.Tensor],
    optimizer: dict[str, Any],
    state: dict[str, Any],
    keep: int = 2,
    extra: Mapping[str, Callable[[Path], None]] | None = None,
) -> Path:
    """Writes checkpoint ``directory/name`` atomically and points ``directory/latest`` at it.

    Args:
        model: the model's ``state_dict()``.
        optimizer: the optimiser's ``state_dict()``.
        state: plain data (see :mod:`simkit.snapshot`): args, counters, RNG states, envs.
        keep: how many checkpoints to keep (older ones are removed after the rename).
        extra: name (one of :data:`EXTRA_FILES`) -> a writer of that file at the path
            it is given (inside the temporary directory; hashed into the manifest).

    Returns:
        The checkpoint's path.

    Raises:
        WriteFailed: a file could not be written (a full disk, a read-only folder): one
            line naming it, its errno and the previous checkpoint, which is intact and
            still what ``latest`` names; nothing of the new one is left.
    """
    for file_name in extra or {}:
        if file_name not in EXTRA_FILES:
            raise ValueError(f"extra checkpoint files must be in {EXTRA_FILES}, got {file_name!r}")
    blobs = _checkpoint_blobs(model, optimizer, state)
    files: dict[str, Any] = {n: {"bytes": len(b), "sha256": _sha256(b)} for n, b in blobs.items()}
    manifest = {"format": CHECKPOINT_FORMAT, "files": files}
    final = directory / name
    tmp = directory / f".{name}.tmp-{os.getpid()}"
    aside = directory / f".{name}.old-{os.getpid()}"
    writing = directory
    placed = False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(directory)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for file_name, blob in blobs.items():
            writing = final / file_name
            _write_file(tmp / file_name, blob)
        for file_name, write in (extra or {}).items():
            writing = final / file_name
            write(tmp / file_name)
            files[file_name] = _file_entry(tmp / file_name)
        writing = final / "manifest.json"
        _write_file(tmp / "manifest.json", json.dumps(manifest, indent=1).encode())
        writing = final
        if final.exists():  # the same step again: the old one stays until the new is in
            os.replace(final, aside)
        os.replace(tmp, final)
        placed = True
        writing = directory / "latest"
        write_atomically(directory / "latest", (name + "\n").encode())
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if placed:
            shutil.rmtree(final, ignore_errors=True)
        if aside.exists():
            with contextlib.suppress(OSError):
                os.replace(aside, final)
        if isinstance(exc, OSError) and not isinstance(exc, WriteFailed):
            raise WriteFailed(writing, exc, _previous(directory)) from exc
        raise
    shutil.rmtree(aside, ignore_errors=True)
    # All but the last ``keep`` checkpoints in name order (a run's names sort by step) go.
    existing = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    for old in existing[:-keep] if keep > 0 else []:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _checkpoint_blobs(
    model: dict[str, torch.Tensor], optimizer: dict[str, Any], state: dict[str, Any]
) -> dict[str, bytes]:
    """The three core files' bytes, all encoded before anything is written (an encoding
    error leaves the directory untouched)."""
    opt_tensors, groups = flatten_optimizer(optimizer)
    return {
        "model.safetensors": st_save({k: v.detach().cpu().contiguous() for k, v in model.items()}),
        "optimizer.safetensors": st_save(opt_tensors),
        "state.msgpack": snapshot.dumps({**state, "optimizer_param_groups": groups}),
    }


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory ``path`` means: itself, or the one its ``latest`` names.

    Accepts a checkpoint directory, a checkpoints directory, or a run's log directory.

    Raises:
        InvalidCheckpoint: nothing there is a checkpoint.
    """
    p = Path(path)
    for base in (p, p / "checkpoints"):
        if (base / "manifest.json").is_file():
            return base
        latest = base / "latest"
        if latest.is_file():
            name = latest.read_text().strip()
            if not name or "/" in name:
                raise InvalidCheckpoint(f"{latest}: expected a checkpoint name, got {name!r}")
            return base / name
    if (p / "checkpoints").is_dir() or (p.name == "checkpoints" and p.is_dir()):
        folder = p / "checkpoints" if (p / "checkpoints").is_dir() else p
        raise InvalidCheckpoint(
            f"{folder}: no complete checkpoint (no latest pointer): the run wrote none, "
            "or its first checkpoint failed"
        )
    if not p.exists():
        raise InvalidCheckpoint(f"{p}: not a checkpoint (no such file or directory)")
    raise InvalidCheckpoint(
        f"{p}: not a checkpoint (no manifest.json, no latest pointer, no checkpoints/ inside)"
    )


def _read_verified(path: Path, name: str, entry: Any) -> bytes:
    file = path / name
    if not file.is_file():
        raise InvalidCheckpoint(f"{file}: missing (the manifest lists it)")
    data = file.read_bytes()
    if not isinstance(entry, dict) or "bytes" not in entry or "sha256" not in entry:
        raise InvalidCheckpoint(f"{path / 'manifest.json'}: malformed entry for {name}: {entry!r}")
    if len(data) != entry["bytes"]:
        raise InvalidCheckpoint(
            f"{file}: truncated or grown: {len(data)} bytes, the manifest says {entry['bytes']}"
        )
    if _sha256(data) != entry["sha256"]:
        raise InvalidCheckpoint(f"{file}: corrupt: its sha256 does not match the manifest")
    return data


def _load_tensors(file: Path, data: bytes) -> dict[str, torch.Tensor]:
    try:
        return st_load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise InvalidCheckpoint(f"{file}: not a valid safetensors file: {exc}") from exc


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Reads and verifies a checkpoint (see :func:`resolve_checkpoint` for ``path``).

    Raises:
        InvalidCheckpoint: a file is missing, truncated, corrupt or unparseable (the
            message names it); nothing is returned half-read.
    """
    directory = resolve_checkpoint(path)
    manifest_file = directory / "manifest.json"
    if not manifest_file.is_file():
        raise InvalidCheckpoint(
            f"{manifest_file}: missing; {directory} is not a complete checkpoint"
        )
    try:
        manifest = json.loads(manifest_file.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidCheckpoint(f"{manifest_file}: not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        why = (
            " (written before placement-independent sampling; its envs' noise streams "
            "cannot be continued)"
            if got == "simkit.ppo.checkpoint/1"
            else ""
        )
        raise InvalidCheckpoint(
            f"{manifest_file}: format must be {CHECKPOINT_FORMAT!r}, got {got!r}{why}"
        )
    files = manifest.get("files")
    if (
        not isinstance(files, dict)
        or not set(_FILES) <= set(files)
        or not set(files) <= {*_FILES, *EXTRA_FILES}
    ):
        raise InvalidCheckpoint(
            f"{manifest_file}: must list {list(_FILES)} (and may list {list(EXTRA_FILES)}), "
            f"got {files!r}"
        )
    blobs = {name: _read_verified(directory, name, files[name]) for name in _FILES}
    extra: dict[str, Path] = {}
    for name in EXTRA_FILES:
        if name in files:
            file = directory / name
            if not file.is_file():
                raise InvalidCheckpoint(f"{file}: missing (the manifest lists it)")
            if _file_entry(file) != files[name]:
                raise InvalidCheckpoint(
                    f"{file}: corrupt or truncated: its size or sha256 does not match the manifest"
                )
            extra[name] = file
    model = _load_tensors(directory / "model.safetensors", blobs["model.safetensors"])
    opt_tensors = _load_tensors(directory / "optimizer.safetensors", blobs["optimizer.safetensors"])
    try:
        state = snapshot.loads(blobs["state.msgpack"])
    except InvalidState as exc:
        raise InvalidCheckpoint(f"{directory / 'state.msgpack'}: {exc}") from exc
    if not isinstance(state, dict) or "optimizer_param_groups" not in state:
        raise InvalidCheckpoint(f"{directory / 'state.msgpack'}: not a learner state map")
    try:
        optimizer = unflatten_optimizer(opt_tensors, state.pop("optimizer_param_groups"))
    except (ValueError, TypeError) as exc:
        raise InvalidCheckpoint(
            f"{directory / 'optimizer.safetensors'}: bad tensor names: {exc}"
        ) from exc
    return Checkpoint(directory, model, optimizer, state, extra)


def checkpoint_algo(ckpt: Checkpoint) -> str:
    """The algorithm that wrote ``ckpt`` (``"ppo"`` for checkpoints that name none).

    Raises:
        InvalidCheckpoint: it names another.
    """
    algo = ckpt.state.get("algo", "ppo")
    if algo not in ("ppo", "sac"):
        raise InvalidCheckpoint(
            f"{ckpt.path / 'state.msgpack'}: algo must be 'ppo' or 'sac', got {algo!r}"
        )
    return str(algo)


def checkpoint_args(ckpt: Checkpoint, parse: Callable[[Any], _T]) -> _T:
    """The run settings ``ckpt`` holds, through ``parse`` (``PPOArgs.from_plain`` or
    ``SACArgs.from_plain``).

    Raises:
        InvalidCheckpoint: none, or ``parse`` refuses them (naming ``state.msgpack``).
    """
    file = ckpt.path / "state.msgpack"
    if "args" not in ckpt.state:
        raise InvalidCheckpoint(f"{file}: no args (the run's settings); not a learner's state")
    if not isinstance(ckpt.state["args"], dict):
        raise InvalidCheckpoint(
            f"{file}: bad args: a map of settings expected, got {type(ckpt.state['args']).__name__}"
        )
    try:
        return parse(ckpt.state["args"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidCheckpoint(f"{file}: bad args: {exc}") from exc


def check_tensors(
    file: Path, got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> None:
    """Raises :class:`InvalidCheckpoint` unless ``got`` has ``expected``'s names, shapes, dtypes."""
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or extra:
        raise InvalidCheckpoint(
            f"{file}: tensor names differ from the model: missing {len(missing)} "
            f"{reprlib.repr(missing)}, unexpected {len(extra)} {reprlib.repr(extra)}"
        )
    for name, want in expected.items():
        if (have := got[name]).shape != want.shape or have.dtype != want.dtype:
            raise InvalidCheckpoint(
                f"{file}: tensor {name!r} is {have.dtype} {tuple(have.shape)}, "
                f"the model expects {want.dtype} {tuple(want.shape)}"
            )
        if have.is_floating_point() and not bool(torch.isfinite(have).all()):
            bad = int((~torch.isfinite(have)).sum())
            raise InvalidCheckpoint(f"{file}: tensor {name!r} has {bad} non-finite value(s)")


def check_optimizer(file: Path, state: dict[str, Any], params: list[torch.Tensor]) -> None:
    """Raises :class:`InvalidCheckpoint` unless the optimiser state (``unflatten_optimizer``
    form) has, for every parameter it names, per-parameter tensors of that parameter's
    shape (Adam's moments) or scalars (its step)."""
    for index, per_param in state.get("state", {}).items():
        if not 0 <= int(index) < len(params):
            raise InvalidCheckpoint(
                f"{file}: optimizer state names parameter {index}, the model has {len(params)}"
            )
        want = tuple(params[int(index)].shape)
        for key, value in per_param.items():
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else ()
            if shape not in (want, ()) or (key != "step" and shape != want):
                raise InvalidCheckpoint(
                    f"{file}: optimizer state {key!r} of parameter {index} is {shape}, "
                    f"the parameter is {want}"
                )
            if isinstance(value, torch.Tensor) and not bool(torch.isfinite(value).all()):
                raise InvalidCheckpoint(
                    f"{file}: optimizer state {key!r} of parameter {index} is not finite"
                )


def save_policy(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> None:
    """Writes a policy snapshot (tensors + JSON metadata) atomically; the same policy
    always gives the same bytes (:func:`~simkit.models._weights.canonical_safetensors`).

    Raises:
        WriteFailed: it could not be written (naming it and the errno); the previous
            snapshot is intact.
    """
    meta = {"format": POLICY_FORMAT, "meta": json.dumps(metadata)}
    data = canonical_safetensors(
        st_save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=meta)
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)
    except OSError as exc:
        raise WriteFailed(path, exc, "; the previous policy snapshot is intact") from exc


def load_policy(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Reads a policy snapshot, or the model of a checkpoint; returns ``(tensors, metadata)``.

    Raises:
        InvalidCheckpoint: unreadable, or not a simkit policy.
    """
    p = Path(path)
    if p.is_file():
        data = p.read_bytes()
        tensors = _load_tensors(p, data)
        try:
            with safe_open(str(p), framework="pt") as fh:
                meta = fh.metadata() or {}
        except (SafetensorError, OSError) as exc:
            raise InvalidCheckpoint(f"{p}: not a valid safetensors file: {exc}") from exc
        if meta.get("format") != POLICY_FORMAT:
            raise InvalidCheckpoint(
                f"{p}: format must be {POLICY_FORMAT!r}, got {meta.get('format')!r}"
            )
        try:
            return tensors, json.loads(meta["meta"])
        except (KeyError, json.JSONDecodeError, RecursionError) as exc:
            raise InvalidCheckpoint(f"{p}: malformed policy metadata: {exc}") from exc
    ckpt = load_checkpoint(p)
    policy = ckpt.state.get("policy") if isinstance(ckpt.state, dict) else None
    if not isinstance(policy, dict):
        raise InvalidCheckpoint(f"{ckpt.path / 'state.msgpack'}: holds no policy metadata")
    if ckpt.state.get("algo") == "sac":  # the actor's tensors, without the learner's
        prefix = "actor."
        actor = {k[len(prefix) :]: v for k, v in ckpt.model.items() if k.startswith(prefix)}
        return actor, dict(policy)
    return ckpt.model, dict(policy)


SettingsT = TypeVar("SettingsT", bound="DataclassInstance")


def resumed_settings(
    saved: SettingsT,
    asked: SettingsT,
    free: Sequence[str],
    given: Collection[str] | None = None,
    *,
    name_free: bool = True,
) -> SettingsT:
    """The settings (a dataclass) of a resumed run: the checkpoint's ``saved``, with the
    ``free`` fields taken from ``asked``; with ``given``, only those fields of ``asked``
    (the ones the command line set) must match.

    Raises:
        ValueError: a field outside ``free`` differs (names every one, and with
            ``name_free`` the fields a resumed run may change).
    """
    differ = [
        f.name
        for f in dataclasses.fields(saved)
        if f.name not in free
        and (given is None or f.name in given)
        and getattr(asked, f.name) != getattr(saved, f.name)
    ]
    if differ:
        may = ", ".join(flag(k) for k in free)
        raise ValueError(
            "--resume continues the checkpoint's settings; "
            + ", ".join(
                f"{flag(k)} {getattr(asked, k)} differs from its {getattr(saved, k)}"
                for k in differ
            )
            + (f" (a resumed run may change {may})" if name_free else "")
        )
    return dataclasses.replace(saved, **{k: getattr(asked, k) for k in free})


def check_resumed_state(
    ckpt: Checkpoint, counts: tuple[str, ...], *, within: str | None = None
) -> dict[str, int]:
    """Checks what a run reads from a checkpoint's state before it starts anything,
    so that a crafted (re-signed) one is refused in one line instead of failing on it
    later: the counters ``counts`` (of ``state[within]``, or of the state itself) must
    be integers >= 0, ``servers`` (where present) too, ``source_kind`` ``"local"``,
    ``"device"`` or ``"servers"``, ``normal_noise`` an integer >= 1 and ``tally`` a
    :meth:`RunTally.to_state` map. Returns the counters.

    Raises:
        InvalidCheckpoint: naming ``state.msgpack`` and the entry.
    """
    file = ckpt.path / "state.msgpack"
    state = ckpt.state
    table = state.get(within) if within is not None else state
    if not isinstance(table, dict):
        raise InvalidCheckpoint(f"{file}: {within} must be a map, got {reprlib.repr(table)}")
    out: dict[str, int] = {}
    for name, value in [*((k, table.get(k)) for k in counts), ("servers", state.get("servers", 0))]:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            where = f"{within}.{name}" if within is not None and name != "servers" else name
            raise InvalidCheckpoint(
                f"{file}: {where} must be an integer >= 0, got {reprlib.repr(value)}"
            )
        out[name] = int(value)
    kind = state.get("source_kind", "local")
    if kind not in ("local", "device", "servers"):
        raise InvalidCheckpoint(
            f"{file}: source_kind must be 'local', 'device' or 'servers', got {reprlib.repr(kind)}"
        )
    noise = state.get("normal_noise", 1)
    if isinstance(noise, bool) or not isinstance(noise, int) or noise < 1:
        raise InvalidCheckpoint(
            f"{file}: normal_noise must be an integer >= 1, got {reprlib.repr(noise)}"
        )
    tally = state.get("tally")
    if tally is not None:
        returns = tally.get("returns", []) if isinstance(tally, dict) else None
        elapsed = tally.get("elapsed_s", 0.0) if isinstance(tally, dict) else None
        if (
            not isinstance(returns, list)
            or not all(isinstance(r, int | float) and np.isfinite(r) for r in returns)
            or not isinstance(elapsed, int | float)
            or not 0 <= elapsed < float("inf")
        ):
            raise InvalidCheckpoint(
                f"{file}: tally must be {{'returns': [finite numbers], 'elapsed_s': a number "
                f">= 0}}, got {reprlib.repr(tally)}"
            )
    return out


NO_ENV_STATES_LINE = (
    "simkit train: the checkpoint holds no env states (envs without snapshots, or async "
    "mode): the envs restart afresh, so this run does not continue exactly where the "
    "checkpointed one stopped (the learner does)"
)
"""What a source says when it resumes from a checkpoint without env states."""


def no_snapshots_line(not_exact: str, *, supervised: bool) -> str:
    """What a source says, once, when its envs turn out to have no snapshots
    (``not_exact``: the reason, as :attr:`TrainResult.not_exact` keeps it)."""
    if supervised:
        what = (
            "a lost server's session reopens with fresh envs and a resume from a "
            "checkpoint restarts them afresh: neither continues exactly"
        )
    else:
        what = "a resume from a checkpoint restarts them afresh: it does not continue exactly"
    return f"simkit train: {not_exact}: {what}"
