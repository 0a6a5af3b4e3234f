"""simkit's wire protocol: messages, spaces codec and session state machines. No IO.

See docs/protocol.md for the specification. Transports (``simkit.servers``,
``simkit.clients``) move the frames this package builds and parses. The codec, spaces,
errors and multi-agent modules are public whole (their ``__all__``); of the others, the
names listed below.
"""

from simkit.protocol import _codec, _errors, _multiagent, _spaces
from simkit.protocol._client_session import ClientSession, ResetResult
from simkit.protocol._codec import *  # noqa: F403  (the codec: _codec.__all__)
from simkit.protocol._error_reply import error_code_of, error_reply
from simkit.protocol._errors import *  # noqa: F403  (the errors: _errors.__all__)
from simkit.protocol._handshake import (
    AUTORESET_SAME_STEP,
    CAPABILITIES,
    REQUEST_KINDS,
    ServerInfo,
    SessionState,
)
from simkit.protocol._infos import (
    INFO_COLUMNS_SINCE,
    info_columns,
    infos_from_wire,
    infos_to_wire,
    step_infos_to_wire,
)
from simkit.protocol._multiagent import *  # noqa: F403  (multi-agent: _multiagent.__all__)
from simkit.protocol._server_session import (
    EnvHost,
    Host,
    ResetRequest,
    ServerSession,
    is_keepalive,
    keepalive_target,
)
from simkit.protocol._spaces import *  # noqa: F403  (the spaces codec: _spaces.__all__)
from simkit.protocol._spaces import put_rows, take_rows
from simkit.protocol._step_reply import EnvFault
from simkit.protocol._stream_messages import (
    FRAGMENT_ARRAYS,
    SESSION_STATE_FORMAT,
    STREAM_ERROR_CODES,
    STREAM_KINDS,
    STREAM_MODES,
    InvalidSessionState,
    InvalidWeightsError,
    SessionSnapshot,
    StaleVersion,
    StreamConfig,
    StreamInfo,
    UnknownModelError,
    parse_fragment,
)
from simkit.protocol._stream_session import (
    StreamClientSession,
    StreamServerSession,
    StreamState,
)

__all__ = [
    # codec
    *_codec.__all__,
    # spaces
    *_spaces.__all__,
    "take_rows",
    "put_rows",
    # sessions
    "REQUEST_KINDS",
    "CAPABILITIES",
    "AUTORESET_SAME_STEP",
    "EnvHost",
    "Host",
    "ResetRequest",
    "EnvFault",
    "ServerInfo",
    "SessionState",
    "ServerSession",
    "ClientSession",
    "ResetResult",
    "error_reply",
    "error_code_of",
    "keepalive_target",
    "is_keepalive",
    "infos_to_wire",
    "infos_from_wire",
    "info_columns",
    "step_infos_to_wire",
    "INFO_COLUMNS_SINCE",
    # multi-agent
    *_multiagent.__all__,
    # stream sessions (policy serving)
    "STREAM_KINDS",
    "STREAM_MODES",
    "STREAM_ERROR_CODES",
    "FRAGMENT_ARRAYS",
    "StreamConfig",
    "StreamInfo",
    "SessionSnapshot",
    "SESSION_STATE_FORMAT",
    "InvalidSessionState",
    "StreamState",
    "StreamServerSession",
    "StreamClientSession",
    "parse_fragment",
    "UnknownModelError",
    "InvalidWeightsError",
    "StaleVersion",
    # errors
    *_errors.__all__,
]
