"""Exceptions to wire error codes and ``error`` replies (expected vs got)."""

from __future__ import annotations

from simkit import errors
from simkit.protocol._codec import Message
from simkit.protocol._errors import ProtocolError

__all__ = ["error_code_of", "error_reply"]

_SIMKIT_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (errors.InvalidAction, "invalid_action"),
    (errors.InvalidState, "invalid_state"),
    (errors.InvalidParameter, "invalid_parameter"),
    (errors.ResetNeeded, "reset_needed"),
)


def error_code_of(exc: BaseException) -> str:
    """The wire error code for an exception (``env_error`` for foreign exceptions)."""
    if isinstance(exc, ProtocolError):
        return exc.code
    for cls, code in _SIMKIT_CODES:
        if isinstance(exc, cls):
            return code
    return "env_error"


def error_reply(
    exc: BaseException, *, request_id: int = 0, request_kind: str | None = None
) -> Message:
    """The ``error`` reply message for ``exc``."""
    if isinstance(exc, ProtocolError):
        message, expected, got = exc.message, exc.expected, exc.got
    else:
        message, expected, got = f"{type(exc).__name__}: {exc}", None, None
    return Message(
        kind="error",
        id=request_id,
        body={
            "code": error_code_of(exc),
            "message": message,
            "expected": expected,
            "got": got,
            "request_kind": request_kind,
        },
    )
