"""The simkit environment registry: ``make``, ``register`` and third-party plugins.

Every single-agent id is also registered with Gymnasium, so
``gymnasium.make("simkit/CartPole-v0")`` works after ``import simkit``. Packages
outside simkit publish envs through the ``simkit.envs`` entry-point group: the entry
point's name is the env id and its value an env class (``"pkg.module:MyEnv"``) or a
zero-argument function that calls :func:`register` itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import gymnasium

from simkit._contract import EnvKind
from simkit._limits import MAX_ENV_ID_LENGTH
from simkit.errors import UnknownEnv, UntrustedEnv

__all__ = [
    "EnvKind",
    "EnvSpec",
    "register",
    "make",
    "spec",
    "env_ids",
    "names_code",
    "registered_everywhere",
    "portable_env",
    "check_trusted",
    "trusted_make",
    "add_trust_argument",
    "ENTRY_POINT_GROUP",
    "MAX_ENV_ID_LENGTH",
]

ENTRY_POINT_GROUP = "simkit.envs"


@dataclass(frozen=True)
class EnvSpec:
    """A registered env: how to build it and which contract it speaks."""

    id: str
    entry_point: str | Callable[..., Any]
    kind: EnvKind = EnvKind.SINGLE
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def load(self) -> Callable[..., Any]:
        """Imports and returns the env constructor."""
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        if not attr:
            raise ValueError(
                f"entry_point for {self.id!r} must look like 'package.module:Class', "
                f"got {self.entry_point!r}"
            )
        module = importlib.import_module(module_name)
        try:
            constructor: Callable[..., Any] = getattr(module, attr)
        except AttributeError as exc:
            raise UnknownEnv(
                f"{self.entry_point!r} for {self.id!r}: {module_name} has no {attr}"
            ) from exc
        return constructor

    def make(self, **kwargs: Any) -> Any:
        """Builds an instance, call-site kwargs overriding the registered ones."""
        return self.load()(**{**self.kwargs, **kwargs})


_REGISTRY: dict[str, EnvSpec] = {}
_plugins_loaded = False
_STARTUP: dict[str, EnvSpec] = {}
"""The registrations every simkit process makes alike: simkit's own envs (at ``import
simkit``, :func:`_mark_startup`) and the installed plugins' (at first use). One the
caller's code makes later exists in its own process only."""


def _mark_startup() -> None:
    """Records the registrations made so far as every process's (``import simkit``
    calls it once its own envs are registered)."""
    _STARTUP.update(_REGISTRY)


def registered_everywhere(id: str) -> bool:
    """Whether a new simkit process (a rollout server this one starts) has ``id``
    registered as this one has: simkit's own ids and the installed plugins', unless
    this process replaced them. ``False`` for an id this process's code registered
    itself (``simkit.register`` in a script or notebook): a new process cannot see it."""
    _load_plugins()
    found = _REGISTRY.get(id)
    return found is not None and _STARTUP.get(id) is found


def portable_env(env_id: str, env_kwargs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The env id and kwargs a new Python process (a rollout server, a replay worker,
    the conformance kit's other-process check) builds ``env_id`` from, as this one builds
    it with ``env_kwargs``.

    A new process knows simkit's own ids, the installed plugins' and ``gym:`` and
    ``package.module:Class`` ids (:func:`registered_everywhere`); those pass unchanged.
    An id this process's code registered (``simkit.register`` in a script or notebook)
    does not exist there: it becomes the registered class as ``package.module:Class``,
    with the registered kwargs under ``env_kwargs``.

    Raises:
        ValueError: the registered entry point is no class a new process can import (a
            class of ``__main__`` or a function's, a factory function): one line saying
            to name an importable class.
    """
    if env_id.startswith(GYM_PREFIX) or ":" in env_id or registered_everywhere(env_id):
        return env_id, dict(env_kwargs)
    registered = spec(env_id)
    path = importable_class(registered.entry_point)
    if path is None:
        entry = registered.entry_point
        if not isinstance(entry, str):
            name = getattr(entry, "__qualname__", type(entry).__name__)
            entry = f"{name} of {getattr(entry, '__module__', '?')}"
        raise ValueError(
            f"{env_id!r} is registered in this process only (entry point {entry}), and a "
            "new process cannot build it: define the class in a module and register it "
            "(or use its package.module:Class id)"
        )
    return path, {**registered.kwargs, **env_kwargs}


def importable_class(entry_point: Any) -> str | None:
    """``package.module:Class`` of an entry point (a class or such a str) that names an
    env class a new process can import, else None."""
    if isinstance(entry_point, str):
        module_name, _, attr = entry_point.partition(":")
    else:
        module_name = getattr(entry_point, "__module__", "") or ""
        attr = getattr(entry_point, "__qualname__", "") or ""
    if module_name in ("", "__main__") or not attr.isidentifier():
        return None  # a script's or notebook's class, a local class, a lambda
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return None
    if not isinstance(found, type) or (
        not isinstance(entry_point, str) and found is not entry_point
    ):
        return None  # a factory function, or another object under that name
    return f"{module_name}:{attr}"


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    kind: EnvKind = EnvKind.SINGLE,
    kwargs: dict[str, Any] | None = None,
    description: str = "",
    override: bool = False,
) -> EnvSpec:
    """Adds an env to the registry (and, if single-agent, to Gymnasium's).

    Args:
        id: ``"namespace/Name-vN"``, e.g. ``"simkit/CartPole-v0"``.
        entry_point: ``"package.module:Class"`` or a callable returning the env.
        kind: the contract the env implements.
        kwargs: default constructor arguments.
        description: one line for ``simkit list``.
        override: replace an existing registration instead of raising.

    Raises:
        ValueError: the id is already registered and ``override`` is False.
    """
    if not isinstance(id, str) or not id:
        raise TypeError(f"env id must be a non-empty str, got {id!r}")
    if not isinstance(kind, EnvKind):
        raise TypeError(f"kind must be an EnvKind, got {kind!r}")
    if id in _REGISTRY and not override:
        raise ValueError(f"env id {id!r} is already registered; pass override=True to replace it")
    env_spec = EnvSpec(id, entry_point, kind, dict(kwargs or {}), description)
    _REGISTRY[id] = env_spec
    if id in gymnasium.registry:
        del gymnasium.registry[id]
    if kind is EnvKind.SINGLE:
        # simkit envs own their time limit, so Gymnasium must not add a TimeLimit.
        gymnasium.register(id=id, entry_point=entry_point, kwargs=dict(kwargs or {}))
    return env_spec


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    before = dict(_REGISTRY)
    try:
        _register_plugins()
    finally:  # what the plugins registered, every process registers alike
        _STARTUP.update({k: v for k, v in _REGISTRY.items() if before.get(k) is not v})


def _register_plugins() -> None:
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in _REGISTRY:
            continue
        target = entry.load()
        if isinstance(target, type):
            register(entry.name, target, kind=_kind_of(target))
        elif callable(target):
            target()
        else:
            raise TypeError(
                f"entry point {entry.name!r} in group {ENTRY_POINT_GROUP!r} must be an env class "
                f"or a registration function, got {type(target).__name__}"
            )


def _kind_of(constructor: object) -> EnvKind:
    """The contract an env class declares (its base class's ``env_kind``); anything else,
    a factory function or a plain Gymnasium env, is single-agent."""
    kind = getattr(constructor, "env_kind", EnvKind.SINGLE)
    return kind if isinstance(kind, EnvKind) else EnvKind.SINGLE


GYM_PREFIX = "gym:"
"""``gym:<id>`` names an installed Gymnasium env (``gymnasium.make(<id>)``)."""


def _gym_spec(id: str) -> EnvSpec:
    """The spec of ``gym:<id>``: Gymnasium's env, built with ``gymnasium.make``."""
    import functools

    gym_id = id[len(GYM_PREFIX) :]
    try:
        gymnasium.spec(gym_id)
    except gymnasium.error.Error as exc:
        raise UnknownEnv(f"no Gymnasium env {gym_id!r} for {id!r}: {exc}") from None
    return EnvSpec(
        id=id,
        entry_point=functools.partial(_gym_make, gym_id),
        kind=EnvKind.SINGLE,
        description=f"Gymnasium's {gym_id} (gymnasium.make)",
    )


def _gym_make(gym_id: str, **kwargs: Any) -> Any:
    """``gymnasium.make(gym_id)``; a Gymnasium MuJoCo env loads MuJoCo through
    :mod:`simkit._mujoco` first, so a broken ``MUJOCO_GL`` is one line naming what is
    missing (``RenderUnavailable``), not MuJoCo's traceback."""
    if "mujoco" in str(gymnasium.spec(gym_id).entry_point):
        import simkit._mujoco  # noqa: F401

    return gymnasium.make(gym_id, **kwargs)


def _class_spec(id: str) -> EnvSpec:
    """The spec of ``package.module:Class``: an env class used without registering it,
    its kind read from its base class. Anything but a class (``os:system``) is refused:
    the id form names env classes, not arbitrary callables."""
    module_name, _, attr = id.partition(":")
    if not module_name or not attr or not module_name.replace(".", "_").isidentifier():
        raise UnknownEnv(
            f"{id!r} is neither a registered id nor 'package.module:Class' (see simkit.env_ids())"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownEnv(
            f"{id!r}: cannot import {module_name!r} ({exc}); run from the folder that "
            "holds it or put it on PYTHONPATH"
        ) from None
    constructor = getattr(module, attr, None)
    if constructor is None:
        raise UnknownEnv(f"{id!r}: module {module_name} has no {attr!r}")
    if not isinstance(constructor, type):
        raise UnknownEnv(
            f"{id!r} is not an env class: {module_name}.{attr} is a "
            f"{type(constructor).__name__}; 'package.module:Class' names a class (a factory "
            "function is registered with simkit.register)"
        )
    if not (
        callable(getattr(constructor, "reset", None))
        and callable(getattr(constructor, "step", None))
    ):
        raise UnknownEnv(
            f"{id!r} is not an env class: {module_name}.{attr} has no reset() and step() "
            "('package.module:Class' names an env class)"
        )
    return EnvSpec(
        id=id,
        entry_point=constructor,
        kind=_kind_of(constructor),
        description=f"{id} (unregistered)",
    )


def names_code(id: str) -> bool:
    """Whether building ``id`` imports a module that the id itself names: an unregistered
    ``package.module:Class``, or ``gym:package.module:Id`` (Gymnasium imports the module
    before it looks the id up). Registered ids and plain ``gym:<id>`` ids name only code
    that installed packages registered, so they name none."""
    if id.startswith(GYM_PREFIX):
        return ":" in id[len(GYM_PREFIX) :]
    if ":" not in id:
        return False
    _load_plugins()
    return id not in _REGISTRY


def check_trusted(id: str, trust: Collection[str] = (), *, source: str = "a file") -> None:
    """Refuses, before anything is imported, an env id read from ``source`` (a file, a
    peer) that names code (:func:`names_code`) nobody named in ``trust``.

    An id from a recording, a policy file or a peer is data; only the person running
    the command decides which modules it may import (``--trust ID`` on the command line,
    ``trust=`` in Python, ``--allow-env ID`` for a server).

    Raises:
        TypeError: ``id`` is not a str.
        UnknownEnv: ``id`` is empty or longer than :data:`MAX_ENV_ID_LENGTH`.
        UntrustedEnv: ``id`` names code that ``trust`` does not name.
    """
    if not isinstance(id, str):
        raise TypeError(f"env id must be a str, got {type(id).__name__}")
    if not id or len(id) > MAX_ENV_ID_LENGTH:
        raise UnknownEnv(
            f"env id must be 1 to {MAX_ENV_ID_LENGTH} characters, got {len(id)} (from {source})"
        )
    if names_code(id) and id not in trust:
        raise UntrustedEnv(
            f"{source} names the env {id!r}, which would import code nobody named; "
            f"refused before importing anything (to allow it, name it: --trust {id})"
        )


def add_trust_argument(parser: Any) -> None:
    """The ``--trust ID`` flag (repeatable) of every command that builds envs from ids it
    reads from a file: the ``package.module:Class`` ids it may import."""
    parser.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="ID",
        help="a package.module:Class env id the file may name and this command may import "
        "(repeatable); registered and gym: ids need none",
    )


def trusted_make(
    id: str, trust: Collection[str] = (), *, source: str = "a file", **kwargs: Any
) -> Any:
    """:func:`make` of an id read from ``source``, after :func:`check_trusted`."""
    check_trusted(id, trust, source=source)
    return make(id, **kwargs)


def spec(id: str) -> EnvSpec:
    """The registration of ``id``; ``gym:<id>`` is Gymnasium's env ``<id>`` and
    ``package.module:Class`` an env class used without registering it.

    Raises:
        UnknownEnv: ``id`` is not registered; the message lists close matches.
    """
    if not isinstance(id, str):
        raise TypeError(f"env id must be a str, got {type(id).__name__}")
    if len(id) > MAX_ENV_ID_LENGTH:
        raise UnknownEnv(f"env id must be at most {MAX_ENV_ID_LENGTH} characters, got {len(id)}")
    if id.startswith(GYM_PREFIX):
        return _gym_spec(id)
    if id.startswith("pz:"):
        raise UnknownEnv(
            f"{id!r} names a plain PettingZoo env, which only a rollout server hosts "
            f"(simkit serve {id}; RemoteParallelEnv steps it); here, pass the env itself "
            "(MultiAgentVectorEnv([factory, ...]))"
        )
    _load_plugins()
    if ":" in id and id not in _REGISTRY:
        return _class_spec(id)
    try:
        return _REGISTRY[id]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(id, list(_REGISTRY), n=3)
        if id in gymnasium.registry:  # Gymnasium's own id (simkit's are in _REGISTRY)
            close.insert(0, f"{GYM_PREFIX}{id} (Gymnasium's {id})")
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownEnv(f"no env registered as {id!r}{hint} (see simkit.env_ids())") from None


def make(id: str, **kwargs: Any) -> Any:
    """Builds the env registered as ``id`` (no wrappers: simkit envs own their contract;
    ``gym:<id>`` is ``gymnasium.make(<id>)``, with Gymnasium's own wrappers)."""
    return spec(id).make(**kwargs)


def env_ids(kind: EnvKind | None = None) -> list[str]:
    """Every registered id, sorted, optionally only those of one ``kind``."""
    _load_plugins()
    return sorted(i for i, s in _REGISTRY.items() if kind is None or s.kind is kind)
