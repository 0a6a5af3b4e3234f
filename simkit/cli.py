"""The ``simkit`` command line: ``list``, ``check``, ``demo`` (later verbs register here).

A subcommand is a :class:`Command`: a name, a help line, a function adding its
arguments to an ``argparse`` parser and a function running it. Adding a verb is one
:func:`add_command` call (or an entry in ``COMMANDS``), so other modules can plug in.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import simkit
from simkit._limits import ENV_BYTES, Range, check_env_id, check_memory, check_ranges
from simkit._seeding import MAX_ROOT_SEED
from simkit.recording import _cli as recording_cli
from simkit.registry import EnvKind

__all__ = ["Command", "COMMANDS", "add_command", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    """One subcommand: ``configure(parser)`` adds arguments, ``run(args)`` returns the exit code."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def add_command(command: Command) -> Command:
    """Registers a subcommand.

    Raises:
        ValueError: a subcommand with this name already exists.
    """
    if command.name in COMMANDS:
        raise ValueError(f"subcommand {command.name!r} is already registered")
    COMMANDS[command.name] = command
    return command


def _checkable_ids() -> list[str]:
    return [i for i in simkit.env_ids() if simkit.spec(i).kind is not EnvKind.BATCH]


def _list_configure(parser: argparse.ArgumentParser) -> None:
    del parser


def _list_run(args: argparse.Namespace) -> int:
    del args
    ids = simkit.env_ids()
    width = max((len(i) for i in ids), default=2)
    print(f"{'id':<{width}}  {'kind':<11}  description")
    for env_id in ids:
        spec = simkit.spec(env_id)
        print(f"{env_id:<{width}}  {spec.kind.value:<11}  {spec.description}")
    return 0


def _check_configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "env_id", help="a registered env id (see `simkit list`) or package.module:Class"
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    parser.add_argument("--steps", type=int, default=200, help="steps per trajectory")
    parser.add_argument(
        "--deep", action="store_true", help="5x the steps and more seeds (slower, more thorough)"
    )
    parser.add_argument(
        "--num-envs",
        type=int,
        default=4,
        help="batch envs only: instances per batch (default 4)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="batch envs only: check the torch batch on this device (cpu, cuda); "
        "check_batch_device compares it with the CPU",
    )


def _run_checks(env_id: str, seed: int, steps: int) -> list[tuple[str, str | None]]:
    from simkit import testing

    return [
        (r.name, r.message or None)
        for r in testing.run_checks(testing.CHECKS, env_id, seed=seed, steps=steps)
    ]


MAX_CHECK_STEPS = 1_000_000
"""The longest trajectory ``simkit check --steps`` (and ``demo --check-steps``) asks of
the kit: it keeps every step of its trajectories to compare them (``--steps 10**8`` grew
by gigabytes)."""
MAX_DEMO_STEPS = 10_000_000
_ROW_STEP_BYTES = 256
"""The least a kit trajectory keeps per env row and step (observation, action, reward,
flags and their containers), times the trajectories it compares."""


def _check_sizes(args: argparse.Namespace, num_envs: int = 1, *, batch: bool = False) -> None:
    """``check``'s (and ``demo``'s) seed and step counts in range (a batch env's kit
    compares at least two steps), and the kit's trajectories of ``num_envs`` rows within
    the memory available.

    Raises:
        ValueError: one line naming the flag.
    """
    steps: int = args.steps if args.command == "check" else args.check_steps
    flag = "--steps" if args.command == "check" else "--check-steps"
    least = 2 if batch and not getattr(args, "deep", False) else 1
    rules = [
        (Range("--seed", 0, MAX_ROOT_SEED), args.seed),
        (Range(flag, least, MAX_CHECK_STEPS), steps),
    ]
    if args.command == "demo":
        rules += [
            (Range("--steps", 1, MAX_DEMO_STEPS), args.steps),
            (Range("--remote-num-envs", 1), args.remote_num_envs),
        ]
        num_envs = max(num_envs, args.remote_num_envs)
    check_ranges(rules)
    deep = 5 if getattr(args, "deep", False) else 1
    check_memory(
        num_envs * (ENV_BYTES + steps * deep * _ROW_STEP_BYTES * 4),
        f"{num_envs:,} env(s) x {flag} {steps:,}{' x 5 (--deep)' if deep > 1 else ''} "
        "(the trajectories the kit compares)",
        "fewer steps or envs",
    )


def _check_run(args: argparse.Namespace) -> int:
    from simkit import testing

    try:
        batch = simkit.spec(args.env_id).kind is EnvKind.BATCH
        _check_sizes(args, args.num_envs if batch and args.num_envs >= 1 else 1, batch=batch)
        if batch and args.device is not None:
            from simkit.clients.learners._args import resolve_device

            args.device = str(resolve_device(args.device))
    except ValueError as exc:
        print(f"simkit check: {exc}", file=sys.stderr)
        return 2
    steps = args.steps * (5 if args.deep else 1)
    if simkit.spec(args.env_id).kind is EnvKind.BATCH:
        if args.num_envs < 1:
            print(f"simkit check: --num-envs must be >= 1, got {args.num_envs}", file=sys.stderr)
            return 2
        checks, options = (
            testing.BATCH_CHECKS,
            {"num_envs": args.num_envs, "device": args.device},
        )
    elif args.device is not None or args.num_envs != 4:
        print(
            f"simkit check: --num-envs and --device apply to batch envs; {args.env_id} is "
            f"a {simkit.spec(args.env_id).kind.value} env",
            file=sys.stderr,
        )
        return 2
    else:
        checks, options = testing.CHECKS, {}
    results = testing.run_checks(checks, args.env_id, seed=args.seed, steps=steps, **options)
    for result in results:
        print(result.line())
    failed = [r.name for r in results if r.status == "FAIL"]
    if failed:
        print(f"{len(failed)} of {len(results)} checks failed; fix {failed[0]} first")
    return 1 if failed else 0


def _demo_configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=1000, help="random-action rollout length")
    parser.add_argument("--check-steps", type=int, default=100, help="steps per kit trajectory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--remote-env",
        default="simkit/Cheetah-v0",
        help="env served locally for the remote part (default simkit/Cheetah-v0)",
    )
    parser.add_argument(
        "--remote-num-envs", type=int, default=64, help="envs in the remote vector (default 64)"
    )
    parser.add_argument(
        "--no-remote", action="store_true", help="skip the local server + client part"
    )


def _rollout(env_id: str, steps: int, seed: int) -> tuple[float, float]:
    """Random-action rollout; returns (steps per second, mean return of finished episodes)."""
    from simkit.testing._driver import Driver

    env = simkit.make(env_id)
    driver = Driver(env, seed)
    returns: list[float] = []
    episode = 0.0
    driver.reset(seed)
    start = time.perf_counter()
    for _ in range(steps):
        step = driver.step(driver.action())
        reward = step.reward
        episode += sum(reward.values()) if isinstance(reward, dict) else float(reward)
        if step.ended:
            returns.append(episode)
            episode = 0.0
            driver.reset()
    elapsed = time.perf_counter() - start
    env.close()
    import numpy as np

    mean = float(np.mean(returns)) if returns else episode
    return steps / elapsed, mean


def _demo_run(args: argparse.Namespace) -> int:
    try:
        _check_sizes(args)
    except ValueError as exc:
        print(f"simkit demo: {exc}", file=sys.stderr)
        return 2
    rows = []
    failed = False
    for env_id in _checkable_ids():
        results = _run_checks(env_id, args.seed, args.check_steps)
        errors = [f"{n}: {e}" for n, e in results if e is not None]
        failed = failed or bool(errors)
        try:
            rate, mean = _rollout(env_id, args.steps, args.seed)
            figures = (f"{rate:,.0f}", f"{mean:.2f}")
        except Exception as exc:  # one broken env must not hide the others' results
            errors.append(f"rollout: the env raised {type(exc).__name__}: {exc}")
            figures = ("-", "-")
        kind = simkit.spec(env_id).kind.value
        verdict = "PASS" if not errors else "FAIL"
        rows.append(
            (env_id, kind, f"{verdict} {len(results) - len(errors)}/{len(results)}", *figures)
        )
        for error in errors:
            print(f"{env_id}: {error}", file=sys.stderr)
    header = ("env id", "kind", "checks", "steps/s", "mean return")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print(f"(rollout: {args.steps} random-action steps per env, seed {args.seed})")
    if not args.no_remote:
        from simkit.clients import remote_demo

        print("\nLocal rollout server + RemoteVectorEnv client:")
        remote = remote_demo(args.remote_env, num_envs=args.remote_num_envs, seed=args.seed)
        print(remote.table())
        failed = failed or not remote.identical
    return 1 if failed else 0


def _serve_configure(parser: argparse.ArgumentParser) -> None:
    from simkit.servers import add_serve_arguments

    add_serve_arguments(parser)


def _serve_run(args: argparse.Namespace) -> int:
    from simkit.servers import run_serve

    return run_serve(args)


add_command(
    Command("list", "list registered envs (id, kind, description)", _list_configure, _list_run)
)
add_command(
    Command("check", "run the conformance kit on a registered env", _check_configure, _check_run)
)
add_command(
    Command(
        "demo",
        "check and roll out every registered non-batch env, then step one through a local server",
        _demo_configure,
        _demo_run,
    )
)
add_command(
    Command("serve", "serve an env over ZeroMQ (see docs/server.md)", _serve_configure, _serve_run)
)

for _name, _help, _configure, _run in recording_cli.COMMANDS:
    add_command(Command(_name, _help, _configure, _run))


def _train_configure(parser: argparse.ArgumentParser) -> None:
    from simkit.clients.learners._train_cli import add_train_arguments

    add_train_arguments(parser)


def _train_run(args: argparse.Namespace) -> int:
    from simkit.clients.learners._train_cli import run_train

    return run_train(args)


def _eval_configure(parser: argparse.ArgumentParser) -> None:
    from simkit.clients.learners._train_cli import add_eval_arguments

    add_eval_arguments(parser)


def _eval_run(args: argparse.Namespace) -> int:
    from simkit.clients.learners._train_cli import run_eval

    return run_eval(args)


add_command(
    Command(
        "train",
        "train a policy (PPO, or SAC with --algo sac), with checkpoints and TensorBoard logs "
        "(see docs/training.md)",
        _train_configure,
        _train_run,
    )
)
add_command(
    Command(
        "eval",
        "run a trained policy deterministically and print its mean return",
        _eval_configure,
        _eval_run,
    )
)


class _Defaults(argparse.HelpFormatter):
    """Shows every option's default in ``--help`` where its help does not already say
    it (a ``None`` default means "not given" and is left out)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" not in text and _shows_default(action):
            text += " (default: %(default)s)"
        return text


def _shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` states the option's default (flags: their presence is the
    value; ``None``: "not given")."""
    return (
        bool(action.option_strings)
        and action.default not in (None, argparse.SUPPRESS)
        and action.nargs != 0
    )


def build_parser(verbs: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand; only ``verbs``, where
    given, get their arguments (the others keep their name and help line), as a verb's
    arguments may import what it runs (the learner, the server)."""
    parser = argparse.ArgumentParser(prog="simkit", description=simkit.__doc__)
    parser.add_argument("--version", action="version", version=f"simkit {simkit.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS.values():
        verb = sub.add_parser(
            command.name, help=command.help, description=command.help, formatter_class=_Defaults
        )
        if verbs is not None and command.name not in verbs:
            continue
        command.configure(verb)
        for action in verb._actions:  # argparse formats no help-less option: give it one
            if action.help is None and action.option_strings and _shows_default(action):
                action.help = "(default: %(default)s)"
        verb.usage = _usage(verb)
    return parser


def _usage(verb: argparse.ArgumentParser) -> str:
    """The one-line usage of a verb (its options are in ``--help``): ``simkit train
    [options] ENV_ID`` instead of argparse's every option, 37 lines for ``train``."""
    positionals = [
        str(a.metavar or a.dest).upper()
        for a in verb._actions
        if not a.option_strings and a.help != argparse.SUPPRESS
    ]
    return " ".join([verb.prog, "[options]", *positionals])


def _unrecognized(verb: argparse.ArgumentParser, extras: list[str]) -> str:
    """The error for arguments ``verb`` does not know, naming the closest flag of the
    first unknown one (``--num-evns``: ``did you mean --num-envs?``)."""
    import difflib

    message = f"unrecognized arguments: {' '.join(extras)}"
    unknown = next((e.split("=", 1)[0] for e in extras if e.startswith("--")), None)
    if unknown is not None:
        flags = [f for a in verb._actions for f in a.option_strings if f.startswith("--")]
        close = difflib.get_close_matches(unknown, flags, n=1, cutoff=0.6)
        if close:
            message += f" (did you mean {close[0]}?)"
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simkit`` console script; returns the exit status.

    The working directory is importable, as with ``python -m``, so ``simkit train
    mypkg.envs:MyEnv`` finds an unpackaged env next to the user."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        words = sys.argv[1:] if argv is None else list(argv)
        parser = build_parser(words[:1])  # the verb comes first: only its arguments
        if not words:
            parser.print_help()  # `simkit` alone: the commands, not "COMMAND is required"
            return 2
        args, extras = parser.parse_known_args(argv)
        if extras:
            verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            verb = verbs.choices[args.command]
            verb.error(_unrecognized(verb, extras))
        env_id = getattr(args, "env_id", None)
        if isinstance(env_id, str):
            try:
                check_env_id(env_id)
            except ValueError as exc:
                print(f"simkit {args.command}: {exc}", file=sys.stderr)
                return 2
        return COMMANDS[args.command].run(args)
    except simkit.errors.UnknownEnv as exc:
        print(f"simkit: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback (130: killed by SIGINT)
        words = sys.argv[1:] if argv is None else list(argv)
        name = next((w for w in words if w in COMMANDS), None)
        # A run handles SIGINT itself once training runs (a checkpoint, exit 0): one that
        # gets here was loading, so it says what docs/training.md says.
        what = "interrupted before training started" if name == "train" else "interrupted"
        print(f"simkit{'' if name is None else ' ' + name}: {what}", file=sys.stderr)
        return 130
    except simkit.errors.RenderUnavailable as exc:  # e.g. MUJOCO_GL names a missing backend
        print(f"simkit: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # what the file system refused (a name too long, no permission)
        words = sys.argv[1:] if argv is None else list(argv)
        name = next((w for w in words if w in COMMANDS), None)
        print(f"simkit{'' if name is None else ' ' + name}: {_os_error(exc)}", file=sys.stderr)
        return 1


def _os_error(exc: OSError) -> str:
    """An ``OSError`` in one line: the file (cut to 200 characters), then the reason with
    its errno's name (``File name too long (ENAMETOOLONG)``)."""
    from simkit.errors import WriteFailed

    if isinstance(exc, WriteFailed) or exc.filename is None:
        return str(exc)
    name = str(exc.filename)
    return f"{name[:200] + '...' if len(name) > 200 else name}: {WriteFailed.reason(exc)}"


if __name__ == "__main__":
    raise SystemExit(main())
