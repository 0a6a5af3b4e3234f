"""A recording server under a peer that edits its envs' snapshots: the recorder keeps
what can be replayed and its memory stays bounded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simkit.protocol import Message
from simkit.servers import RolloutServer
from simkit.servers._recording import RecordingHost


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[tuple[RolloutServer, Any, RecordingHost]]:
    """A Pendulum server recording into ``tmp_path`` and one session of one env on it,
    driven without sockets."""
    srv = RolloutServer("simkit/Pendulum-v0", 1, "tcp://127.0.0.1:0", record=tmp_path)
    host = srv._recorded(srv._new_host(1), "peer")
    assert isinstance(host, RecordingHost)
    session = srv._session_for(host, srv._info)
    session.dispatch(Message(kind="hello", id=1))
    yield srv, session, host
    host.close()
    srv.stop()


def _ok(session: Any, kind: str, **kw: Any) -> Message:
    reply: Message = session.dispatch(Message(kind=kind, id=2, **kw))
    assert reply.kind == kind, reply.body
    return reply


def _steps(session: Any, n: int) -> None:
    actions = {"actions": np.zeros((1, 1), np.float32)}
    for _ in range(n):
        _ok(session, "step", arrays=actions)


def test_an_env_whose_snapshot_lifts_its_time_limit_is_not_recorded(
    recorded: tuple[RolloutServer, Any, RecordingHost],
) -> None:
    """A peer set a snapshot whose ``max_episode_steps`` was 2**62: Pendulum's episodes
    then never ended and the recorder buffered every step (~320 bytes each, without
    bound, outside the memory budget); they could not be replayed either (a replay
    builds the env with its own limit). Such an env's episodes are left out until a
    snapshot gives it its limit back, and then recorded again."""
    srv, session, host = recorded
    _ok(session, "reset", body={"seed": 1})
    own = _ok(session, "get_state").body["states"]
    lifted = [{**own[0], "env": {**own[0]["env"], "max_episode_steps": 2**62}}]
    _ok(session, "set_state", body={"states": lifted})
    _ok(session, "reset", body={"seed": 2})
    _steps(session, 600)
    assert int(host.tracker.buffer.length.max()) <= 1
    _ok(session, "set_state", body={"states": own})
    _ok(session, "reset", body={"seed": 3})
    _steps(session, 200)  # Pendulum's own limit: one episode, recorded
    assert srv.recorder is not None
    srv.recorder.writer.flush()
    assert srv.recorder.writer.episodes_written == 1


def _served_episode(tmp_path: Path, env_id: str, actions: np.ndarray) -> Any:
    """The first episode a server of ``env_id`` recorded (two envs, fixed actions)."""
    from simkit.recording import RecordingReader

    srv = RolloutServer(env_id, 2, "tcp://127.0.0.1:0", record=tmp_path)
    host = srv._recorded(srv._new_host(2), "peer")
    session = srv._session_for(host, srv._info)
    session.dispatch(Message(kind="hello", id=1))
    _ok(session, "reset", body={"seed": 5})
    while srv.recorder is not None and srv.recorder.writer.episodes_written == 0:
        _ok(session, "step", arrays={"actions": actions})
        srv.recorder.writer.flush()
    host.close()
    srv.stop()
    return RecordingReader(tmp_path).load(0)


@pytest.mark.parametrize("kind", ["single", "batch", "multi"])
def test_a_record_whose_params_were_edited_fails_verify(tmp_path: Path, kind: str) -> None:
    """``--verify`` compared observations, rewards and flags, not the episode's
    randomization parameters: a record saying gravity was 12.5 replayed its trajectory
    bit for bit and passed. Its params must now be those the replayed reset reports."""
    import dataclasses

    from simkit.errors import ReplayDivergence
    from simkit.recording import RecordingReader, verify_episode

    if kind == "single":
        episode = RecordingReader(Path(__file__).parent / "data" / "recording-single").load(0)
    elif kind == "batch":
        episode = _served_episode(tmp_path, "simkit/BatchCartPole-v0", np.zeros(2, np.int64))
    else:
        episode = _served_episode(tmp_path, "simkit/GoalNav-v0", np.zeros((6, 2), np.float32))
    verify_episode(episode)
    name = next(iter(episode.params))
    edited = {**episode.params, name: episode.params[name] + 1.0}
    with pytest.raises(ReplayDivergence, match=f"field params\\['{name}'\\] differs"):
        verify_episode(dataclasses.replace(episode, params=edited))
