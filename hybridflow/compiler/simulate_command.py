"""``hybridflow simulate ALGO --models llama2-7b,llama2-70b --gpus 16,32,64,96,128``.

For every model (the actor's, and by default every role's) and cluster size,
prints the predicted iteration time of the fixed strategies (colocate, split,
standalone) and of the automatic placement, and the automatic placement
itself, as HybridFlow §8.3 compares them. The numbers are the placement
search's simulated iteration (:mod:`hybridflow.compiler.placement.evaluate`).

Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse

from ..errors import ConfigError
from .command import add_batch_arguments, add_model_arguments, batch_from_args, load_graph, parse_models

__all__ = ["add_arguments", "run"]


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--gpus {text!r}: give GPU counts separated by commas, e.g. 16,32,64") from None
    if not values or min(values) < 1:
        raise ConfigError(f"--gpus {text!r}: give positive GPU counts, e.g. 16,32,64")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("algorithm", metavar="ALGO", help="a standard algorithm (ppo, grpo, ...) or a graph JSON file")
    parser.add_argument("--models", dest="actor_models", default="llama2-7b,llama2-13b,llama2-34b,llama2-70b",
                        help="actor models, one table block each, comma-separated (roles default to the actor's model)")
    add_model_arguments(parser)
    parser.add_argument("--gpus", default="16,32,64,96,128", help="cluster sizes in devices, comma-separated")
    parser.add_argument("--cluster", default="a100-80g", metavar="PRESET", help="node type: a100-80g, h100-80g, h200")
    parser.add_argument("--brief", action="store_true", help="only the table, not each automatic placement's layouts")
    add_batch_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from .models import ModelSpec
    from .passes import lower_workload, resolve_models
    from .passes.lower import actor_role, parse_model
    from .simulate import format_table, simulate_table

    graph = load_graph(args.algorithm, args.overrides)
    overrides, batch = parse_models(args.models), batch_from_args(args)
    actor = actor_role(graph)
    models = [parse_model(m.strip()) for m in args.actor_models.split(",") if m.strip()]
    if not models or None in models:
        raise ConfigError(f"--models {args.actor_models!r}: give model presets or config.json paths, e.g. llama2-7b,llama2-70b")
    if overrides.get(actor):
        raise ConfigError(f"--model {actor}=... is given by --models for this command; list the actor models there")

    def workload(spec: ModelSpec):
        return lower_workload(graph, resolve_models(graph, {**overrides, actor: spec}), batch)

    rows = simulate_table(workload, models, _ints(args.gpus), args.cluster)
    print(f"{graph.name}: {batch.prompts} prompts x {batch.prompt_len} + {batch.response_len} tokens per iteration, "
          f"nodes of 8 {args.cluster}; predicted seconds per iteration (OOM: no placement fits; * offloads)")
    print(format_table(rows))
    if not args.brief:
        print("\nautomatic placements:")
        for row in rows:
            if row.auto is not None:
                print(f"{row.model} on {row.gpus} GPUs: " + row.auto.describe().split("\n", 1)[1].strip().replace("\n  ", " | "))
    return 0
