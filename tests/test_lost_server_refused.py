"""A server that sends a fragment the learner refuses is a lost server, not the run's end.

``PolicyStream`` checks every fragment against its session (steps, rows, env slots,
dtypes); a refusal was a ``ProtocolError`` that went through ``ServerSource`` (which
handled only ``ServerUnavailable``) and ended the whole training run, so one broken or
hostile server stopped every other. It is dropped now, in one line naming it and the
reason, and the run goes on with the others (or, the last one gone, ends as every
"every server lost" run does: a checkpoint and ``ServersLost``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

import simkit
from simkit._types import Fragment
from simkit.clients.learners.ppo import PPOArgs
from simkit.protocol._stream_session import StreamServerSession
from simkit.servers import RolloutServer
from tests.test_ppo_servers import ARGS

CARTPOLE = ARGS["env_id"]
REASON = "env_ids are not the session's env slots"


@dataclasses.dataclass
class Hostile:
    first_slot: int = 2
    """Servers whose env slots start here (or later) turn hostile."""
    sent: int = 0
    """Fragments such servers sent."""


@pytest.fixture
def hostile(monkeypatch: pytest.MonkeyPatch) -> Hostile:
    """Servers whose env slots start at :attr:`Hostile.first_slot` send their fragments
    from the second one on with env ids the session never opened (as a broken or
    hostile server would)."""
    real = StreamServerSession.fragment_frames
    state = Hostile()

    def frames(self: StreamServerSession, fragment: Fragment) -> list[Any]:
        if int(fragment.env_ids[0]) >= state.first_slot:
            state.sent += 1
            if state.sent >= 2:
                fragment = dataclasses.replace(fragment, env_ids=fragment.env_ids + 1000)
        return real(self, fragment)

    monkeypatch.setattr(StreamServerSession, "fragment_frames", frames)
    return state


def _servers(tmp_path: Path, count: int) -> list[RolloutServer]:
    binds = [f"ipc://{tmp_path}/s{k}.sock" for k in range(count)]
    return [RolloutServer(CARTPOLE, 2, b, policy=True, device="cpu").start() for b in binds]


def test_a_server_sending_a_refused_fragment_is_dropped_and_the_run_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], hostile: Hostile
) -> None:
    servers = _servers(tmp_path, 2)
    bad = servers[1].endpoint
    try:
        r = simkit.train(
            PPOArgs(**ARGS),
            logdir=tmp_path / "run",
            connect=[s.endpoint for s in servers],
            max_rounds=4,
            tensorboard=False,
            server_timeout=20.0,
        )
    finally:
        for s in servers:
            s.stop()
    assert hostile.sent >= 2  # the bad server sent one good fragment, then a bad one
    assert r.updates == 4
    lines = [line for line in capfd.readouterr().err.splitlines() if bad in line]
    assert len(lines) == 1, lines
    assert f"simkit train: server {bad} was dropped (server {bad} sent what" in lines[0]
    assert REASON in lines[0]
    assert "going on with 1 server(s)" in lines[0]


def test_the_last_server_refused_ends_the_run_as_every_server_lost(
    tmp_path: Path, hostile: Hostile
) -> None:
    """Its only server's refused fragment: the learner's progress is checkpointed and the
    run ends with ServersLost naming the resume command (not an InvalidField)."""
    from simkit.clients.learners._checkpoint import load_checkpoint
    from simkit.errors import ServersLost

    [server] = _servers(tmp_path, 1)
    hostile.first_slot = 0
    args = {**ARGS, "num_envs": 2, "seed": 1}
    try:
        with pytest.raises(ServersLost, match=rf"every rollout server was lost .*{REASON}") as e:
            _train_one(tmp_path, server, args)
    finally:
        server.stop()
    assert "--resume" in str(e.value)
    assert load_checkpoint(tmp_path / "run").state is not None


def _train_one(tmp_path: Path, server: RolloutServer, args: dict[str, Any]) -> None:
    simkit.train(
        PPOArgs(**args),
        logdir=tmp_path / "run",
        connect=[server.endpoint],
        max_rounds=4,
        tensorboard=False,
        server_timeout=20.0,
    )


def test_a_refusal_seen_by_pending_is_reported_by_the_next_fragment(
    tmp_path: Path, hostile: Hostile
) -> None:
    """``pending()`` (SAC asks it between updates) reads the sockets: the refused
    message it consumed is the loss the next fragment reports, at once, not a silence
    reported as ``stopped answering`` after the timeout (in sync mode the server waits
    for weights after it)."""
    from simkit.clients.learners._server_source import ServerSource
    from simkit.models import ModelSpec, build_model

    servers = _servers(tmp_path, 2)
    lines: list[str] = []
    spec = ModelSpec("mlp", {"hidden_sizes": [16]})
    timeout = 6.0
    src = ServerSource(
        [s.endpoint for s in servers], spec, env_id=CARTPOLE, num_envs=4, num_steps=8,
        seed=0, timeout=timeout, report=lines.append,
    )  # fmt: skip
    try:
        model = build_model(spec, src.observation_space, src.action_space)
        fragments = src.fragments()
        src.push_weights(model, version=0)
        assert [next(fragments) is not None for _ in range(2)] == [True, True]
        src.push_weights(model, version=1)  # the second server's next fragment is refused
        deadline = time.monotonic() + 20
        while all(st.alive for st in src.stream.stats()):
            assert time.monotonic() < deadline, "the refused fragment never arrived"
            src.pending()
            time.sleep(0.01)
        began = time.monotonic()
        assert next(fragments) is None  # the loss, first (it had no fragment to keep)
        assert time.monotonic() - began < timeout / 2
        assert len(lines) == 1, lines
        assert f"server {servers[1].endpoint} was dropped" in lines[0]
        assert REASON in lines[0]
        assert src.stream.endpoints == [servers[0].endpoint]
        other = next(fragments)
        assert other is not None
        assert int(other.policy_version.max()) == 1  # the other server goes on
    finally:
        src.close()
        for s in servers:
            s.stop()
