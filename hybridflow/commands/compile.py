"""``hybridflow compile``: a graph and a cluster in, an ExecutionPlan (JSON) out. Two forms:

* ``hybridflow compile CONFIG.yaml [key=value ...] [--cluster local|ray|PRESET[:NODES]] -o plan.json`` compiles
  the plan ``hybridflow run CONFIG.yaml [key=value ...]`` would run: the same graph, models, batch shape,
  calibration and executable layouts, derived by the same run spec
  (:func:`~hybridflow.trainer.run_spec.derive`; see :mod:`.compile_config`); ``hybridflow run CONFIG.yaml
  plan=plan.json`` runs it.
* ``hybridflow compile ALGO --cluster PRESET[:NODES] --model ROLE=MODEL ... -o plan.json`` compiles a built-in
  algorithm (``ppo``, ``grpo``, ...), ``package.module:function`` or a graph JSON file for models and a workload
  given by flags: a cost study. ``--import MODULE`` imports a module (custom ops) first. With ``--cluster local``
  or ``ray`` the plan is compiled for, and bound to, that machine with the layouts its runtime runs.

Both print the placement search time, the chosen placement and the predicted iteration, and write the plan
(``hybridflow viz plan.json`` draws it). Shared argument helpers (models, batch) are used by
``hybridflow simulate`` too.

Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError, GraphError

__all__ = ["add_arguments", "add_import_argument", "ALGO_HELP", "run", "machine_for", "add_model_arguments",
           "add_batch_arguments", "add_engine_argument", "parse_engines", "parse_models", "batch_from_args", "load_graph",
           "summary_lines", "placement_lines", "async_lines"]

ALGO_DEFAULTS = {"cluster": "a100-80g:1", "placement": "auto", "staleness": 0, "engine": "fsdp", "prompts": 1024,
                 "prompt_len": 1024, "response_len": 1024, "epochs": 1, "mini_batches": 4}
"""The ALGO form's defaults for the flags a CONFIG.yaml takes from the config instead."""


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
    group.add_argument("--set", dest="overrides_set", action="append", default=[], metavar="KEY=VALUE",
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
    parser.add_argument("algorithm", metavar="CONFIG.yaml|ALGO",
                        help="a run file (as for 'hybridflow run': compiles the plan that run would run), or " + ALGO_HELP)
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="CONFIG.yaml: field overrides, as 'hybridflow run' takes them (e.g. n_samples=8 placement=split)")
    add_import_argument(parser)
    parser.add_argument("--cluster", default=None, metavar="local|ray|PRESET[:NODES]",
                        help="'local': this machine (its GPUs, or --cpu-slots CPU slots); 'ray': the Ray cluster at "
                             "RAY_ADDRESS or the config's ray_address (or a local one); a preset a100-80g, h100-80g, h200 "
                             "(nodes of 8) or cpu-local with a node count, e.g. a100-80g:16 (a cost study). Default: "
                             "the config's executor for CONFIG.yaml, a100-80g:1 for ALGO")
    parser.add_argument("--cpu-slots", type=int, default=None, metavar="N",
                        help="--cluster local/ray without GPUs: cut the CPU into N device slots (the run's cpu_slots)")
    add_model_arguments(parser)
    parser.add_argument("--placement", default=None,
                        help="ALGO: auto | colocate | split | standalone | a pool spec 'actor+ref@8;critic+reward@8' "
                             "(ROLE.generate@N: a rollout pool of its own) | a device map 'actor=cuda:0,critic=cuda:1' "
                             "(default auto; CONFIG.yaml: placement=...)")
    parser.add_argument("--staleness", type=int, default=None, metavar="K",
                        help="ALGO: overlap generation of iteration i+K with iteration i (needs a rollout pool of its own; "
                             "a policy-gradient loss then needs an off-policy correction, e.g. grpo with recompute_old_log_probs=false, "
                             "or algorithm grpo_is)")
    parser.add_argument("--allow-uncorrected-staleness", action="store_true",
                        help="ALGO with --staleness: compile a loss without an off-policy correction anyway (a warning; "
                             "CONFIG.yaml: allow_uncorrected_staleness=true)")
    add_engine_argument(parser)
    add_batch_arguments(parser)
    parser.set_defaults(engine=None, prompts=None, prompt_len=None, response_len=None, epochs=None, mini_batches=None)
    parser.add_argument("-o", "--output", metavar="PLAN.json",
                        help="where to write the plan (default: ALGO.plan.json, or CONFIG.plan.json beside no file)")
    parser.add_argument("--text", action="store_true", help="also print the plan's text form")
    parser.add_argument("--debug", action="store_true", help="verify the plan after every pass (names the pass that breaks it)")
    parser.add_argument("--dump-ir", metavar="DIR", help="write the plan's text after every pass into DIR (NN-PASS.txt; with "
                                                         "--placement auto, one run of the passes per scheduled candidate, in order)")


def _seconds(value: float | None) -> str:
    value = value or 0.0
    return f"{value:.1f} s" if value >= 10 else f"{value:.3g} s"


def summary_lines(report) -> list[str]:
    """The chosen placement, its predicted iteration, each pool's roles and layouts, the candidates tried, and
    the lagged edges (:func:`lag_lines`)."""
    lines = placement_lines(report.plan)
    if len(report.candidates) > 1:
        tried = ", ".join(f"{label} {_seconds(seconds)}" for label, seconds in report.candidates)
        lines.append(f"  scheduled candidates: {tried}")
    return lines + async_lines(report.plan) + lag_lines(report.plan)


def async_lines(plan) -> list[str]:
    """With staleness k >= 1, the parts of the predicted asynchronous step
    (:func:`~hybridflow.compiler.passes.schedule.async_parts`); nothing on-policy."""
    if not plan.staleness:
        return []
    from ..compiler.passes.schedule import async_parts

    parts = async_parts(plan)
    return [f"  asynchronous step (staleness {plan.staleness}): generation {_seconds(parts.gen_s)}, training "
            f"{_seconds(parts.train_s)}, weight sync {_seconds(parts.sync_s)} -> {_seconds(plan.predicted_iteration_s)} "
            "per step (hybridflow.compiler.async_cost)"]


def lag_lines(plan) -> list[str]:
    """A plan's lagged edges (:meth:`~hybridflow.compiler.plan.ExecutionPlan.edge_lags`), one line per producer
    field and lag: ``lag 1: actor.generate.response_mask -> actor.logprob, actor.update``; none on-policy."""
    grouped: dict[tuple[int, str], list[str]] = {}
    for edge, lag in plan.edge_lags().items():
        if lag:
            grouped.setdefault((lag, f"{edge.producer}.{edge.field}"), []).append(edge.consumer)
    if not grouped:
        return []
    lines = [f"  lagged edges (staleness {plan.staleness}; lag = policy updates between the weights that made a value "
             "and the ones that read it):"]
    lines += [f"    lag {lag}: {value} -> {', '.join(consumers)}" for (lag, value), consumers in grouped.items()]
    return lines


def placement_lines(plan) -> list[str]:
    """A plan's placement and predicted iteration, then one line per pool: its roles and their layouts."""
    lines = [f"placement {plan.strategy}: predicted iteration {_seconds(plan.predicted_iteration_s)}"]
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
        if pool.workers:  # an environment pool: worker processes on host CPUs, no devices
            envs = [p.role for p in plan.placements if p.env_pool == pool.name]
            lines.append(f"  {pool.name} ({pool.workers} env workers on host CPUs): environments of {', '.join(envs)}")
            continue
        lines.append(f"  {pool.name} ({len(pool.devices)} devices{flag}): " + "; ".join(parts))
    return lines


def machine_for(name: str, cpu_slots: int | None = None):
    """The Machine of ``--cluster local`` (this machine) or ``ray`` (the Ray cluster at RAY_ADDRESS, or a local one)."""
    from ..compiler.machine import local_machine, ray_machine

    if name == "local":
        return local_machine(cpu_slots)
    import os

    from ..runtime.ray.cluster import connect

    connect(os.environ.get("RAY_ADDRESS"))
    return ray_machine(cpu_slots)


def _algo_defaults(args: argparse.Namespace) -> None:
    """The ALGO form's defaults for the flags left unset (:data:`ALGO_DEFAULTS`); key=value overrides are refused."""
    if args.overrides:
        raise ConfigError(f"key=value overrides ({' '.join(args.overrides)}) are for a CONFIG.yaml; an algorithm's "
                          "attributes are set with --set KEY=VALUE")
    for name, value in ALGO_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def write_plan(plan, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(plan.to_json())
    print(f"wrote {out}")


def run(args: argparse.Namespace) -> int:
    from .run_file import is_run_file

    if is_run_file(args.algorithm):
        from .compile_config import run as run_config

        return run_config(args)
    from ..compiler.cluster import ClusterSpec
    from ..compiler.compile import IRDump, compile_report
    from ..compiler.machine import compile_report_for

    _algo_defaults(args)
    graph = load_graph(args.algorithm, args.overrides_set, args.imports)
    models = parse_models(args.models)
    if not models:
        raise ConfigError("give the models: --model actor=llama2-7b [critic=... ref=... reward=...|rule], or compile "
                          "a run file: hybridflow compile CONFIG.yaml --cluster local")
    hooks = (IRDump(Path(args.dump_ir)),) if args.dump_ir else ()
    settings = dict(placement=args.placement, staleness=args.staleness, batch=batch_from_args(args),
                    allow_uncorrected_staleness=args.allow_uncorrected_staleness,
                    debug=args.debug or None, hooks=hooks, engines=parse_engines(args.engine))
    if args.cluster in ("local", "ray"):  # a plan this machine runs: executable layouts, bound to its devices
        machine = machine_for(args.cluster, args.cpu_slots)
        report, where = compile_report_for(graph, models, machine=machine, **settings), machine.describe()
    else:
        if args.cpu_slots is not None:
            raise ConfigError("--cpu-slots applies to --cluster local or ray")
        cluster = ClusterSpec.parse(args.cluster)
        report, where = compile_report(graph, cluster, models, **settings), cluster.describe()
    print(f"compiled {graph.name} for {where} in {report.seconds:.2f} s; placement search took {report.search_s:.2f} s")
    print("\n".join(summary_lines(report)))
    if args.text:
        print(report.plan.to_text(), end="")
    write_plan(report.plan, Path(args.output or f"{graph.name}.plan.json"))
    return 0
