"""simkit's wire protocol: messages, spaces codec and session state machines. No IO.

See docs/protocol.md for the specification. Transports (``simkit.servers``,
``simkit.clients``) move the frames this package builds and parses.
"""

from simkit.protocol._client_session import ClientSession, ResetResult
from simkit.protocol._codec import (
    INLINE_THRESHOLD,
    PROTOCOL_VERSION,
    Limits,
    Message,
    decode,
    encode,
    plain_safe,
)
from simkit.protocol._error_reply import error_code_of, error_reply
from simkit.protocol._errors import (
    ERROR_CODES,
    InvalidDtype,
    InvalidEnvIds,
    InvalidField,
    InvalidShape,
    MalformedMessage,
    MessageTooLarge,
    NonFinite,
    OutOfSpace,
    ProtocolError,
    RemoteError,
    SessionStateError,
    UnknownKind,
    Unsupported,
    UnsupportedSpace,
    VersionMismatch,
)
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
from simkit.protocol._multiagent import (
    ENV_KIND_MULTI_AGENT,
    ENV_KIND_SINGLE,
    MultiAgentHost,
    MultiAgentReset,
    MultiAgentServerSession,
    MultiAgentStep,
    final_obs_rows,
    parse_multi_agent_reset,
    parse_multi_agent_step,
)
from simkit.protocol._server_session import (
    EnvHost,
    Host,
    ServerSession,
    is_keepalive,
    keepalive_target,
)
from simkit.protocol._spaces import (
    DTYPES,
    batch_dtype,
    check_batch,
    flatten_batch,
    put_rows,
    space_from_plain,
    space_to_plain,
    take_rows,
    unflatten_batch,
)
from simkit.protocol._step_reply import EnvFault
from simkit.protocol._stream_messages import (
    FRAGMENT_ARRAYS,
    STREAM_ERROR_CODES,
    STREAM_KINDS,
    STREAM_MODES,
    InvalidWeightsError,
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
    "PROTOCOL_VERSION",
    "INLINE_THRESHOLD",
    "DTYPES",
    "Limits",
    "Message",
    "encode",
    "decode",
    "plain_safe",
    # spaces
    "space_to_plain",
    "space_from_plain",
    "batch_dtype",
    "flatten_batch",
    "unflatten_batch",
    "check_batch",
    "take_rows",
    "put_rows",
    # sessions
    "REQUEST_KINDS",
    "CAPABILITIES",
    "AUTORESET_SAME_STEP",
    "EnvHost",
    "Host",
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
    "ENV_KIND_SINGLE",
    "ENV_KIND_MULTI_AGENT",
    "MultiAgentHost",
    "MultiAgentServerSession",
    "MultiAgentReset",
    "MultiAgentStep",
    "parse_multi_agent_reset",
    "parse_multi_agent_step",
    "final_obs_rows",
    # stream sessions (policy serving)
    "STREAM_KINDS",
    "STREAM_MODES",
    "STREAM_ERROR_CODES",
    "FRAGMENT_ARRAYS",
    "StreamConfig",
    "StreamInfo",
    "StreamState",
    "StreamServerSession",
    "StreamClientSession",
    "parse_fragment",
    "UnknownModelError",
    "InvalidWeightsError",
    "StaleVersion",
    # errors
    "ERROR_CODES",
    "ProtocolError",
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
    "Unsupported",
    "UnsupportedSpace",
    "RemoteError",
]
