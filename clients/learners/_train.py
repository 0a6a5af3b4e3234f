"""A training run from keywords: :func:`plan` and :func:`execute`, the two halves of the
one entry point :func:`simkit.train` (``simkit train`` calls them with its parsed
flags, re-executing itself pinned between them for ``--reproducible``).

Every ``simkit train`` flag is a keyword of the same name (``--checkpoint-every`` is
``checkpoint_every``, ``--env-kwarg`` is ``env_kwargs``, ``--no-progress`` is
``progress=False``); the algorithm's settings (:class:`PPOArgs`, :class:`SACArgs`) are
keywords too. :func:`plan` resolves and checks them all before anything starts (a
misspelt keyword names the nearest one); :func:`execute` runs the plan: a
:class:`~simkit.clients.learners._run.Run` handed to the algorithm's ``learn``.
Messages are worded for the command line (``--num-envs``); :func:`simkit.train`
rewords them.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simkit._kernels import why_bits_may_differ
from simkit._limits import Range, check_memory, check_ranges, max_threads
from simkit.clients.learners._args import PPOArgs, RunOptions, SACArgs, capped, flag
from simkit.clients.learners._checkpoint import (
    Checkpoint,
    checkpoint_algo,
    checkpoint_args,
    load_checkpoint,
)
from simkit.clients.learners._logdir import resumed_logdir
from simkit.clients.learners._run import Run, TrainResult, learner_of

__all__ = ["KINDS", "Plan", "execute", "plan", "resumed_kernels"]

SERVER_BYTES = 256 << 20
"""About what one local ``simkit serve --policy`` process takes (torch loaded):
``servers=N`` needs N times it free."""
MAX_RAY_SERVERS = 4096
"""The most ``servers`` on Ray (or ``connect`` endpoints): a cluster's, not this
machine's, memory holds them."""


_OPTIONS = {f.name for f in dataclasses.fields(RunOptions)}
_SETTINGS = {
    cls: {f.name for f in dataclasses.fields(cls)} - {"env_id"} for cls in (PPOArgs, SACArgs)
}
_SAC_ONLY = sorted(_SETTINGS[SACArgs] - _SETTINGS[PPOArgs])
_PPO_ONLY = sorted(_SETTINGS[PPOArgs] - _SETTINGS[SACArgs])


@dataclass
class Plan:
    """A checked run (:func:`plan`): its settings, its options (``logdir`` resolved) and
    the checkpoint it resumes, loaded once (the run takes it as it is)."""

    settings: PPOArgs | SACArgs
    options: RunOptions
    given: list[str] = field(default_factory=list)
    """The settings the caller set (on resume only those are compared, SAC)."""
    checkpoint: Checkpoint | None = None

    @property
    def algo(self) -> str:
        """``"ppo"`` or ``"sac"``."""
        return "sac" if isinstance(self.settings, SACArgs) else "ppo"

    @property
    def logdir(self) -> Path:
        """The run's log directory."""
        return Path(self.options.logdir or ".")

    @property
    def kernels(self) -> dict[str, Any] | None:
        """The kernels the resumed checkpoint was trained under (None: a new run, or a
        checkpoint from before they were kept)."""
        return None if self.checkpoint is None else self.checkpoint.state.get("kernels")


def _an_int(value: Any) -> Any:
    """``value`` as an ``int`` (a whole float too: ``1e6`` is how people write a million);
    :data:`_WRONG` where it is no integer (a bool neither).

    Raises:
        ValueError: a float that is not a whole number.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not float(value).is_integer():
            raise ValueError(f"must be a whole number, got {value}")
        return int(value)
    return _WRONG


def _a_float(value: Any) -> Any:
    """``value`` as a ``float`` (an int too, not a bool); :data:`_WRONG` otherwise."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    return _WRONG


def _ints(value: Any) -> Any:
    """``value`` (a list or tuple of ints) as a tuple of ints; :data:`_WRONG` otherwise."""
    if not isinstance(value, (list, tuple)):
        return _WRONG
    items = [_an_int(v) for v in value]
    bad = next((v for v, item in zip(value, items, strict=True) if item is _WRONG), _WRONG)
    return tuple(items) if bad is _WRONG else _Item(bad)


def _strs(value: Any) -> Any:
    """``value`` (one str, or a list or tuple of them) as a list of strs; :data:`_WRONG`
    otherwise."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)):
        return _WRONG
    bad = next((v for v in value if not isinstance(v, str)), _WRONG)
    return list(value) if bad is _WRONG else _Item(bad)


def _str_keys(value: Any) -> Any:
    """``value`` (a mapping with str keys) as a dict; :data:`_WRONG` otherwise."""
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return dict(value)
    return _WRONG


class _Item:
    """A sequence of the wrong items: the first wrong one."""

    def __init__(self, item: Any) -> None:
        self.item = item


_WRONG: Any = object()
"""What a value of the wrong type is taken as (:data:`KINDS`)."""

KINDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "int": ("an int", _an_int),
    "float": ("a number", _a_float),
    "bool": ("True or False", lambda v: bool(v) if isinstance(v, (bool, np.bool_)) else _WRONG),
    "str": ("a str", lambda v: v if isinstance(v, str) else _WRONG),
    "Path": ("an os.PathLike", lambda v: v if isinstance(v, os.PathLike) else _WRONG),
    "None": ("None", lambda v: v if v is None else _WRONG),
    "tuple[int, ...]": ("a sequence of ints", _ints),
    "Sequence[str]": ("a str or a sequence of strs", _strs),
    "dict[str, Any]": ("a dict with str keys", _str_keys),
}
"""Each type a field of :class:`PPOArgs`, :class:`SACArgs` or :class:`RunOptions` is
annotated with (``int | None``: either), in the words of its refusal, and what takes a
value as it (normalised: ``1e6`` an ``int``, ``[64, 64]`` a tuple, one endpoint a list),
or :data:`_WRONG`."""


def _check_types(obj: PPOArgs | SACArgs | RunOptions) -> None:
    """Checks every field of ``obj`` against its annotated type (:data:`KINDS`), in
    place, normalising it: ints are no bools nor strs, floats take ints, a sequence is
    no scalar, ``connect`` takes one endpoint as a list of one.

    Raises:
        TypeError: ``"--<field> must be <kinds>, got <value> (<type>)"``.
        ValueError: a float that is not a whole number for an integer field.
    """
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        kinds = [k.strip() for k in str(f.type).split("|")]
        taken: Any = _WRONG
        try:
            for kind in kinds:
                taken = KINDS[kind][1](value)
                if taken is not _WRONG and not isinstance(taken, _Item):
                    break
        except ValueError as exc:
            raise ValueError(f"{flag(f.name)} {exc}") from None
        if taken is not _WRONG and not isinstance(taken, _Item):
            setattr(obj, f.name, taken)
            continue
        words = [KINDS[k][0] for k in kinds]
        want = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
        came = f"{_shown(value)} ({type(value).__name__})"
        if isinstance(taken, _Item):
            came = f"{_shown(taken.item)} ({type(taken.item).__name__}) in {_shown(value)}"
        raise TypeError(f"{flag(f.name)} must be {want}, got {came}")


def _shown(value: Any) -> str:
    """``repr(value)``, at most 100 characters."""
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


def _split(keywords: dict[str, Any], cls: type[PPOArgs] | type[SACArgs]) -> dict[str, Any]:
    """The settings among ``keywords`` (the rest are :class:`RunOptions`).

    Raises:
        TypeError: a keyword that is neither, with the nearest names.
    """
    known = _OPTIONS | _SETTINGS[PPOArgs] | _SETTINGS[SACArgs]
    algo = "sac" if cls is SACArgs else "ppo"
    for name in keywords:
        if name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            expected = sorted(_OPTIONS | _SETTINGS[cls])
            raise TypeError(
                f"unknown setting {name!r} for --algo {algo}{hint} (expected one of {expected})"
            )
    other = _PPO_ONLY if cls is SACArgs else _SAC_ONLY
    wrong = [flag(n) for n in other if keywords.get(n) is not None]
    if cls is PPOArgs:
        wrong += [flag(n) for n in ("buffer_from", "metrics_port") if keywords.get(n) is not None]
    if wrong:
        other_algo = "ppo" if cls is SACArgs else "sac"
        raise ValueError(
            f"{', '.join(wrong)}: --algo {other_algo} options, this run is --algo {algo}"
        )
    return {k: v for k, v in keywords.items() if k in _SETTINGS[cls] and v is not None}


def plan(env: str | PPOArgs | SACArgs, /, **keywords: Any) -> Plan:
    """The checked run that :func:`train` would start: ``env`` (an env id, or settings
    whose fields the keywords override) and :class:`RunOptions` / settings keywords.
    Reads a ``resume`` checkpoint; starts nothing.

    Raises:
        TypeError: an unknown keyword (the nearest named), a value of the wrong type
            (the field's annotated type, :data:`KINDS`).
        ValueError: a value out of range, options of the other algorithm, a checkpoint
            of another env or algorithm, a ``record`` folder that is the log directory, a
            file or another run's recording, settings whose arrays do not fit the memory
            available, ``env_kwargs`` the env refuses, an env whose spaces the policy
            cannot take (a model or head refusing them).
        InvalidCheckpoint: ``resume`` holds no valid checkpoint.
    """
    if not isinstance(env, (str, PPOArgs, SACArgs)):
        raise TypeError(
            f"env must be an env id (str) or PPOArgs or SACArgs, got {_shown(env)} "
            f"({type(env).__name__})"
        )
    options = RunOptions(**{k: v for k, v in keywords.items() if k in _OPTIONS})
    _check_types(options)
    ckpt = None
    if options.resume is not None:  # the algorithm defaults to the checkpoint's
        ckpt = load_checkpoint(options.resume)
        saved_algo = checkpoint_algo(ckpt)
        if options.algo not in (None, saved_algo):
            raise ValueError(
                f"--resume {options.resume}: a {saved_algo} checkpoint; use --algo "
                f"{saved_algo}, or no --algo"
            )
        options.algo = saved_algo
    if not isinstance(env, str):
        options.algo = options.algo or ("sac" if isinstance(env, SACArgs) else "ppo")
    options.algo = options.algo or "ppo"
    if options.algo not in ("ppo", "sac"):
        raise ValueError(f"--algo must be 'ppo' or 'sac', got {options.algo!r}")
    cls: type[PPOArgs] | type[SACArgs] = SACArgs if options.algo == "sac" else PPOArgs
    given = _split(keywords, cls)
    if not isinstance(env, str):
        if not isinstance(env, cls):
            raise ValueError(
                f"--algo {options.algo} trains {cls.__name__}, got {type(env).__name__}"
            )
        base = env  # every field given (a resumed run compares them all), keywords over them
        given = {**{f.name: getattr(env, f.name) for f in dataclasses.fields(env)}, **given}
    else:
        base = cls(env_id=env)
        slots = (options.servers or 0) + len(options.connect)  # a slot per server at least
        if ckpt is None and "num_envs" not in given and slots > base.num_envs:
            given["num_envs"] = slots
    if ckpt is not None:
        parse: Callable[[Any], PPOArgs | SACArgs] = cls.from_plain
        saved = checkpoint_args(ckpt, parse)
        if base.env_id != saved.env_id:
            raise ValueError(
                f"--resume: the checkpoint trains {saved.env_id!r}, this run names {base.env_id!r}"
            )
        base = saved
    settings = dataclasses.replace(base, **given)
    _check_types(settings)
    if isinstance(settings, SACArgs) and isinstance(env, str) and options.buffer_from is None:
        settings.check_learning_starts()  # as asked: the cap shortens runs for the docs' tests
    settings = capped(settings)  # $SIMKIT_MAX_TOTAL_STEPS, where set
    settings.check()
    check_run_options(options, settings.num_envs)
    from simkit.clients.learners._sizes import check_run_memory

    # one env made with the run's kwargs, and what the run allocates against free memory
    in_process = not options.connect and options.ray is None and not options.servers
    check_run_memory(settings, in_process=in_process)
    _check_env(settings)
    options.logdir = _logdir(options, settings)
    _check_record(options)
    return Plan(settings, options, given=list(given), checkpoint=ckpt)


def _check_env(settings: PPOArgs | SACArgs) -> None:
    """That the algorithm's policy can act in the env (its own rules for the env's
    spaces), before anything starts.

    Raises:
        ValueError: one line naming the env and what the algorithm cannot take.
    """
    if isinstance(settings, SACArgs):
        from simkit.clients.learners._train_sac import check_env

        check_env(settings.env_id, settings.env_kwargs)
    else:
        from simkit.clients.learners.ppo import check_env as check_ppo_env

        check_ppo_env(settings)


def check_run_options(options: RunOptions, num_envs: int) -> None:
    """The run's own numeric options, checked before anything starts.

    Raises:
        ValueError: a value out of range, naming the flag, what it must be and what came.
    """
    o = options
    local_servers = MAX_RAY_SERVERS if o.ray is not None else max_threads()
    check_ranges(
        [
            (Range("--checkpoint-every", 0), o.checkpoint_every),
            (Range("--checkpoint-steps", 0), o.checkpoint_steps),
            (Range("--checkpoint-minutes", 0, 10**7), o.checkpoint_minutes),
            (Range("--print-every", 0, 10**7, low_open=True), o.print_every),
            (Range("--server-timeout", 0, 7 * 24 * 3600, low_open=True), o.server_timeout),
            (Range("--server-cpus", 0, 1 << 16), o.server_cpus),
            (Range("--server-gpus", 0, 1 << 10), o.server_gpus),
            (Range("--max-restarts", -1), o.max_restarts),
            (Range("--servers", 0, local_servers, optional=True), o.servers),
            (
                Range("--connect", 0, MAX_RAY_SERVERS, what="given at most 4096 times"),
                len(o.connect),
            ),
        ]
    )
    if (o.curve_server_key is None) != (o.curve_secret_key is None) or (
        o.curve_server_key is not None and not o.connect
    ):
        raise ValueError(
            "--curve-server-key and --curve-secret-key go together, with --connect (--ray "
            "makes its own keys), got "
            f"{'--curve-server-key' if o.curve_server_key else 'no --curve-server-key'}, "
            f"{'--curve-secret-key' if o.curve_secret_key else 'no --curve-secret-key'} and "
            f"{len(o.connect)} --connect"
        )
    if o.ray is not None and o.server_cpus == o.server_gpus == 0:
        raise ValueError("--server-cpus and --server-gpus must not both be 0, got 0 and 0")
    if o.metrics_port is not None and not 0 <= o.metrics_port < 65536:
        raise ValueError(f"--metrics-port must be a port in [0, 65535], got {o.metrics_port}")
    if o.servers and o.ray is None:
        check_memory(
            o.servers * SERVER_BYTES,
            f"--servers {o.servers} (a local process each, about {SERVER_BYTES >> 20} MiB)",
        )
    count = (o.servers or 0) + len(o.connect)
    if count > num_envs:
        raise ValueError(
            f"{count} server(s) need at least one env slot each: --num-envs must be >= "
            f"{count}, got {num_envs}"
        )


def _check_record(options: RunOptions) -> None:
    """``record``: a folder (or none yet) apart from the log directory, holding no
    recording unless the run is resumed (its episodes go on there).

    Raises:
        ValueError: naming the flag and what is wrong with the folder.
    """
    if options.record is None:
        return
    record, logdir = Path(options.record), Path(options.logdir or ".")
    if record.resolve() == logdir.resolve():  # the run's lock would hold it: use DIR/rec
        raise ValueError(f"--record {record} must not be the --logdir (use e.g. {logdir / 'rec'})")
    if record.exists() and not record.is_dir():
        raise ValueError(f"--record {record}: a file, not a folder")
    if not options.resume:  # a resumed run's episodes go on in its recording
        from simkit.recording._cli import existing_recording

        held = existing_recording(record)
        if held is not None:
            raise ValueError(
                f"--record {record} already holds a recording ({held}); choose another "
                "DIR, or --resume the run that wrote it (its episodes go on there)"
            )


def _logdir(options: RunOptions, settings: PPOArgs | SACArgs) -> Path:
    """``logdir``, the resumed run's, or ``runs/<env>[-sac]-<seed>-<time>``."""
    if options.logdir is not None:
        return Path(options.logdir)
    if options.resume is not None:
        return resumed_logdir(options.resume)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag = "-sac" if isinstance(settings, SACArgs) else ""
    name = settings.env_id.replace("/", "_").replace(":", "_")
    return Path(f"runs/{name}{tag}-{settings.seed}-{stamp}")


def resumed_kernels(plan: Plan) -> tuple[bool, str | None]:
    """Whether a resumed run goes on with ``reproducible`` (kept where the checkpoint was
    trained with it: its bits are those of the pinned kernels), and what the person should
    know about the checkpoint's kernels, in words (None: nothing)."""
    kernels, asked = plan.kernels, plan.options.reproducible
    if not isinstance(kernels, dict):
        return asked, None
    if kernels.get("reproducible"):
        if asked:
            return True, None
        return True, "the checkpoint was trained with --reproducible: kept (as if given)"
    if asked:
        return True, (
            "the checkpoint was trained without --reproducible: the kernels are pinned from "
            "here on, so the run goes on with other bits than it would have without it"
        )
    why = why_bits_may_differ(kernels)
    if why is None:
        return False, None
    return False, (
        f"the checkpoint was trained {why.removeprefix('made ')}: the continuation's bits may "
        "differ from the run's on that CPU (train with --reproducible for bits that any "
        "x86-64 CPU repeats)"
    )


def execute(plan: Plan) -> TrainResult:
    """Runs ``plan`` (its log directory claimed by the caller): the algorithm's ``learn``
    in a :class:`~simkit.clients.learners._run.Run`."""
    o = plan.options
    own: dict[str, Any] = (
        {"given": plan.given, "checkpoint_steps": o.checkpoint_steps, "buffer_from": o.buffer_from}
        if plan.algo == "sac"
        else {"checkpoint_every": o.checkpoint_every}
    )
    round_name = "round" if plan.algo == "sac" else "update"
    run = Run(o, algo=plan.algo, round_name=round_name, checkpoint=plan.checkpoint)
    learn = learner_of(plan.algo)
    return learn(run, plan.settings, checkpoint_minutes=o.checkpoint_minutes, **own)
