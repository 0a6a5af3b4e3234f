"""Trajectory recording: crash-safe episode files, a lazy reader and verified replay.

``env = RecordEpisodes(env, "runs/rec")`` records every episode a vector steps
(``RecordMultiAgentEpisodes`` a multi-agent vector's);
:class:`RecordingReader` reads them back (filters, statistics without decoding
arrays); :func:`verify_recording` re-simulates them bit for bit. The format is
specified in docs/recording.md.
"""

from simkit.errors import CorruptRecording, RecordingLocked, ReplayDivergence
from simkit.recording._cli import export_minari, render_episode
from simkit.recording._episode import Episode, EpisodeStats
from simkit.recording._format import Skipped
from simkit.recording._fragments import FragmentRecorder
from simkit.recording._io import (
    FSYNC_POLICIES,
    RecordingReader,
    RecordingWriter,
    episode_arrays,
    to_torch,
)
from simkit.recording._multiagent import AgentEpisode, MultiAgentEpisode
from simkit.recording._replay import (
    VerifyResult,
    verify_episode,
    verify_multi_agent_episode,
    verify_recording,
)
from simkit.recording._wrapper import (
    RecordEpisodes,
    RecordMultiAgentEpisodes,
    environment_versions,
)

__all__ = [
    "Episode",
    "EpisodeStats",
    "MultiAgentEpisode",
    "AgentEpisode",
    "Skipped",
    "RecordingWriter",
    "RecordingReader",
    "FSYNC_POLICIES",
    "episode_arrays",
    "to_torch",
    "RecordEpisodes",
    "RecordMultiAgentEpisodes",
    "FragmentRecorder",
    "environment_versions",
    "verify_episode",
    "verify_multi_agent_episode",
    "verify_recording",
    "VerifyResult",
    "export_minari",
    "render_episode",
    "CorruptRecording",
    "RecordingLocked",
    "ReplayDivergence",
]
