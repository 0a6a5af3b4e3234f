"""Protocol errors: every bad message maps to one error code a client can act on."""

from __future__ import annotations

from typing import Any, ClassVar

from simkit.errors import SimkitError

__all__ = [
    "ERROR_CODES",
    "ProtocolError",
    "InternalError",
    "MalformedMessage",
    "VersionMismatch",
    "UnknownKind",
    "InvalidField",
    "InvalidDtype",
    "InvalidShape",
    "NonFinite",
    "InvalidEnvIds",
    "OutOfSpace",
    "MessageTooLarge",
    "SessionStateError",
    "Busy",
    "EnvNotAllowed",
    "Unsupported",
    "UnsupportedSpace",
    "RemoteError",
]


class ProtocolError(SimkitError, ValueError):
    """A message broke the wire protocol; carries a stable error ``code``.

    ``str()`` of it is ``message``, ending with what was expected and what came where
    ``message`` does not already say them (a caller prints only the message);
    :attr:`message` is the sentence alone, what an error reply carries.

    Attributes:
        code: machine-readable error code (see :data:`ERROR_CODES`).
        message: the sentence, without ``expected`` and ``got``.
        expected: what the receiver expected, in words (or None).
        got: what it received, in words (or None).
    """

    code: ClassVar[str] = "protocol_error"

    def __init__(self, message: str, *, expected: Any = None, got: Any = None) -> None:
        self.message = message
        self.expected = None if expected is None else str(expected)
        self.got = None if got is None else str(got)
        said = [
            f"{name} {value}"
            for name, value in (("expected", self.expected), ("got", self.got))
            if value is not None and value not in message
        ]
        super().__init__(f"{message} ({', '.join(said)})" if said else message)


class MalformedMessage(ProtocolError):
    """The frames are not a protocol message (not msgpack, missing fields, bad types)."""

    code = "malformed"


class VersionMismatch(ProtocolError):
    """The peer speaks another MAJOR protocol version."""

    code = "version_mismatch"


class UnknownKind(ProtocolError):
    """The message ``kind`` is not one the receiver handles."""

    code = "unknown_kind"


class InvalidField(ProtocolError):
    """A header or body field is missing, of the wrong type or out of range."""

    code = "invalid_field"


class InternalError(ProtocolError):
    """An unexpected server error (a bug): the server says so and keeps serving."""

    code = "internal"


class InvalidDtype(ProtocolError):
    """An array has a dtype outside the whitelist or other than the one expected."""

    code = "invalid_dtype"


class InvalidShape(ProtocolError):
    """An array's shape disagrees with its descriptor, its data or the space."""

    code = "invalid_shape"


class NonFinite(ProtocolError):
    """A float array that must be finite holds NaN or inf."""

    code = "not_finite"


class InvalidEnvIds(ProtocolError):
    """Env ids out of range, repeated, or of the wrong type."""

    code = "invalid_env_ids"


class OutOfSpace(ProtocolError):
    """An action lies outside the action space (Discrete range, 0/1 for MultiBinary)."""

    code = "invalid_action"


class MessageTooLarge(ProtocolError):
    """A message exceeds the receiver's size limits."""

    code = "too_large"


class SessionStateError(ProtocolError):
    """The request is not allowed in the session's state (e.g. step before hello)."""

    code = "session_state"


class Busy(ProtocolError):
    """The server cannot take this now (no free slot, its peer's share or its memory
    budget spent); nothing changed, retry later."""

    code = "busy"


class EnvNotAllowed(ProtocolError):
    """The request names an env (or constructor arguments) the server's operator did not
    allow; refused before anything is imported or built."""

    code = "env_not_allowed"


class Unsupported(ProtocolError):
    """The env lacks the capability the request needs (e.g. ``state`` snapshots)."""

    code = "unsupported"


class UnsupportedSpace(ProtocolError, TypeError):
    """A Gymnasium space type the spaces codec cannot carry."""

    code = "unsupported_space"


class RemoteError(ProtocolError):
    """An error reply from the peer, raised on the client side; its message is the
    peer's, after ``[remote_code]``.

    Attributes:
        remote_code: the code the server sent (any string, also future ones).
    """

    code = "remote_error"

    def __init__(
        self, remote_code: str, message: str, *, expected: Any = None, got: Any = None
    ) -> None:
        super().__init__(f"[{remote_code}] {message}", expected=expected, got=got)
        self.remote_code = remote_code


ERROR_CODES: dict[str, str] = {
    "malformed": "the frames are not a valid message (bad msgpack, missing or mistyped fields)",
    "version_mismatch": "the peer speaks another major protocol version",
    "unknown_kind": "the request kind is not known",
    "invalid_field": "a field is missing, mistyped or out of range",
    "invalid_dtype": "an array dtype is not allowed or not the expected one",
    "invalid_shape": "an array shape disagrees with its descriptor, data or space",
    "not_finite": "a float array holds NaN or inf",
    "invalid_env_ids": "env ids out of range, repeated or mistyped",
    "too_large": "the message exceeds the size limits",
    "session_state": "the request is not allowed now (hello first; session closed)",
    "unsupported": "the env lacks the capability the request needs",
    "unsupported_space": "a space type the spaces codec cannot carry",
    "invalid_action": "an action is outside the action space",
    "invalid_state": "a snapshot is malformed or belongs to another env",
    "invalid_parameter": "a randomization override is unknown or out of its domain",
    "reset_needed": "the env must be reset first",
    "env_error": "the env raised an exception",
    "shutting_down": "the server is stopping and refuses new work",
    "busy": "the server has no free session slot (or none for this peer), or its memory "
    "budget is spent; retry later",
    "env_not_allowed": "the request names an env id or env kwargs the server's operator did "
    "not allow (simkit serve ENV --env-kwarg ... --allow-env ID)",
    "internal": "an unexpected server error (a bug); the server keeps serving",
}
"""Every error code with its meaning (documented in docs/protocol.md)."""
