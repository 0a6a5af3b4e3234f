"""What a stream host and its session workers share: the server's defaults for stream
sessions (:class:`StreamSettings`) and the tags of the inproc messages a worker sends
the host. The host (socket thread) and the workers (torch) both import this module, so
a worker never imports its host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simkit.protocol import EnvNotAllowed, Limits

__all__ = ["StreamSettings", "TAG_FRAGMENT", "TAG_REPLY", "TAG_DONE"]

TAG_FRAGMENT = b"f"
"""Inproc tag: a fragment for the learner."""
TAG_REPLY = b"r"
"""Inproc tag: a reply (or error) for the learner."""
TAG_DONE = b"d"
"""Inproc tag: the worker finished; nothing to forward."""


@dataclass(frozen=True)
class StreamSettings:
    """A server's defaults for its stream sessions.

    Attributes:
        env_id: the served env.
        env_kwargs: its constructor arguments.
        num_envs: env slots when the learner asks for 0.
        num_threads: threads stepping a session's envs (single-agent env lists).
        device: the policy's torch device when the learner names none.
        fragment_length: ``T`` when the learner asks for 0.
        heartbeat_timeout: announced to the learner.
        limits: message size limits.
        inline_threshold: arrays up to this many bytes go inside the header.
        server: server software and version.
        max_envs: the most env slots one session may ask for.
        max_fragment_bytes: the largest fragment one session may ask for (env slots x
            agents x ``T`` x the bytes of one step's row), refused at open.
        max_model_params: the most parameters a session's model may have, refused at
            open (for the built-in ``mlp`` and ``sac_mlp`` before they are built).
        max_model_layers: the most ``hidden_sizes`` layers a session's model may ask
            for, refused at open before anything is built.
        max_credit: the most credit a learner may have outstanding in one session
            (announced in the ``stream_open`` reply; a grant beyond it is refused).
        double_buffer: step a session's envs in two halves, one half's physics
            overlapping the policy's forward pass for the other, where the envs allow
            it (a BatchEnv with subset steps, an even number of env slots).
        allowed_envs: env ids besides ``env_id`` that a learner may ask for (the
            operator's ``--allow-env``), each built with its registered defaults.
    """

    env_id: str
    env_kwargs: dict[str, Any]
    num_envs: int
    num_threads: int = 1
    device: str = "cpu"
    fragment_length: int = 128
    heartbeat_timeout: float | None = 60.0
    limits: Limits = field(default_factory=Limits)
    inline_threshold: int = 16384
    server: str = ""
    max_envs: int = 4096
    max_fragment_bytes: int = 256 << 20
    max_model_params: int = 16_000_000
    max_model_layers: int = 64
    max_credit: int = 64
    double_buffer: bool = False
    allowed_envs: tuple[str, ...] = ()

    def admit_env(
        self, env_id: str | None, env_kwargs: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """The env a ``stream_open`` may build: ``env_id`` None is the served env as the
        operator configured it; any other id must be the served one or an allowed one,
        with exactly the kwargs the operator gave it. Checked before anything is
        imported, so no peer chooses what code runs.

        Raises:
            EnvNotAllowed: the id or its kwargs are not the operator's.
        """
        if env_id is None:
            return self.env_id, dict(self.env_kwargs)
        if env_id == self.env_id:
            allowed: dict[str, Any] = dict(self.env_kwargs)
        elif env_id in self.allowed_envs:
            allowed = {}
        else:
            named = " or ".join([self.env_id, *self.allowed_envs])
            raise EnvNotAllowed(
                f"this server builds only the envs its operator named: {named}, not {env_id[:200]}",
                expected=named,
                got=env_id[:200],
            )
        if dict(env_kwargs) != allowed:
            raise EnvNotAllowed(
                f"this server builds {env_id} only with the kwargs its operator gave it, "
                f"{allowed} (simkit serve ... --env-kwarg), got {str(dict(env_kwargs))[:200]}",
                expected=allowed,
                got=str(dict(env_kwargs))[:200],
            )
        return env_id, allowed
