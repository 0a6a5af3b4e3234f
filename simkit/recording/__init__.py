"""Trajectory recording: crash-safe episode files, a lazy reader and verified replay.

``env = RecordEpisodes(env, "runs/rec")`` records every episode a vector steps
(``RecordMultiAgentEpisodes`` a multi-agent vector's);
:class:`RecordingReader` reads them back (filters, statistics without decoding
arrays); :func:`verify_recording` re-simulates them bit for bit. The format is
specified in docs/recording.md.
"""

from typing import TYPE_CHECKING

from simkit.errors import CorruptRecording, RecordingLocked, ReplayDivergence

if TYPE_CHECKING:
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

# Each name imports its module at first use: the recording machinery pulls in the batch and
# vector packages, which `simkit --help` and `simkit list` (whose verbs include the
# recording ones) do not need.
_MODULES = {
    "export_minari": "_cli",
    "render_episode": "_cli",
    "Episode": "_episode",
    "EpisodeStats": "_episode",
    "Skipped": "_format",
    "FragmentRecorder": "_fragments",
    "FSYNC_POLICIES": "_io",
    "RecordingReader": "_io",
    "RecordingWriter": "_io",
    "episode_arrays": "_io",
    "to_torch": "_io",
    "AgentEpisode": "_multiagent",
    "MultiAgentEpisode": "_multiagent",
    "VerifyResult": "_replay",
    "verify_episode": "_replay",
    "verify_multi_agent_episode": "_replay",
    "verify_recording": "_replay",
    "RecordEpisodes": "_wrapper",
    "RecordMultiAgentEpisodes": "_wrapper",
    "environment_versions": "_wrapper",
}


def __getattr__(name: str) -> object:
    """The public names of the recording modules, each imported on first use."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'simkit.recording' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"simkit.recording.{module}"), name)
