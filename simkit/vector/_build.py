"""What both vector faces build on: the envs from an id or functions, argument checks,
observation rows stacked into batches, and the plan of an array-form reset."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from simkit._seeding import EpisodeSeeds
from simkit.errors import InvalidParameter
from simkit.randomization import resolve_overrides
from simkit.registry import make

__all__ = [
    "build_envs",
    "per_env_params",
    "positive_int",
    "gather_rows",
    "zero_row",
    "with_params",
    "check_overrides",
    "plan_env_resets",
    "check_mask",
    "homogeneous_agent_spaces",
    "no_frames",
    "no_sub_env_methods",
]


def build_envs(
    env_fns: str | Sequence[Callable[[], Any]],
    num_envs: int | None,
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
    env_kwargs: Mapping[str, Any] | None,
    extra_kwargs: Mapping[str, Any] | None = None,
) -> list[Any]:
    """The N envs of a vector: ``make(env_id, ...)`` N times, or each function called once.

    Args:
        env_fns: a registered env id, or a sequence of zero-argument env functions.
        num_envs: N; required with an id, must equal ``len(env_fns)`` otherwise.
        params: randomization overrides for envs built from an id (one mapping or N).
        env_kwargs: other constructor arguments for envs built from an id.
        extra_kwargs: constructor arguments the vector adds, over ``env_kwargs``.

    Raises:
        TypeError, ValueError: an argument that does not fit (named, with the value).
    """
    if isinstance(env_fns, str):
        if num_envs is None:
            raise TypeError("num_envs is required when building envs from an id")
        n = positive_int(num_envs, "num_envs")
        kwargs = {**dict(env_kwargs or {}), **dict(extra_kwargs or {})}
        return [
            make(env_fns, **kwargs, **({"params": p} if p is not None else {}))
            for p in per_env_params(params, n)
        ]
    if isinstance(env_fns, Sequence):
        if params is not None or env_kwargs is not None:
            raise ValueError(
                "params and env_kwargs apply to envs built from an id; with env_fns, "
                "pass them inside the functions"
            )
        if not env_fns:
            raise ValueError("env_fns must hold at least one function, got none")
        if num_envs is not None and num_envs != len(env_fns):
            raise ValueError(f"num_envs={num_envs} but {len(env_fns)} env_fns were given")
        return [fn() for fn in cast(Sequence[Callable[[], Any]], env_fns)]
    raise TypeError(
        f"env_fns must be an env id or a sequence of env functions, got {type(env_fns).__name__}"
    )


def per_env_params(
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, n: int
) -> list[Mapping[str, Any] | None]:
    """``params`` as one entry per env: one mapping for all, or a list of N (or ``None``)."""
    if params is None:
        return [None] * n
    if isinstance(params, Mapping):
        return [params] * n
    if isinstance(params, Sequence) and not isinstance(params, str):
        if len(params) != n:
            raise ValueError(
                f"params must be one mapping or a list of {n} mappings, got {len(params)}"
            )
        for i, p in enumerate(params):
            if p is not None and not isinstance(p, Mapping):
                raise TypeError(f"params[{i}] must be a mapping or None, got {type(p).__name__}")
        return list(params)
    raise TypeError(f"params must be a mapping or a list of mappings, got {type(params).__name__}")


def positive_int(value: Any, name: str) -> int:
    """``value`` as an int >= 1; the error names ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


_LEAF = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def gather_rows(space: spaces.Space[Any], rows: list[Any]) -> Any:
    """Observations ``rows`` of ``space`` stacked into one batch of ``batch_space(space, n)``.

    What ``gymnasium.vector.utils.concatenate`` builds (the same values and dtype), with
    a direct path for array spaces.
    """
    if isinstance(space, _LEAF):
        shape: tuple[int, ...] = space.shape or ()
        out = np.empty((len(rows), *shape), dtype=space.dtype)
        if len(rows) == 1:
            out[0] = rows[0]
            return out
        return np.stack(rows, axis=0, out=out)
    empty: Any = create_empty_array(space, len(rows), np.zeros)
    return concatenate(space, rows, empty)


def zero_row(space: Any) -> Any:
    """The all-zeros observation of ``space`` (any space the codec carries), for absent agents."""
    return next(iter(iterate(batch_space(space, 1), create_empty_array(space, 1, np.zeros))))


def with_params(
    options: Mapping[str, Any] | None, params: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Reset options with one env's randomization overrides merged over ``options["params"]``.

    Raises:
        InvalidParameter: ``options["params"]`` is given but not a mapping (overrides are
            merged by name, so a list or a str has no meaning here).
    """
    shared = None if options is None else options.get("params")
    if shared is not None and not isinstance(shared, Mapping):
        raise InvalidParameter(
            "options['params'] must be a mapping of parameter name to value (per-env "
            f"overrides go in params), got {type(shared).__name__} {shared!r:.80}"
        )
    if not params:
        return None if options is None else dict(options)
    opts = dict(options or {})
    opts["params"] = {**dict(shared or {}), **dict(params)}
    return opts


def check_overrides(env: Any, options: Mapping[str, Any] | None) -> None:
    """Checks the randomization overrides of one env's reset ``options`` against the
    parameters the env declares, changing nothing.

    The check is :func:`simkit.randomization.resolve_overrides`, the one the env's own
    reset applies, run before any env of a request moves or any seed is planned, so a
    refused override leaves every env and the seeding as they were. Envs that declare
    no ``randomization`` mapping (Gymnasium's) are left to their own reset.

    Raises:
        InvalidParameter: an unknown parameter, or a value outside its declared domain.
    """
    overrides = None if options is None else options.get("params")
    declared = getattr(getattr(env, "unwrapped", env), "randomization", None)
    if overrides and isinstance(declared, Mapping):
        resolve_overrides(declared, overrides)


def plan_env_resets(
    seeding: EpisodeSeeds,
    env_ids: np.ndarray,
    *,
    seed: int | None,
    seeds: Sequence[int] | None,
    options: Mapping[str, Any] | None,
    params: Sequence[Mapping[str, Any] | None] | None,
    envs: Sequence[Any],
) -> list[tuple[int, int | None, dict[str, Any] | None]]:
    """What a ``reset_envs`` call does to each env, in order: ``(env, seed, options)``.

    The options are ``options`` with ``params[k]`` merged over ``options["params"]``
    (:func:`with_params`), each env's checked against what it declares
    (:func:`check_overrides`) before anything is planned; then the seeds come from
    ``seeding`` (which advances its counters): a root ``seed``, explicit ``seeds`` or
    neither (:meth:`EpisodeSeeds.plan_reset`).

    Raises:
        ValueError: ``seed`` with ``seeds``, or ``seeds``/``params`` not one entry per id;
            nothing changed.
        InvalidParameter: an override of some env does not fit it; nothing changed.
    """
    ids = env_ids.tolist()
    if seed is not None and seeds is not None:
        raise ValueError(
            "pass seed (a root for these envs) or seeds (one per env id), not both; "
            f"got seed={seed!r} and seeds"
        )
    for name, given in (("seeds", seeds), ("params", params)):
        if given is None:
            continue
        sized = isinstance(given, Sequence | np.ndarray) and not isinstance(given, str | bytes)
        if not sized or len(given) != len(ids):
            got = len(given) if sized else type(given).__name__
            raise ValueError(
                f"{name} must be a sequence of {len(ids)} entries, one per env id, got {got}"
            )
    for k, entry in enumerate(params or ()):
        if entry is not None and not isinstance(entry, Mapping):
            raise ValueError(
                f"params[{k}] must be a mapping of parameter name to value, or None, "
                f"got {type(entry).__name__}"
            )
    opts = [with_params(options, None if params is None else params[k]) for k in range(len(ids))]
    for i, env_opts in zip(ids, opts, strict=True):
        check_overrides(envs[i], env_opts)
    planned = seeding.plan_reset(env_ids, seed=seed, seeds=seeds)
    return list(zip(ids, planned, opts, strict=True))


def check_mask(mask: Any, n: int) -> np.ndarray:
    """Gymnasium's ``options["reset_mask"]``: a ``(n,)`` bool array selecting some env."""
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (n,):
        got = f"{mask.dtype} {mask.shape}" if isinstance(mask, np.ndarray) else type(mask).__name__
        raise ValueError(f"options['reset_mask'] must be a bool array of shape ({n},), got {got}")
    if not mask.any():
        raise ValueError("options['reset_mask'] must select at least one env")
    return mask


def homogeneous_agent_spaces(envs: Sequence[Any], who: str) -> tuple[Any, Any]:
    """The one observation and action space every agent of every env shares.

    Args:
        envs: parallel multi-agent envs; the first one's ``possible_agents`` is the rule.
        who: what needs it, opening the error message (``"MultiAgentVectorEnv needs"``).

    Raises:
        ValueError: an env has other ``possible_agents``, or an agent other spaces.
    """
    agents = list(envs[0].possible_agents)
    obs_space = envs[0].observation_space(agents[0])
    act_space = envs[0].action_space(agents[0])
    for i, env in enumerate(envs):
        if list(env.possible_agents) != agents:
            raise ValueError(
                f"every env must have possible_agents {agents}, "
                f"env {i} has {list(env.possible_agents)}"
            )
        for agent in agents:
            obs, act = env.observation_space(agent), env.action_space(agent)
            if obs != obs_space or act != act_space:
                raise ValueError(
                    f"{who} homogeneous agents: every agent must share observation space "
                    f"{obs_space} and action space {act_space}; env {i} agent {agent!r} "
                    f"has {obs} and {act}"
                )
    return obs_space, act_space


_NO_SUB_ENVS = {
    "remote": "its envs live in rollout servers, and a client must not choose code for a "
    "server to run (a server runs only its env's reset, step and snapshots); read values "
    "from infos, or use a local simkit.vector.VectorEnv",
    "batch": "a BatchEnv is one env over N instances, not N sub-envs (as Gymnasium's own "
    "batched vector envs, e.g. CartPoleVectorEnv): read or set the attribute on it",
}


def no_sub_env_methods(kind: str) -> tuple[Any, Any, Any]:
    """``call``, ``get_attr`` and ``set_attr`` of a vector (``kind``: ``"remote"`` or
    ``"batch"``) that lacks ``SyncVectorEnv``'s methods on purpose: reading one raises
    ``AttributeError`` naming the class and saying why, so ``hasattr`` stays False as
    for any vector without them."""

    def refuse(name: str) -> Any:
        def get(self: Any) -> Any:
            raise AttributeError(f"{type(self).__name__} has no {name}(): {_NO_SUB_ENVS[kind]}")

        return property(get)

    return refuse("call"), refuse("get_attr"), refuse("set_attr")


def no_frames(self: Any) -> Any:
    """``render`` of a :class:`~simkit.clients.RemoteVectorEnv`: the wire carries no
    frames, so it says where to get them instead of Gymnasium's bare refusal."""
    raise NotImplementedError(
        f"{type(self).__name__} does not render: the wire carries no frames; record on the "
        "server (simkit serve --record) and render an episode with simkit replay --render, "
        "or render a local simkit.vector.VectorEnv"
    )
