"""Input and peers a rollout server must refuse or outlive: devices it cannot run on,
models too deep to build, exposed metrics, and peers that hold every session slot."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from simkit.clients import PolicyStream
from simkit.models import ModelSpec
from simkit.protocol import RemoteError
from simkit.servers import RolloutServer

SPEC = ModelSpec("mlp", {"hidden_sizes": [16]})


@pytest.fixture
def server() -> Iterator[RolloutServer]:
    srv = RolloutServer(
        "simkit/CartPole-v0", 2, "tcp://127.0.0.1:0", policy=True, device="cpu"
    ).start()
    yield srv
    srv.stop()


def _opens(endpoint: str, spec: ModelSpec = SPEC, **kw: Any) -> None:
    """Opens a stream session and pushes no weights; closes it."""
    with PolicyStream(endpoint, spec, num_envs=2, fragment_length=4, timeout=10, **kw):
        pass


@pytest.mark.parametrize("device", ["meta", "mps", "xla", "cpu:0x"])
def test_stream_open_refuses_devices_the_policy_cannot_run_on(
    server: RolloutServer, device: str
) -> None:
    with pytest.raises(RemoteError, match=r"\[invalid_field\].*device") as info:
        _opens(server.endpoint, device=device)
    assert info.value.got == device
    _opens(server.endpoint)  # the server goes on serving
    assert server.stream_sessions == 0


@pytest.mark.parametrize(
    "spec",
    [
        ModelSpec("mlp", {"hidden_sizes": [1] * 65536}),
        ModelSpec("sac_mlp", {"hidden_sizes": [1] * 65536}),
        ModelSpec("mlp", {"hidden_sizes": [4096, 4096]}),
    ],
    ids=["deep-mlp", "deep-sac", "wide-mlp"],
)
def test_stream_open_refuses_models_too_large_before_building_them(
    server: RolloutServer, spec: ModelSpec
) -> None:
    """Layers and parameters are counted from the spec: the refusal comes at once."""
    start = time.monotonic()
    with pytest.raises(RemoteError, match=r"\[invalid_field\].*(layers|parameters)"):
        _opens(server.endpoint, spec)
    assert time.monotonic() - start < 5
    _opens(server.endpoint)


def test_metrics_on_a_non_loopback_host_warn(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a non-loopback bind does; the HTTP server is faked (no port is opened)."""
    hosts: list[str] = []

    class FakeHTTP:
        def __init__(self, registry: Any, host: str, port: int) -> None:
            hosts.append(host)
            self.port = 9

        def close(self) -> None:
            pass

    monkeypatch.setattr("simkit.servers._server.MetricsHTTPServer", FakeHTTP)
    for host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "10.1.2.3"):
        srv = RolloutServer(
            "simkit/CartPole-v0", 1, "inproc://metrics", metrics_host=host, metrics_port=0
        )
        srv.stop()
        err = capsys.readouterr().err
        if host in ("0.0.0.0", "10.1.2.3"):
            assert f"WARNING: simkit server metrics on {host}:9" in err
            assert "from the network" in err
        else:
            assert "WARNING" not in err
    assert hosts == ["127.0.0.1", "localhost", "::1", "0.0.0.0", "10.1.2.3"]
