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
    "compile": ("hybridflow.commands.compile", "compile an algorithm for a cluster into an ExecutionPlan (placement, schedule)"),
    "profile": ("hybridflow.commands.profile", "measure a model on this machine and fit the cost model's factors to it"),
    "simulate": ("hybridflow.commands.simulate", "predicted iteration time per cluster size: colocate, split, standalone, auto"),
    "quickstart": ("hybridflow.trainer.quickstart", "the seed article's minimal PPO on a tiny model, on CPU, in minutes"),
    "run": ("hybridflow.trainer.run_command", "train as a YAML run file says: run CONFIG.yaml [key=value ...]"),
    "export": ("hybridflow.trainer.export", "write a checkpoint's policy as a transformers model folder"),
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except HybridflowError as err:
        print(f"hybridflow {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C (the first one lets a run finish its step and checkpoint)
        hint = (" -- checkpoints are complete or absent; rerun with resume=auto to continue from the newest"
                if args.command in ("run", "quickstart") else "")
        print(f"hybridflow {args.command}: interrupted, stopped at once{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
