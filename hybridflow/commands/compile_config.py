"""``hybridflow compile CONFIG.yaml [key=value ...] --cluster local|ray|PRESET[:NODES] -o plan.json``.

Compiles the plan ``hybridflow run CONFIG.yaml [key=value ...]`` would run, by the run's own route: the config
and overrides are read as ``run`` reads them, the graph is the trainer's (the config's n_samples, kl_coef, ...),
and the models, batch shape, engines, cost options and calibration come from the run spec
(:func:`.run_file.run_file_spec`, :func:`~hybridflow.trainer.run_spec.derive`). So

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
from pathlib import Path

__all__ = ["run", "ALGO_FLAGS"]

ALGO_FLAGS = {"models": "--model (the config's actor_model_name, critic_model_name, ...)",
              "placement": "--placement (placement=...)", "staleness": "--staleness (staleness=...)",
              "allow_uncorrected_staleness": "--allow-uncorrected-staleness (allow_uncorrected_staleness=true)",
              "engine": "--engine", "prompts": "--prompts (rollout_batch_size=...)",
              "prompt_len": "--prompt-len (max_prompt_length=...)",
              "response_len": "--response-len (max_response_length=...)", "epochs": "--epochs (ppo_epochs=...)",
              "mini_batches": "--mini-batches (batch_size=...)", "overrides_set": "--set (n_samples=..., kl_coef=...)"}
"""The algorithm form's flags, which a run file sets in the config instead (with the field that does)."""


def run(args: argparse.Namespace) -> int:
    from ..compiler.compile import IRDump
    from ..trainer.run_report import quiet_libraries
    from .compile import summary_lines, write_plan
    from .run_file import refuse_flags, run_file_spec

    refuse_flags(args, ALGO_FLAGS)
    quiet_libraries()
    found = run_file_spec(args.algorithm, args.overrides, args.imports, cluster=args.cluster, cpu_slots=args.cpu_slots)
    spec, preset = found.spec, found.preset
    hooks = (IRDump(Path(args.dump_ir)),) if args.dump_ir else ()
    report = spec.compile(debug=args.debug or None, hooks=hooks, bound=preset is None)
    where = spec.machine.describe() if preset is None else preset.describe()
    figures = "calibrated on this machine" if spec.calibrated else "datasheet figures"
    print(f"compiled {spec.graph.name} from {args.algorithm} for {where} in {report.seconds:.2f} s ({figures}: "
          f"{spec.cluster.name}); {spec.responses} responses of {spec.batch.prompt_len}+{spec.batch.response_len} "
          f"tokens per step")
    print("\n".join(summary_lines(report)))
    print(f"predicted step time: {report.plan.predicted_iteration_s or 0.0:.4g} s")
    if args.text:
        print(report.plan.to_text(), end="")
    out = Path(args.output or f"{Path(args.algorithm).stem}.plan.json")
    write_plan(report.plan, out)
    extra = [*args.overrides, *([f"cpu_slots={args.cpu_slots}"] if args.cpu_slots is not None else []),
             *(["executor=ray"] if preset is None and found.config.executor == "ray" else [])]
    print(f"run it: hybridflow run {args.algorithm} {' '.join([*extra, f'plan={out}'])}")
    return 0
