"""The simkit exception hierarchy.

Every domain error raised by simkit derives from :class:`SimkitError`, so callers can
catch the whole family with one ``except``. Errors about bad arguments also derive
from the matching built-in (``ValueError``/``TypeError``) so generic handlers keep working.
"""

from __future__ import annotations

import errno as _errno
import os as _os

__all__ = [
    "SimkitError",
    "InvalidAction",
    "InvalidState",
    "InvalidParameter",
    "ResetNeeded",
    "RenderUnavailable",
    "MissingDependency",
    "UnknownEnv",
    "UntrustedEnv",
    "ConformanceError",
    "UnknownModel",
    "InvalidWeights",
    "CorruptRecording",
    "RecordingLocked",
    "ReplayDivergence",
    "InvalidCheckpoint",
    "ServersLost",
    "ServerStartFailed",
    "WriteFailed",
]


class SimkitError(Exception):
    """Base class of every simkit domain error."""


class InvalidAction(SimkitError, ValueError):
    """An action does not fit the env's action space (shape, dtype, range or NaN)."""


class InvalidState(SimkitError, ValueError):
    """A snapshot passed to ``set_state`` is malformed or belongs to another env."""


class InvalidParameter(SimkitError, ValueError):
    """A randomization override names an unknown parameter or leaves its domain."""


class ResetNeeded(SimkitError, RuntimeError):
    """``step`` or ``get_state`` was called before ``reset`` or after the episode ended."""


class RenderUnavailable(SimkitError, RuntimeError):
    """Rendering was requested but no OpenGL backend could be created."""


class MissingDependency(SimkitError, ImportError):
    """An optional dependency is not installed; the message names the pip extra."""


class UnknownEnv(SimkitError, KeyError):
    """An environment id is not in the registry."""

    def __str__(self) -> str:
        # KeyError's str() adds quotes around the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class UntrustedEnv(UnknownEnv):
    """An env id read from a file or sent by a peer names code to import (an unregistered
    ``module:Class``, or ``gym:module:Id``) that the operator or user did not name; it
    is refused before anything is imported."""


class ConformanceError(SimkitError, AssertionError):
    """An env broke the simkit contract; raised by :mod:`simkit.testing` checks."""


class UnknownModel(SimkitError, KeyError):
    """A model name is neither registered nor published in the ``simkit.models`` group."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidWeights(SimkitError, ValueError):
    """Policy weights do not fit the model (names, dtypes, shapes, NaN/inf, version)."""


class CorruptRecording(SimkitError, ValueError):
    """A recording file is corrupted or truncated; the message names the file and offset."""

    def __init__(self, message: str, *, path: str = "", offset: int = -1) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class RecordingLocked(SimkitError, RuntimeError):
    """A second writer tried to open a recording directory another process writes to."""


class ReplayDivergence(SimkitError, AssertionError):
    """A replayed episode differs from its recording; names the episode, step and field."""


class InvalidCheckpoint(SimkitError, ValueError):
    """A training checkpoint is missing, truncated, corrupt or from another model.

    The message names the file and what is wrong.
    """


class ServersLost(SimkitError, RuntimeError):
    """Every rollout server of a run was lost; the learner checkpointed what it had
    (names the checkpoint and the command that resumes it)."""


class ServerStartFailed(SimkitError, RuntimeError):
    """A rollout server the learner started exited before it served; the message holds
    its exit code and its own last lines (an import error, a bind error)."""


class WriteFailed(SimkitError, OSError):
    """Writing a file failed (a full disk, a read-only folder, no permission).

    The message is one line naming the path and the errno (``cannot write PATH: No
    space left on device (ENOSPC)``, then what is still intact); ``errno`` and
    ``filename`` are set as on any ``OSError``. Whoever raises it has removed what it
    half wrote.
    """

    def __init__(self, path: str | _os.PathLike[str], error: OSError, detail: str = "") -> None:
        super().__init__(f"cannot write {_os.fspath(path)}: {self.reason(error)}{detail}")
        self.errno = error.errno
        self.strerror = error.strerror
        self.filename = _os.fspath(path)

    def __str__(self) -> str:
        return str(self.args[0])

    @staticmethod
    def reason(error: OSError) -> str:
        """``error`` in words with its errno's name: ``No space left on device (ENOSPC)``."""
        code = _errno.errorcode.get(error.errno or 0)
        why = error.strerror or str(error) or type(error).__name__
        return f"{why} ({code})" if code else why
