"""The ``hybridflow`` command line.

Each sub-command lives in its own module, which defines ``add_arguments(parser)``
and ``run(args) -> int``; this file only names them, so that ``hybridflow --help``
stays fast and a command's heavy imports happen only when it runs.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .errors import HybridflowError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "viz": ("hybridflow.commands.viz", "draw an algorithm graph, a compiled plan, or a run's trace"),
    "compile": ("hybridflow.commands.compile", "compile a run file (the plan 'run' would run) or an algorithm for a cluster into an ExecutionPlan"),
    "profile": ("hybridflow.commands.profile", "measure a model on this machine and fit the cost model's factors to it"),
    "simulate": ("hybridflow.commands.simulate", "predicted iteration time per cluster size: colocate, split, standalone, auto"),
    "quickstart": ("hybridflow.trainer.quickstart", "the seed article's minimal PPO on a tiny model, on CPU, in minutes"),
    "run": ("hybridflow.trainer.run_command", "train as a YAML run file says: run CONFIG.yaml [key=value ...]"),
    "export": ("hybridflow.trainer.export", "write a checkpoint's policy as a transformers model folder"),
    "explain": ("hybridflow.commands.explain", "a finished run's step: predicted vs measured per op, critical path, cost-model errors"),
    "diff": ("hybridflow.commands.diff", "two runs compared: config, graph, plan, environment, and the first value that differs"),
    "trajectories": ("hybridflow.commands.trajectories", "print a run's logged multi-turn trajectories readably"),
}


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="hybridflow", description="RL post-training as a dataflow-graph compiler and executor.")
    parser.add_argument("--version", action="version", version=f"hybridflow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        command_parser.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(command_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command in this process; its exit status (130 after a Ctrl-C that stopped it at once)."""
    return _main(argv)[0]


def program() -> None:
    """The ``hybridflow`` program (its console script and ``python -m hybridflow.cli``).

    After a stop at once (a Ctrl-C during start-up, or a second one) it ends the process with ``os._exit(130)``
    once the output is flushed and the ``atexit`` hooks (Ray's shutdown among them) have run. The
    KeyboardInterrupt can land anywhere in a library's code, and two things then go wrong on a normal exit:
    a thread pool interrupted while starting a thread leaves a thread that interpreter shutdown joins for ever
    (seen in transformers' weight loading), and an interrupt raised inside ``exec`` of a string (dataclasses
    build their methods that way) makes CPython end the process by SIGINT instead of with the status returned.
    """
    status, stopped_at_once = _main(None)
    if stopped_at_once:
        import atexit
        import logging
        import os

        logging.shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def _main(argv: list[str] | None) -> tuple[int, bool]:
    """(exit status, whether a KeyboardInterrupt stopped the command at once)."""
    command = "COMMAND"
    try:
        parser = build_parser()  # imports every command's module: a Ctrl-C can land here too
        args = _parse(parser, argv)
        if not getattr(args, "_module", None):
            parser.print_help()
            return 2, False
        command = args.command
        return int(importlib.import_module(args._module).run(args) or 0), False
    except HybridflowError as err:
        print(f"hybridflow {command}: error: {err}", file=sys.stderr)
        return 1, False
    except OSError as err:  # a file the command reads or writes that no project error names yet
        print(f"hybridflow {command}: error: {_describe_os_error(err)}", file=sys.stderr)
        return 1, False
    except KeyboardInterrupt:  # a Ctrl-C during start-up, or a second one (the first lets a run finish its step)
        hint = (" -- checkpoints are complete or absent; rerun with resume=auto to continue from the newest"
                if command in ("run", "quickstart") else "")
        print(f"hybridflow {command}: interrupted, stopped at once{hint}", file=sys.stderr)
        return 130, True


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, letting ``key=value`` overrides come after options too (``run CONFIG --import MOD k=v``), as they may
    before them: argparse stops filling a ``nargs='*'`` positional once an option has been seen."""
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _describe_os_error(err: OSError) -> str:
    """``FILE: reason`` (and the second file of a rename or copy) without a traceback."""
    files = " -> ".join(str(f) for f in (err.filename, err.filename2) if f is not None)
    reason = err.strerror or str(err)
    return f"{files}: {reason}" if files else reason


if __name__ == "__main__":
    program()
