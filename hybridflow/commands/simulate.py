"""``hybridflow simulate ALGO --models llama2-7b,llama2-70b --gpus 16,32,64,96,128`` or ``hybridflow simulate
CONFIG.yaml [key=value ...] --gpus 8,16`` (the run file's graph, models, batch shape and cost options, as its run
derives them: :func:`.run_file.run_file_spec`).

For every model (the actor's, and by default every role's) and cluster size,
prints the predicted iteration time of the fixed strategies (colocate, split,
standalone) and of the automatic placement, and the automatic placement
itself, as HybridFlow §8.3 compares them. The numbers are the placement
search's simulated iteration (:mod:`hybridflow.compiler.placement.evaluate`).
Each cell shows its winning fixed strategy and the runner-up's margin;
``--compare paper`` adds the winner HybridFlow's Fig. 12 reports.
``--engine`` picks the training engine(s) the roles may use, ``--workload``
a batch preset (``paper``: §8.1 exactly), ``--network`` the links between
nodes (``paper``: 200 Gb/s), ``--assume FIELD=VALUE`` a cluster figure or cost
option for a sensitivity study. Every table ends with the automatic
placement's strong-scaling efficiency per model (HybridFlow §8.2).

``--staleness 0,1,2,4`` prints instead, per model and cluster size, the predicted
step and trained samples/s against the staleness k, with the split of the devices
between a rollout pool and the training pools chosen per k, and the fastest split
with a rollout pool of its own (:func:`hybridflow.compiler.simulate.async_table`;
``--assume generation_time_cv=0.5 --assume async_weight_sync=staged`` for varying
generation times and a staged weight sync, :mod:`hybridflow.compiler.async_cost`).

Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse

from ..errors import ConfigError
from .compile import (ALGO_HELP, add_batch_arguments, add_import_argument, add_engine_argument, add_model_arguments, batch_from_args, load_graph,
                      parse_engines, parse_models)

__all__ = ["add_arguments", "run"]

DEFAULT_ACTOR_MODELS = "llama2-7b,llama2-13b,llama2-34b,llama2-70b"
_ALGO_FLAGS = {"actor_models": "--models (actor_model_name=...)", "models": "--model (the config's model fields)",
               "engine": "--engine", "workload": "--workload", "prompts": "--prompts (rollout_batch_size=...)",
               "prompt_len": "--prompt-len", "response_len": "--response-len (max_response_length=...)",
               "epochs": "--epochs (ppo_epochs=...)", "mini_batches": "--mini-batches (batch_size=...)",
               "overrides_set": "--set (n_samples=..., kl_coef=...)"}
"""The algorithm form's flags, which a run file sets in its config instead."""


def _ints(text: str, flag: str = "--gpus", least: int = 1, example: str = "16,32,64") -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: give whole numbers separated by commas, e.g. {example}") from None
    if not values or min(values) < least:
        raise ConfigError(f"{flag} {text!r}: give numbers >= {least} separated by commas, e.g. {example}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("algorithm", metavar="CONFIG.yaml|ALGO",
                        help="a run file (its graph, models, batch shape and cost options, as the run derives them), or "
                             + ALGO_HELP)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="CONFIG.yaml: field overrides, as for run")
    add_import_argument(parser)
    parser.add_argument("--models", dest="actor_models", default=None,
                        help="ALGO: actor models, one table block each, comma-separated (roles default to the actor's "
                             f"model; default {DEFAULT_ACTOR_MODELS})")
    add_model_arguments(parser)
    parser.add_argument("--gpus", default="16,32,64,96,128", help="cluster sizes in devices, comma-separated")
    parser.add_argument("--cluster", default="a100-80g", metavar="PRESET", help="node type: a100-80g, h100-80g, h200")
    parser.add_argument("--brief", action="store_true", help="only the table, not each automatic placement's layouts")
    add_engine_argument(parser)
    parser.add_argument("--workload", default=None, metavar="PRESET",
                        help="batch preset: default (1024 prompts, 1024+1024 tokens, 4 mini-batches) or paper (HybridFlow §8.1: "
                             "8 update iterations per PPO epoch); --prompts etc. override it")
    parser.add_argument("--network", default="default", metavar="PRESET",
                        help="network between nodes: default (the node preset's adapters) or paper (HybridFlow §8.1: 200 Gb/s)")
    parser.add_argument("--no-overlap-grad-reduce", dest="overlap_grad_reduce", action="store_false",
                        help="megatron: the gradient reduce-scatter is not overlapped with the last micro-batch's backward")
    parser.add_argument("--assume", dest="settings", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a cluster figure or cost option for a sensitivity study, e.g. "
                             "decode_step_overhead_s=0.004 or train_micro_batch=2 (repeatable)")
    parser.add_argument("--staleness", default=None, metavar="K,K,...",
                        help="print trained samples/s against these staleness values (e.g. 0,1,2,4) with the split of "
                             "the devices between rollout and training chosen per k, instead of the placement table")
    parser.add_argument("--compare", default=None, metavar="STUDY",
                        help="print beside each cell the winner a study reports: paper (HybridFlow §8.3, Fig. 12)")
    add_batch_arguments(parser)
    parser.set_defaults(engine=None, prompts=None, prompt_len=None, response_len=None, epochs=None, mini_batches=None)


def _apply_workload_preset(args: argparse.Namespace) -> None:
    """Fill the batch arguments left unset from the ``--workload`` preset."""
    from ..compiler.workload import workload_preset

    preset = workload_preset(args.workload)
    for arg, value in (("prompts", preset.prompts), ("prompt_len", preset.prompt_len), ("response_len", preset.response_len),
                       ("epochs", preset.epochs), ("mini_batches", preset.mini_batches)):
        if getattr(args, arg) is None:
            setattr(args, arg, value)


def _algorithm_study(args: argparse.Namespace):
    """(graph, workload factory, actor models, batch, engines, options) of the ALGO form: models and workload from flags."""
    from ..compiler.cost import CostOptions
    from ..compiler.models import ModelSpec
    from ..compiler.passes import lower_workload, resolve_models
    from ..compiler.passes.lower import actor_role, parse_model

    if args.overrides:
        raise ConfigError(f"key=value overrides ({' '.join(args.overrides)}) are for a CONFIG.yaml; an algorithm's "
                          "attributes are set with --set KEY=VALUE")
    args.workload = args.workload or "default"
    _apply_workload_preset(args)
    engines = parse_engines(args.engine or "fsdp")
    graph = load_graph(args.algorithm, args.overrides_set, args.imports)
    overrides, batch = parse_models(args.models), batch_from_args(args)
    actor = actor_role(graph)
    actor_models = args.actor_models or DEFAULT_ACTOR_MODELS
    models = [parse_model(m.strip()) for m in actor_models.split(",") if m.strip()]
    if not models or None in models:
        raise ConfigError(f"--models {actor_models!r}: give model presets or config.json paths, e.g. llama2-7b,llama2-70b")
    if overrides.get(actor):
        raise ConfigError(f"--model {actor}=... is given by --models for this command; list the actor models there")

    def workload(spec: ModelSpec):
        return lower_workload(graph, resolve_models(graph, {**overrides, actor: spec}), batch).with_engines(engines)

    options = CostOptions(overlap_grad_reduce=args.overlap_grad_reduce)
    return graph, workload, models, batch, engines, options, f"workload {args.workload}"


def _run_file_study(args: argparse.Namespace):
    """The same for a run file: the graph, models, batch shape and cost options its run spec has on ``--cluster``."""
    from ..compiler.passes import lower_workload, resolve_models
    from ..compiler.passes.lower import actor_role
    from .run_file import refuse_flags, run_file_spec

    refuse_flags(args, _ALGO_FLAGS)
    spec = run_file_spec(args.algorithm, args.overrides, args.imports, cluster=args.cluster).spec
    graph, models = spec.graph, spec.model_specs()
    actor = actor_role(graph)

    def workload(actor_model):
        return lower_workload(graph, resolve_models(graph, {**models, actor: actor_model}), spec.batch) \
            .with_engines(spec.train_engines)

    options = spec.options.model_copy(update={"overlap_grad_reduce": args.overlap_grad_reduce})
    return graph, workload, [models[actor]], spec.batch, spec.train_engines, options, args.algorithm


def run(args: argparse.Namespace) -> int:
    from ..compiler.cluster import ClusterSpec
    from ..compiler.simulate import agreement, apply_settings, format_scaling, format_table, simulate_table, strong_scaling
    from .run_file import is_run_file

    study = _run_file_study if is_run_file(args.algorithm) else _algorithm_study
    graph, workload, models, batch, engines, options, source = study(args)
    cluster, options = apply_settings(ClusterSpec.parse(args.cluster), options, args.settings)
    if args.staleness is not None:
        return _run_async(args, graph, workload, models, batch, cluster, options, source)
    rows = simulate_table(workload, models, _ints(args.gpus), cluster, options, network=args.network)
    settings = "; assuming " + ", ".join(args.settings) if args.settings else ""
    print(f"{graph.name}: {batch.prompts} prompts x {batch.prompt_len} + {batch.response_len} tokens per iteration, "
          f"{batch.epochs} epoch(s) of {batch.mini_batches} optimizer steps ({source}), nodes of 8 {args.cluster}, "
          f"network {args.network}, engine {','.join(engines)}{settings}; "
          f"predicted seconds per iteration "
          f"(OOM: no placement fits; * offloads; margin: runner-up fixed strategy's extra time)")
    print(format_table(rows, compare=args.compare))
    if args.compare:
        agree, cells = agreement(rows, args.compare)
        print(f"\nwinner agrees with {args.compare} in {agree} of {cells} cells it reports")
    print("\n" + format_scaling(strong_scaling(rows)))
    if not args.brief:
        print("\nautomatic placements:")
        for row in rows:
            if row.auto is not None:
                print(f"{row.model} on {row.gpus} GPUs: " + row.auto.describe().split("\n", 1)[1].strip().replace("\n  ", " | "))
    return 0


def _run_async(args, graph, workload, models, batch, cluster, options, source) -> int:
    """``--staleness``: the table of throughput against k (module docstring)."""
    from ..compiler.simulate import async_table, format_async_table

    ks = _ints(args.staleness, "--staleness", 0, "0,1,2,4")
    rows = async_table(workload, models, _ints(args.gpus), cluster, options, network=args.network, staleness=ks)
    settings = "; assuming " + ", ".join(args.settings) if args.settings else ""
    print(f"{graph.name}: {batch.prompts} prompts x {batch.prompt_len} + {batch.response_len} tokens per step ({source}), "
          f"nodes of {cluster.devices_per_node} {args.cluster}, network {args.network}{settings}; generation time CV "
          f"{options.generation_time_cv}, {options.async_weight_sync} weight sync. Predicted step per staleness k "
          "(hybridflow.compiler.async_cost); colocated: generation and training take turns on all devices")
    print(format_async_table(rows))
    return 0
