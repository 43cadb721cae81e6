"""``hybridflow compile ALGO --cluster PRESET[:NODES] --model ROLE=MODEL ... -o plan.json``.

ALGO is a built-in algorithm (``ppo``, ``grpo``, ...), ``package.module:function`` or a
graph JSON file; ``--import MODULE`` imports a module (custom ops) first.
Prints the placement search time, the chosen placement and the predicted
iteration, and writes the ExecutionPlan as JSON (``hybridflow viz plan.json``
draws it). Shared argument helpers (models, batch) are used by
``hybridflow simulate`` too.

Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError, GraphError

__all__ = ["add_arguments", "add_import_argument", "ALGO_HELP", "run", "machine_cluster", "add_model_arguments", "add_batch_arguments", "add_engine_argument",
           "parse_engines", "parse_models", "batch_from_args", "load_graph"]


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", dest="models", nargs="+", action="extend", default=[], metavar="ROLE=MODEL",
                        help="model per role: a preset (llama2-7b, qwen2.5-7b, ...), a config.json path, or 'rule' for a "
                             "rule-function reward (costs ~0); roles not named use the actor's model; a bare MODEL is the actor's")


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload (default: HybridFlow §8.1, 1024 prompts of 1024 tokens, 1024-token responses)")
    group.add_argument("--prompts", type=int, default=1024, help="prompts per iteration")
    group.add_argument("--prompt-len", type=int, default=1024, help="tokens per prompt")
    group.add_argument("--response-len", type=int, default=1024, help="tokens per response")
    group.add_argument("--epochs", type=int, default=1, help="epochs of every update over the batch")
    group.add_argument("--mini-batches", type=int, default=4, help="optimizer steps per epoch")
    group.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override an algorithm attribute, e.g. --set n=4 (VALUE read as JSON, else as a string)")


def add_engine_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", default="fsdp", metavar="ENGINE[,ENGINE]",
                        help="training engine(s) of the trainable roles: fsdp (ZeRO-3, what hybridflow runs), megatron "
                             "(Megatron-core 3D parallel, distributed optimizer; HybridFlow's), or fsdp,megatron to let the search choose")


def parse_engines(value: str) -> tuple[str, ...]:
    """``--engine fsdp,megatron`` as the checked tuple of engine names (ConfigError naming the flag)."""
    from ..compiler.engine import check_engines

    return check_engines((e.strip() for e in value.split(",") if e.strip()), f"--engine {value!r}")


def parse_models(items: list[str]) -> dict[str, str]:
    """``["actor=llama2-7b", "reward=rule"]`` -> dict; a bare name is the actor's."""
    found: dict[str, str] = {}
    for item in items:
        role, sep, model = item.partition("=")
        if not sep:
            role, model = "actor", item
        if not role.strip() or not model.strip():
            raise ConfigError(f"--model {item!r}: write ROLE=MODEL, e.g. --model actor=llama2-7b reward=rule")
        found[role.strip()] = model.strip()
    return found


def batch_from_args(args: argparse.Namespace):
    from pydantic import ValidationError

    from ..compiler.passes import BatchShape

    try:
        return BatchShape(prompts=args.prompts, prompt_len=args.prompt_len, response_len=args.response_len,
                          epochs=args.epochs, mini_batches=args.mini_batches)
    except ValidationError as err:
        raise ConfigError(f"workload: {err.errors()[0]['loc'][0]} {err.errors()[0]['msg']}") from None


ALGO_HELP = ("a built-in algorithm (ppo, grpo, rloo, reinforce_pp, remax, safe_rlhf, ...), 'package.module:function' "
             "(an @hf.algorithm function; the working directory is on the import path) or a graph JSON file")


def add_import_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (e.g. one that registers custom ops with @hf.register_op); repeatable")


def load_graph(source: str, overrides: list[str], imports: list[str] = ()):
    """The graph of ALGO (see :func:`~hybridflow.algorithms.resolve.resolve_algorithm`) with ``--set`` overrides,
    after importing ``imports``; a graph file is validated as the DSL validates."""
    from ..algorithms.resolve import import_modules, resolve_algorithm
    from .viz import assignments

    import_modules(imports, "--import")
    values = assignments(overrides)
    algorithm = resolve_algorithm(source, "ALGO")
    if values and not algorithm.defaults:
        raise ConfigError(f"--set overrides an algorithm's attributes; {source!r} is a fixed graph without any")
    return algorithm.build(**values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("algorithm", metavar="ALGO", help=ALGO_HELP)
    add_import_argument(parser)
    parser.add_argument("--cluster", default="a100-80g:1", metavar="PRESET[:NODES]",
                        help="a100-80g, h100-80g, h200 (nodes of 8) or cpu-local, with a node count: a100-80g:16; "
                             "'local': this machine (its GPUs, or --cpu-slots CPU slots); 'ray': the Ray cluster "
                             "at RAY_ADDRESS (or a local one)")
    parser.add_argument("--cpu-slots", type=int, default=None, metavar="N",
                        help="--cluster local/ray without GPUs: cut the CPU into N device slots (the run's cpu_slots)")
    add_model_arguments(parser)
    parser.add_argument("--placement", default="auto",
                        help="auto | colocate | split | standalone | a pool spec 'actor+ref@8;critic+reward@8' "
                             "(ROLE.generate@N: a rollout pool of its own) | a device map 'actor=cuda:0,critic=cuda:1'")
    parser.add_argument("--staleness", type=int, default=0, metavar="K",
                        help="overlap generation of iteration i+K with iteration i (needs a rollout pool of its own)")
    add_engine_argument(parser)
    add_batch_arguments(parser)
    parser.add_argument("-o", "--output", metavar="PLAN.json", help="where to write the plan (default: ALGO.plan.json)")
    parser.add_argument("--text", action="store_true", help="also print the plan's text form")
    parser.add_argument("--debug", action="store_true", help="verify the plan after every pass (names the pass that breaks it)")
    parser.add_argument("--dump-ir", metavar="DIR", help="write the plan's text after every pass into DIR (NN-PASS.txt; with "
                                                         "--placement auto, one run of the passes per scheduled candidate, in order)")


def _summary(report) -> list[str]:
    plan = report.plan
    lines = [f"placement {plan.strategy}: predicted iteration {plan.predicted_iteration_s:.1f} s"]
    for pool in plan.pools:
        members = [p for p in plan.placements if p.pool == pool.name or p.generation_pool == pool.name]
        parts = []
        for p in members:
            if p.generation_pool == pool.name:
                parts.append(f"{p.role} generate {p.generation_layout}")
                continue
            gen = f" (generate {p.generation_layout})" if p.generation_layout and not p.generation_pool else ""
            parts.append(f"{p.role} {p.layout}{gen}")
        flag = ", offload" if pool.offload else ""
        lines.append(f"  {pool.name} ({len(pool.devices)} devices{flag}): " + "; ".join(parts))
    if len(report.candidates) > 1:
        tried = ", ".join(f"{label} {seconds:.1f} s" for label, seconds in report.candidates)
        lines.append(f"  scheduled candidates: {tried}")
    return lines


def machine_cluster(name: str, cpu_slots: int | None = None):
    """The ClusterSpec of ``--cluster``: a preset, or the machine at hand ('local'; 'ray': the Ray cluster)."""
    from ..compiler.cluster import ClusterSpec
    from ..compiler.machine import local_machine, ray_machine

    if name == "local":
        return local_machine(cpu_slots).cluster()
    if name == "ray":
        import os

        from ..runtime.ray.cluster import connect

        connect(os.environ.get("RAY_ADDRESS"))
        return ray_machine(cpu_slots).cluster()
    if cpu_slots is not None:
        raise ConfigError("--cpu-slots applies to --cluster local or ray")
    return ClusterSpec.parse(name)


def run(args: argparse.Namespace) -> int:
    from ..compiler.compile import IRDump, compile_report

    graph = load_graph(args.algorithm, args.overrides, args.imports)
    models = parse_models(args.models)
    if not models:
        raise ConfigError("give the models: --model actor=llama2-7b [critic=... ref=... reward=...|rule]")
    hooks = (IRDump(Path(args.dump_ir)),) if args.dump_ir else ()
    cluster = machine_cluster(args.cluster, args.cpu_slots)
    report = compile_report(graph, cluster, models, placement=args.placement, staleness=args.staleness,
                            batch=batch_from_args(args), debug=args.debug or None, hooks=hooks,
                            engines=parse_engines(args.engine))
    print(f"compiled {graph.name} for {cluster.describe()} in {report.seconds:.2f} s; "
          f"placement search took {report.search_s:.2f} s")
    print("\n".join(_summary(report)))
    if args.text:
        print(report.plan.to_text(), end="")
    out = Path(args.output or f"{graph.name}.plan.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.plan.to_json())
    print(f"wrote {out}")
    return 0
