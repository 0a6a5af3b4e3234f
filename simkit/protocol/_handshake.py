"""The handshake and the request vocabulary: what a server announces, what a client may ask."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gymnasium import spaces

from simkit._validation import check_seed
from simkit.protocol._codec import PROTOCOL_VERSION, Limits, check_type
from simkit.protocol._errors import InvalidField
from simkit.protocol._spaces import space_from_plain, space_to_plain

__all__ = [
    "REQUEST_KINDS",
    "CAPABILITIES",
    "AUTORESET_SAME_STEP",
    "ServerInfo",
    "SessionState",
    "heartbeat_field",
    "seed_field",
]

REQUEST_KINDS = ("hello", "reset", "step", "get_state", "set_state", "ping", "close")
CAPABILITIES = ("state", "randomization", "params")
"""``state``: get_state/set_state; ``randomization``: the env declares randomized
parameters and reports them in reset infos; ``params``: reset accepts per-env overrides."""
AUTORESET_SAME_STEP = "same_step"


@dataclass(frozen=True)
class ServerInfo:
    """The handshake: what the server announces in its ``hello`` reply."""

    env_id: str
    num_envs: int
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    capabilities: frozenset[str] = frozenset()
    env_kind: str = "single"
    agents: list[str] | None = None
    autoreset: str = AUTORESET_SAME_STEP
    protocol: tuple[int, int] = PROTOCOL_VERSION
    server: str = "simkit"
    max_message_bytes: int = Limits().max_message_bytes
    session: str = ""
    shared: bool = False
    heartbeat_timeout: float | None = None

    def to_plain(self) -> dict[str, Any]:
        """The handshake body."""
        return {
            "protocol": list(self.protocol),
            "server": self.server,
            "env_id": self.env_id,
            "env_kind": self.env_kind,
            "num_envs": self.num_envs,
            "agents": self.agents,
            "observation_space": space_to_plain(self.observation_space),
            "action_space": space_to_plain(self.action_space),
            "autoreset": self.autoreset,
            "capabilities": sorted(self.capabilities),
            "max_message_bytes": self.max_message_bytes,
            "session": self.session,
            "shared": self.shared,
            "heartbeat_timeout": self.heartbeat_timeout,
        }

    @classmethod
    def from_plain(cls, body: Mapping[str, Any]) -> ServerInfo:
        """Parses a handshake body, validating every field."""
        proto = check_type(body, "protocol", list)
        if len(proto) != 2 or not all(isinstance(x, int) for x in proto):
            raise InvalidField("'protocol' must be [major, minor]", got=proto)
        caps = check_type(body, "capabilities", list)
        agents = check_type(body, "agents", list, optional=True)
        num_envs = check_type(body, "num_envs", int)
        if num_envs < 1:
            raise InvalidField("'num_envs' must be >= 1", got=num_envs)
        heartbeat = heartbeat_field(body)
        return cls(
            env_id=check_type(body, "env_id", str),
            num_envs=num_envs,
            observation_space=space_from_plain(check_type(body, "observation_space", dict)),
            action_space=space_from_plain(check_type(body, "action_space", dict)),
            capabilities=frozenset(str(c) for c in caps),
            env_kind=check_type(body, "env_kind", str),
            agents=None if agents is None else [str(a) for a in agents],
            autoreset=check_type(body, "autoreset", str),
            protocol=(proto[0], proto[1]),
            server=check_type(body, "server", str),
            max_message_bytes=check_type(body, "max_message_bytes", int),
            session=check_type(body, "session", str),
            shared=check_type(body, "shared", bool),
            heartbeat_timeout=heartbeat,
        )


class SessionState(enum.Enum):
    """new --hello--> ready --close--> closed."""

    NEW = "new"
    READY = "ready"
    CLOSED = "closed"


def heartbeat_field(body: Mapping[str, Any]) -> float | None:
    """A handshake's ``heartbeat_timeout``: nil, or a finite number of seconds > 0 (a
    client waits a quarter of it between keepalives: an infinite wait overflows).

    Raises:
        InvalidField: anything else.
    """
    value = check_type(body, "heartbeat_timeout", (int, float), optional=True)
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InvalidField(
            "'heartbeat_timeout' must be > 0 seconds, finite, or nil", expected="> 0", got=value
        )
    return None if value is None else float(value)


def seed_field(value: Any, what: str) -> int:
    """A seed field of a request: an int in ``[0, 2**63)``.

    Raises:
        InvalidField: anything else (``what`` names the field).
    """
    try:
        return check_seed(value, what)
    except ValueError as exc:
        raise InvalidField(str(exc), expected="int in [0, 2**63)", got=repr(value)) from None
