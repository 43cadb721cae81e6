"""``hybridflow run CONFIG.yaml [key=value ...]``: train as a YAML run file says.

The file holds :class:`PPOConfig` fields and ``algorithm`` (a built-in's name,
``package.module:function`` or a graph JSON file); ``key=value`` and ``key.sub=value``
override them (see :mod:`.config_files`); ``--import MODULE`` imports a module (custom
ops) first. ``hybridflow run --fields`` lists every field with its default and
description, and the algorithm attribute each standard field sets.
"""
from __future__ import annotations

import argparse

from .interrupt import exit_code

__all__ = ["add_arguments", "run", "field_table", "stopped_status", "report_errors"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML run file (config fields and 'algorithm')")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="field overrides, e.g. max_steps=20 actor_lr=3e-4 device_map.actor=cpu algorithm=grpo")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (e.g. one that registers custom ops); repeatable; adds to 'imports'")
    parser.add_argument("--fields", action="store_true",
                        help="list the config fields (and the algorithm attribute each sets) and exit")


def field_table() -> str:
    """Every config field with its default and description; ``-> attribute`` where it sets an algorithm attribute."""
    from pydantic import BaseModel

    from ..algorithms import ALGORITHMS
    from .config import PPOConfig, field_attribute
    from .config_files import ALGORITHM_KEY

    lines = [f"{ALGORITHM_KEY}: {' | '.join(ALGORITHMS)} | package.module:function | GRAPH.json (default ppo) "
             "— the algorithm's graph",
             "A field marked '-> attr' sets that attribute of the algorithm when the field is set and the algorithm "
             "has the attribute; algorithm_args sets any attribute and wins."]
    for name, field in PPOConfig.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):  # a settings record: one line per sub-field, as overrides name them
            lines.append(f"{name}: {field.description}")
            for sub, sub_field in type(default).model_fields.items():
                lines.append(f"  {name}.{sub} (default {getattr(default, sub)!r}): {sub_field.description}")
            continue
        attribute = field_attribute(name)
        mapped = f" [-> {attribute}]" if attribute else ""
        lines.append(f"{name} (default {default!r}){mapped}: {field.description}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import time

    from ..errors import ConfigError
    from .config_files import load_run_config
    from .interrupt import StopRequest
    from .run_report import quiet_libraries, summary_lines, write_artifacts
    from .trainer import Trainer

    if args.fields:
        print(field_table())
        return 0
    if args.config is None:
        raise ConfigError("give a YAML run file: hybridflow run CONFIG.yaml [key=value ...] (see examples/configs/)")
    overrides = list(args.overrides)
    if "=" in args.config:  # no file, overrides only
        overrides, path = [args.config, *overrides], None
    else:
        path = args.config
    algorithm, config = load_run_config(path, overrides, args.imports)
    quiet_libraries()
    start = time.perf_counter()
    trainer = Trainer(config, algorithm=algorithm)
    trainer.train()
    with StopRequest("writing the trace and the summary") as late:  # a signal now must not lose them
        artifacts = write_artifacts(trainer)
        print("\n".join(summary_lines(trainer, time.perf_counter() - start, artifacts)), flush=True)
    if trainer.executor is not None:  # the workers go now, not when the trainer is collected (a main() call goes on)
        trainer.executor.shutdown()
    return stopped_status(trainer, late, "hybridflow run")


def stopped_status(trainer, late=None, command: str = "hybridflow run",
                   hint: str | None = "run it again with resume=auto to continue") -> int:
    """0, or 128 + the signal's number (with a line on stderr) when SIGINT/SIGTERM stopped the run.

    ``late`` is the StopRequest around the writing after training, if any; ``command`` starts the
    line (the example scripts give their own name), ``hint`` ends it.
    """
    import signal
    import sys

    name = trainer.stop_signal or (late.name if late is not None else None)
    if name is None:
        return 0
    saved = f"; checkpoint {trainer.last_checkpoint}" if trainer.last_checkpoint is not None else ""
    print(f"{command}: stopped by {name} after step {trainer.step} of {trainer.config.max_steps}{saved}"
          + (f" ({hint})" if hint else ""), file=sys.stderr, flush=True)
    return exit_code(signal.Signals[name])


def report_errors(command: str) -> None:
    """In a script: print hybridflow's errors as ``COMMAND: error: ...`` (exit status 1), not as a traceback.

    Installs a ``sys.excepthook`` for the rest of the script: a :class:`~hybridflow.errors.HybridflowError`
    or an ``OSError`` left uncaught prints its message on one line block; a Ctrl-C that stopped the script at
    once prints one line (and the script exits as a Ctrl-C does); anything else keeps Python's traceback,
    which is a bug to report.
    """
    import sys

    from ..errors import HybridflowError

    previous = sys.excepthook

    def hook(kind, error, traceback) -> None:
        if issubclass(kind, HybridflowError):
            print(f"{command}: error: {error}", file=sys.stderr, flush=True)
        elif issubclass(kind, OSError):
            files = " -> ".join(str(f) for f in (error.filename, error.filename2) if f is not None)
            print(f"{command}: error: {files + ': ' if files else ''}{error.strerror or error}", file=sys.stderr,
                  flush=True)
        elif issubclass(kind, KeyboardInterrupt):
            print(f"{command}: interrupted, stopped at once", file=sys.stderr, flush=True)
        else:
            previous(kind, error, traceback)

    sys.excepthook = hook
