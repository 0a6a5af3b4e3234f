"""What a hostile peer can put on the wire that earlier hardening did not look at:
headers whose msgpack unpacks to far more memory than its bytes."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import zmq

from simkit.protocol import ClientSession, InvalidField, Limits, MessageTooLarge, decode
from simkit.servers import RolloutServer


def _header_of_empty_maps(n: int) -> bytes:
    """A valid ``ping`` header whose body holds ``n`` empty maps (one byte each)."""
    chunk = 2**16
    lists = [b"\xdd" + chunk.to_bytes(4, "big") + b"\x80" * chunk for _ in range(n // chunk)]
    head = msgpack.packb({"v": [1, 3], "id": 1, "kind": "ping"})
    lists_bytes = b"\xdd" + len(lists).to_bytes(4, "big") + b"".join(lists)
    body = msgpack.packb("body") + b"\x81" + msgpack.packb("maps") + lists_bytes
    return bytes([head[0] + 1]) + head[1:] + body  # the fixmap gains the "body" entry


def test_a_header_of_tiny_containers_is_refused_before_it_is_built() -> None:
    """Eight MiB of empty maps unpacked to ~600 MB of dicts; now the decoder counts
    the objects as msgpack builds them and stops at ``max_objects``."""
    header = _header_of_empty_maps(8 * 2**20)
    tracemalloc.start()
    try:
        with pytest.raises(MessageTooLarge, match="too many msgpack objects"):
            decode([header])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, f"decoding allocated {peak / 2**20:.0f} MiB"
    small = Limits(max_objects=2**10)
    with pytest.raises(MessageTooLarge, match="too many msgpack objects"):
        decode([_header_of_empty_maps(2**16)], limits=small)
    assert decode([_header_of_empty_maps(2**16)]).kind == "ping"  # within the default


@pytest.fixture
def small_server() -> Iterator[RolloutServer]:
    srv = RolloutServer("simkit/CartPole-v0", 1, "tcp://127.0.0.1:0", max_memory=64 * 2**20).start()
    yield srv
    srv.stop()


def test_a_server_bounds_a_headers_objects_by_its_memory_budget(
    small_server: RolloutServer,
) -> None:
    """A 64 MiB budget allows 8 MiB messages; 4 MiB of empty maps (~300 MB of dicts)
    is ``too_large`` and the server goes on serving the same connection."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 20000)
    sock.connect(small_server.endpoint)
    try:
        sock.send(_header_of_empty_maps(4 * 2**20))
        reply = decode(sock.recv_multipart())
        assert (reply.kind, reply.body["code"]) == ("error", "too_large")
        assert small_server.limits.max_objects == 2**16
        client = ClientSession()
        sock.send_multipart(client.request_hello())
        assert client.parse_hello(sock.recv_multipart()).num_envs == 1
    finally:
        sock.close()


def _hello_reply(client: ClientSession, **changes: object) -> list[object]:
    """A CartPole server's ``hello`` reply to ``client``'s pending hello, edited."""
    from gymnasium import spaces

    from simkit.protocol import Message, ServerInfo, encode

    info = ServerInfo(
        env_id="simkit/CartPole-v0",
        num_envs=2,
        observation_space=spaces.Box(-1, 1, (4,), np.float32),
        action_space=spaces.Discrete(2),
        capabilities=frozenset(),
        server="simkit",
    )
    return encode(
        Message(kind="hello", id=client._next_id - 1, body={**info.to_plain(), **changes})
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"num_envs": 2**40},
        {"observation_space": {"type": "MultiBinary", "shape": [2**30, 2**30]}},
        {"action_space": {"type": "MultiBinary", "shape": [2**20, 2**10]}},
        {"env_kind": "multi_agent", "agents": [str(i) for i in range(2**20)], "num_envs": 2**10},
    ],
)
def test_a_handshake_whose_batches_fit_no_message_is_refused(changes: dict[str, object]) -> None:
    """A server's ``hello`` sized what the client then allocates: 2**40 envs made
    RemoteVectorEnv ask for 8 TiB, a MultiBinary of 2**30 x 2**30 for 2 EiB (and
    smaller lies for what the machine has). A batch of every env's observations or
    actions must fit a message the client accepts, else its replies never could."""
    client = ClientSession()
    client.request_hello()
    with pytest.raises(InvalidField, match="fit no message this client accepts"):
        client.parse_hello(_hello_reply(client, **changes))
    ok = ClientSession()
    ok.request_hello()
    assert ok.parse_hello(_hello_reply(ok)).num_envs == 2
