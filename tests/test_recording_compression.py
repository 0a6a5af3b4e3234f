"""The recording writer's compression levels: given ones are used for every record,
the default adapts to records that barely compress, and every record reads back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simkit.recording._io as recording_io
from simkit.recording import Episode, RecordingReader, RecordingWriter
from simkit.recording._io import AdaptiveLevel


def _episode(obs: np.ndarray, seed: int) -> Episode:
    t = obs.shape[0] - 1
    return Episode(
        "simkit/CartPole-v0",
        obs,
        np.zeros((t, 1), np.float32),
        np.ones(t),
        np.zeros(t, bool),
        np.zeros(t, bool),
        [{} for _ in range(t)],
        seed=seed,
    )


def _noise(seed: int) -> Episode:
    return _episode(np.random.default_rng(seed).normal(size=(501, 32)), seed)


def _zeros(seed: int) -> Episode:
    return _episode(np.zeros((501, 32)), seed)


def _levels(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The ``level`` of every frame the writers encode from now on."""
    seen: list[Any] = []
    encode = recording_io.encode_frame

    def spy(*args: Any, **kwargs: Any) -> tuple[bytes, bytes, bytes]:
        if args[1]:  # not the empty frame a writer encodes to check its codec
            seen.append(kwargs["level"])
        return encode(*args, **kwargs)

    monkeypatch.setattr(recording_io, "encode_frame", spy)
    return seen


def test_adaptive_level_goes_fast_after_an_incompressible_record_and_probes_again() -> None:
    policy = AdaptiveLevel()
    assert policy.next() == 3
    policy.observe(3, stored=50, raw=100)  # compresses: stay at level 3
    assert policy.next() == 3
    policy.observe(3, stored=90, raw=100)
    fast = [policy.next() for _ in range(AdaptiveLevel.PROBE_EVERY - 1)]
    assert fast == [AdaptiveLevel.FAST] * (AdaptiveLevel.PROBE_EVERY - 1)
    policy.observe(AdaptiveLevel.FAST, stored=99, raw=100)  # a fast record decides nothing
    assert policy.next() == 3
    policy.observe(3, stored=10, raw=100)
    assert policy.next() == 3


def test_default_zstd_writes_noise_fast_and_zeros_at_level_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    levels = _levels(monkeypatch)
    episodes = [_zeros(0), _noise(1), _noise(2), _zeros(3)]
    with RecordingWriter(tmp_path / "r", background=False) as writer:
        for ep in episodes:
            writer.write(ep)
    assert levels == [3, 3, AdaptiveLevel.FAST, AdaptiveLevel.FAST]
    back = list(RecordingReader(tmp_path / "r"))
    assert [ep.seed for ep in back] == [0, 1, 2, 3]
    for got, want in zip(back, episodes, strict=True):
        np.testing.assert_array_equal(got.obs, want.obs)


@pytest.mark.parametrize(("codec", "level"), [("zstd", 1), ("zstd", -5), ("zlib", None)])
def test_a_given_level_or_another_codec_is_used_for_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str, level: int | None
) -> None:
    levels = _levels(monkeypatch)
    with RecordingWriter(tmp_path / "r", compression=codec, level=level, background=False) as w:
        for k in range(3):
            w.write(_noise(k))
    assert levels == [level] * 3
    assert len(RecordingReader(tmp_path / "r")) == 3


@pytest.mark.parametrize(
    ("codec", "level", "message"),
    [
        ("zlib", 12, r"zlib compression level must be in \[-1, 9\], got 12"),
        ("zstd", 23, r"zstd compression level must be in \[-131072, 22\], got 23"),
    ],
)
def test_an_out_of_range_level_is_refused_naming_the_range(
    tmp_path: Path, codec: str, level: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RecordingWriter(tmp_path / "r", compression=codec, level=level)
    RecordingWriter(tmp_path / "r", compression=codec).close()  # the lock was not kept


def test_frame_checksums_are_zlibs_crc32_computed_by_zlib_ng() -> None:
    import zlib

    from zlib_ng import zlib_ng

    from simkit.recording import _format

    assert _format.crc32 is zlib_ng.crc32  # the SIMD one is in use (a dependency)
    data = np.random.default_rng(0).bytes(100_000)
    assert _format.crc32(data) == zlib.crc32(data)  # files stay checkable with plain zlib
    assert _format.crc32(data, 12345) == zlib.crc32(data, 12345)
