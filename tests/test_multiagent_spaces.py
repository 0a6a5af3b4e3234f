"""Multi-agent vectors and servers: every observation space the codec carries, step replies.

Regression test for issue 9's bug 2: ``MultiAgentVectorEnv`` built its zero rows by
iterating the unbatched space, which fails for every space but ``Box``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

import simkit
from simkit.clients import RemoteMultiAgentVectorEnv
from simkit.protocol import (
    ENV_KIND_MULTI_AGENT,
    ClientSession,
    InvalidField,
    MultiAgentServerSession,
    ServerInfo,
    decode,
    encode,
    parse_multi_agent_reset,
    parse_multi_agent_step,
)
from simkit.servers import ParallelEnvHost, RolloutServer
from simkit.snapshot import states_equal, to_plain
from simkit.vector import MultiAgentVectorEnv

SPACES: dict[str, spaces.Space[Any]] = {
    "discrete": spaces.Discrete(5, start=-1),
    "multi_discrete": spaces.MultiDiscrete([3, 4]),
    "multi_binary": spaces.MultiBinary(3),
    "int_box": spaces.Box(-3, 3, (2,), np.int64),
    "dict": spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "k": spaces.Discrete(3)}),
    "tuple": spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (1,), np.float64))),
}


class Walkers(simkit.MultiAgentEnv[str, Any, int]):
    """Two agents whose observations are samples of ``space``; ``b`` leaves after 2 steps."""

    max_episode_steps = 4
    state_attributes = ("t",)

    def __init__(self, space: str = "discrete", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.possible_agents = ["a", "b"]
        self._space = SPACES[space]
        self.observation_spaces = {a: self._space for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(2) for a in self.possible_agents}
        self.t = 0

    def _obs(self, rng: np.random.Generator) -> dict[str, Any]:
        self._space.seed(int(rng.integers(2**31)))
        return {a: self._space.sample() for a in self.agents}

    def reset_episode(self, rng: np.random.Generator, params: Any, options: Any) -> Any:
        self.t = 0
        return self._obs(rng), {}

    def step_episode(self, actions: dict[str, int], rng: np.random.Generator) -> Any:
        self.t += 1
        obs = self._obs(rng)
        done = {a: a == "b" and self.t >= 2 for a in actions}
        infos = {a: {"t": self.t, "speed": 0.5 * self.t} for a in actions}
        return obs, {a: float(actions[a]) for a in actions}, done, infos


def make_walkers(space: str = "discrete") -> Walkers:
    return Walkers(space)


def _steps(v: Any, n: int) -> list[Any]:
    out = [v.reset(seed=3)]
    for t in range(n):
        out.append(v.step(np.full(v.num_rows, t % 2, dtype=np.int64)))
    return out


@pytest.fixture
def server_for(tmp_path: Any) -> Iterator[Any]:
    started: list[RolloutServer] = []

    def start(space: str) -> RolloutServer:
        bind = f"ipc://{tmp_path}/{space}.sock"
        server = RolloutServer(
            f"pz:{__name__}:make_walkers", 2, bind, env_kwargs={"space": space}
        ).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.mark.parametrize("space", sorted(SPACES))
def test_multi_agent_vector_local_and_remote(space: str, server_for: Any) -> None:
    local = MultiAgentVectorEnv([lambda s=space: Walkers(s)] * 2)
    steps = _steps(local, 6)
    obs, mask, _ = steps[0]
    assert mask.all()
    assert local.single_observation_space.contains(next(iter(_rows(local, obs))))
    server = server_for(space)
    remote = RemoteMultiAgentVectorEnv(server.endpoint, timeout=10)
    try:
        remote_steps = _steps(remote, 6)
    finally:
        remote.close()
    for a, b in zip(steps, remote_steps, strict=True):
        assert states_equal(to_plain(_plain(a)), to_plain(_plain(b)))


def _rows(v: MultiAgentVectorEnv, obs: Any) -> Iterator[Any]:
    from gymnasium.vector.utils import iterate

    return iter(iterate(v.observation_space, obs))


def _plain(x: Any) -> Any:
    if hasattr(x, "__dataclass_fields__"):
        return {k: _plain(getattr(x, k)) for k in x.__dataclass_fields__ if k != "infos"}
    if isinstance(x, tuple | list):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, np.generic):
        return x.item()
    return x


def _ma_session(version: tuple[int, int]) -> tuple[Any, Any]:
    host = ParallelEnvHost([Walkers("discrete"), Walkers("discrete")])
    info = ServerInfo(
        "walkers",
        host.num_envs,
        host.observation_space,
        host.action_space,
        host.capabilities,
        env_kind=ENV_KIND_MULTI_AGENT,
        agents=host.possible_agents,
    )
    server, client = MultiAgentServerSession(host, info), ClientSession()
    hello = decode(client.request_hello())
    hello.v = version
    client.parse_hello(server.handle(encode(hello)))
    parse_multi_agent_reset(client, server.handle(client.request_reset(seed=0)))
    return server, client


def test_multi_agent_step_infos_are_columns_for_13_clients() -> None:
    for version, columns in (((1, 3), True), ((1, 2), False)):
        server, client = _ma_session(version)
        reply = server.handle(client.request_step(np.ones(4, dtype=np.int64)))
        wire = decode(reply)
        assert ("info_keys" in wire.body) is columns
        assert ("info/speed" in wire.arrays) is columns
        step = parse_multi_agent_step(client, reply).step
        assert [i == {"t": 1, "speed": 0.5} for i in step.infos] == [True] * 4
        assert all(type(i["t"]) is int and type(i["speed"]) is float for i in step.infos)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("acted", np.ones(4, dtype=np.float64), r"'acted' with one row per agent row"),
        ("env_reset", np.zeros(4, dtype=np.bool_), r"'env_reset' with one row per env id"),
        ("reward", np.zeros(4, dtype=np.bool_), r"lacks 'reward' with one row per agent row"),
    ],
)
def test_bad_multi_agent_step_reply_is_refused(field: str, value: Any, match: str) -> None:
    server, client = _ma_session((1, 3))
    reply = decode(server.handle(client.request_step(np.ones(4, dtype=np.int64))))
    reply.arrays[field] = value
    with pytest.raises(InvalidField, match=match) as caught:
        parse_multi_agent_step(client, encode(reply))
    assert "dtype kind" in str(caught.value.expected)
