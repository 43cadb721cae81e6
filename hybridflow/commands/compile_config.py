"""``hybridflow compile CONFIG.yaml [key=value ...] --cluster local|ray|PRESET[:NODES] -o plan.json``.

Compiles the plan ``hybridflow run CONFIG.yaml [key=value ...]`` would run, by the run's own route: the config
and overrides are read as ``run`` reads them, the graph is the trainer's (:meth:`~hybridflow.trainer.Trainer.
build_graph`: the config's n_samples, kl_coef, ...), and the models, batch shape, engines, cost options and
calibration come from :func:`~hybridflow.trainer.run_spec.derive`. So

* ``--cluster local`` (or ``ray``) compiles for this machine (or the Ray cluster) what the run would compile there:
  executable layouts, calibrated to the run's models measured here, bound to the machine's devices; a plan the
  runtime cannot execute is refused here (:class:`~hybridflow.errors.BindError`);
* ``--cluster PRESET[:NODES]`` compiles the run for a cluster preset (datasheet figures, not bound): what the run
  would execute on such a cluster, for a study before renting it.

The default cluster is the config's ``executor``. It prints the chosen placement and its predicted step time,
writes the plan, and says how to run it (``hybridflow run CONFIG.yaml plan=plan.json``).
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError

__all__ = ["run"]

_ALGO_FLAGS = {"models": "--model (the config's actor_model_name, critic_model_name, ...)",
               "placement": "--placement (placement=...)", "staleness": "--staleness (staleness=...)",
               "engine": "--engine", "prompts": "--prompts (rollout_batch_size=...)",
               "prompt_len": "--prompt-len (max_prompt_length=...)",
               "response_len": "--response-len (max_response_length=...)", "epochs": "--epochs (ppo_epochs=...)",
               "mini_batches": "--mini-batches (batch_size=...)", "overrides_set": "--set (n_samples=..., kl_coef=...)"}
"""The ALGO form's flags, which a run file sets in the config instead (with the field that does)."""


def _refuse_algo_flags(args: argparse.Namespace) -> None:
    given = [flag for name, flag in _ALGO_FLAGS.items() if getattr(args, name)]
    if given:
        raise ConfigError(f"{args.algorithm} is a run file: its config sets what {', '.join(given)} would; give "
                          "those as key=value overrides after the file, as for hybridflow run")


def _config_for(args: argparse.Namespace):
    """(algorithm, config) of the run file with the overrides and the cluster's executor and cpu_slots."""
    from ..trainer.config_files import load_run_config

    algorithm, config = load_run_config(args.algorithm, args.overrides, args.imports)
    if config.plan:
        raise ConfigError(f"plan={config.plan!r} runs a plan compiled earlier; drop it to compile the config")
    cluster = args.cluster or config.executor
    update = {}
    if cluster in ("local", "ray"):
        update["executor"] = cluster
    elif args.cpu_slots is not None:
        raise ConfigError("--cpu-slots applies to --cluster local or ray")
    else:
        update["calibrate"] = False  # a preset is not this machine: its datasheet figures
    if args.cpu_slots is not None:
        update["cpu_slots"] = args.cpu_slots
    return algorithm, config.model_copy(update=update), cluster


def _preset_machine(cluster: str):
    """(Machine, ClusterSpec) of a preset: its devices, of the kind the run there would have."""
    from ..compiler.cluster import ClusterSpec
    from ..compiler.machine import Machine

    spec = ClusterSpec.parse(cluster)
    kind = "cpu" if spec.name.startswith("cpu") else "cuda"
    return Machine(kind, spec.devices_per_node, nodes=spec.nodes, gpu_name=spec.name), spec


def run(args: argparse.Namespace) -> int:
    from ..compiler.compile import IRDump
    from ..trainer import Trainer
    from ..trainer.planning import run_machine
    from ..trainer.run_report import quiet_libraries
    from ..trainer.run_spec import derive, set_process_threads
    from ..trainer.setup import check_batch_sizes, check_devices, check_trainable, run_inputs
    from .compile import summary_lines, write_plan

    _refuse_algo_flags(args)
    algorithm, config, cluster = _config_for(args)
    quiet_libraries()
    graph = Trainer(config, algorithm=algorithm).build_graph()
    check_trainable(graph)
    check_batch_sizes(graph, config)
    preset = None
    if cluster in ("local", "ray"):
        check_devices(config.device_map)
        machine = run_machine(config)
        set_process_threads(config, machine)
    else:
        machine, preset = _preset_machine(cluster)
    with tempfile.TemporaryDirectory(prefix="hybridflow-compile-") as scratch:
        # the built-in model, when the config names none, is made here (or copied from the cache), not in output_dir
        spec = derive(config, graph, machine, run_inputs(config, Path(scratch)))
        if preset is not None:
            spec = replace(spec, cluster=preset)
        hooks = (IRDump(Path(args.dump_ir)),) if args.dump_ir else ()
        report = spec.compile(debug=args.debug or None, hooks=hooks, bound=preset is None)
    where = machine.describe() if preset is None else preset.describe()
    figures = "calibrated on this machine" if spec.calibrated else "datasheet figures"
    print(f"compiled {graph.name} from {args.algorithm} for {where} in {report.seconds:.2f} s ({figures}: "
          f"{spec.cluster.name}); {spec.responses} responses of {spec.batch.prompt_len}+{spec.batch.response_len} "
          f"tokens per step")
    print("\n".join(summary_lines(report)))
    print(f"predicted step time: {report.plan.predicted_iteration_s or 0.0:.4g} s")
    if args.text:
        print(report.plan.to_text(), end="")
    out = Path(args.output or f"{Path(args.algorithm).stem}.plan.json")
    write_plan(report.plan, out)
    extra = [*args.overrides, *([f"cpu_slots={args.cpu_slots}"] if args.cpu_slots is not None else []),
             *(["executor=ray"] if preset is None and config.executor == "ray" else [])]
    print(f"run it: hybridflow run {args.algorithm} {' '.join([*extra, f'plan={out}'])}")
    return 0
