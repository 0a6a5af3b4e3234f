"""Gymnasium's VectorEnv contract on a RemoteVectorEnv: what it keeps (Gymnasium's reset
forms, checked before any server moves) and what it refuses on purpose, saying why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils import seeding

from simkit.clients import RemoteVectorEnv
from simkit.servers import RolloutServer
from simkit.vector import VectorEnv


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two CartPole servers of 2 envs each: one remote vector of 4."""
    root: Path = tmp_path_factory.mktemp("servers")
    servers = [
        RolloutServer("simkit/CartPole-v0", 2, f"ipc://{root}/s{k}.sock").start() for k in range(2)
    ]
    yield [server.endpoint for server in servers]
    for server in servers:
        server.stop()


def test_a_refused_list_of_seeds_moves_no_server(endpoints: list[str]) -> None:
    """``reset(seed=[0, 1, 2, 2**63])`` reset the first server's envs before the second
    refused its entry (a ``RemoteError``), and a ``None`` entry or a float seed were bare
    ``TypeError``s from ``int()``. Every seed is now checked on the client, as a local
    vector checks it, before any server is asked; the vector goes on as if never asked."""
    remote = RemoteVectorEnv(endpoints, timeout=10)
    local = VectorEnv("simkit/CartPole-v0", 4)
    try:
        for vec in (remote, local):
            vec.reset(seed=3)
        actions = np.array([1, 0, 1, 0])
        for _ in range(3):
            np.testing.assert_array_equal(remote.step(actions)[0], local.step(actions)[0])
        with pytest.raises(ValueError, match=r"seed\[3\] must be an int in \[0, 2\*\*63\), got 9"):
            remote.reset(seed=[0, 1, 2, 2**63])
        with pytest.raises(ValueError, match=r"seed\[1\] must be an int: .* no None entry"):
            remote.reset(seed=[0, None, 1, 2])
        with pytest.raises(
            TypeError, match=r"seed must be an int, a list of int \| None, or None, got float"
        ):
            remote.reset(seed=3.0)
        for _ in range(3):
            np.testing.assert_array_equal(remote.step(actions)[0], local.step(actions)[0])
        seeds = np.arange(4) + 100
        np.testing.assert_array_equal(remote.reset(seed=seeds)[0], local.reset(seed=seeds)[0])
    finally:
        remote.close()
        local.close()


def test_sub_env_methods_are_absent_and_say_why(endpoints: list[str]) -> None:
    """``remote.call(...)``/``get_attr``/``set_attr`` were Python's bare "object has no
    attribute": they are absent on purpose (a client must not choose code for a server
    to run), and reading one now says so; ``hasattr`` stays False for duck typing."""
    remote = RemoteVectorEnv(endpoints, timeout=10)
    try:
        for name in ("call", "get_attr", "set_attr"):
            assert not hasattr(remote, name)
            with pytest.raises(AttributeError, match=rf"RemoteVectorEnv has no {name}\(\): .* "):
                getattr(remote, name)("reset")
        with pytest.raises(AttributeError, match="must not choose code for a server to run"):
            remote.call("reset")
    finally:
        remote.close()


def test_a_root_seed_seeds_the_vectors_own_np_random(endpoints: list[str]) -> None:
    """As Gymnasium's ``VectorEnv.reset(seed=s)`` and a local vector do."""
    remote = RemoteVectorEnv(endpoints, timeout=10)
    try:
        remote.reset(seed=5)
        assert remote.np_random_seed == 5
        assert remote.np_random.random() == seeding.np_random(5)[0].random()
    finally:
        remote.close()


def test_render_says_the_wire_carries_no_frames(endpoints: list[str]) -> None:
    """``remote.render()`` was Gymnasium's "render function is not implemented"."""
    remote = RemoteVectorEnv(endpoints, timeout=10)
    try:
        with pytest.raises(NotImplementedError, match=r"the wire carries no frames.*replay"):
            remote.render()
    finally:
        remote.close()
