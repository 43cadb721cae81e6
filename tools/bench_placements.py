"""Which (placement x executor) combinations train, and their seconds per step, from the config alone.

For each combination this runs ``hybridflow run examples/configs/quickstart.yaml`` (PPO, 32 prompts x
16 responses, the tiny model made in code) for ``--steps`` steps with ``placement=...``
``executor=...`` (and ``cpu_slots``, ``staleness``) as overrides: the trainer compiles the
algorithm's graph for this machine, binds the plan and runs it. Printed per combination: the
plan's pools, the median s/step over the steps after the first, the plan's predicted s/step
(calibrated cost model), and their ratio, or the error that stopped it. Combinations run one
after another in this process; Ray is started once with 4 logical CPUs (its slots share the
machine's cores).

    .venv/bin/python tools/bench_placements.py [--steps 4] [--only local|ray] [--placement NAME ...] [OVERRIDE ...]

``--placement`` keeps the combinations of that name (``colocate``, ``split``, ...; repeatable), and
``OVERRIDE``s (``key=value``, e.g. ``rollout_batch_size=4``) apply to every run.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

COMBINATIONS = [
    # (executor, name, overrides)
    ("local", "auto", []),
    ("local", "colocate", ["placement=colocate"]),
    ("local", "split", ["placement=split", "cpu_slots=2"]),
    ("local", "standalone", ["placement=standalone", "cpu_slots=3"]),
    ("local", "device map", ["device_map.actor=cpu", "device_map.critic=cpu"]),
    ("local", "rollout pool", ["placement=actor+critic+ref@1;actor.generate@1", "cpu_slots=2"]),
    ("ray", "auto", ["cpu_slots=2"]),
    ("ray", "colocate (dp2, FSDP2)", ["placement=colocate", "cpu_slots=2"]),
    ("ray", "split", ["placement=split", "cpu_slots=2"]),
    ("ray", "standalone", ["placement=standalone", "cpu_slots=3"]),
    ("ray", "device map", ["device_map.actor=cpu", "device_map.critic=cpu"]),
    ("ray", "rollout pool", ["placement=actor+critic+ref@1;actor.generate@1", "cpu_slots=2"]),
    ("ray", "split + staleness 1", ["placement=split", "staleness=1", "allow_uncorrected_staleness=true", "cpu_slots=2"]),
]


def run(executor: str, overrides: list[str], out: Path, steps: int) -> tuple[str, float, float]:
    """Train ``steps`` steps of the quickstart config with ``overrides``; (the plan's pools, measured and predicted s/step)."""
    from hybridflow.trainer import Trainer
    from hybridflow.trainer.config_files import load_run_config

    _, config = load_run_config("examples/configs/quickstart.yaml", [
        f"executor={executor}", f"max_steps={steps}", "eval_freq=0", "save_freq=0", "trackers=[console]",
        "log_every=1000", "progress_bar=false", f"output_dir={out}", *overrides])
    trainer = Trainer(config, algorithm="ppo")
    try:
        history = trainer.train()
    finally:
        if executor == "ray" and trainer.executor is not None:
            trainer.executor.shutdown()
    plan = trainer.plan
    pools = "; ".join(f"{p.name}[{len(p.devices)}]: {'+'.join(plan.roles_on(p.name)) or 'generation'}" for p in plan.pools)
    return pools, statistics.median(m["timing_s/step"] for m in history[1:]), plan.predicted_iteration_s or float("nan")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--only", choices=["local", "ray"])
    parser.add_argument("--placement", action="append", choices=sorted({name for _, name, _ in COMBINATIONS}),
                        help="run only the combinations of this name (repeatable; default: all)")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run, e.g. rollout_batch_size=4 n_samples=2")
    args = parser.parse_args(argv)
    chosen = [(k, executor, name, overrides) for k, (executor, name, overrides) in enumerate(COMBINATIONS)
              if args.only in (None, executor) and (not args.placement or name in args.placement)]
    from hybridflow.trainer.run_report import quiet_libraries

    quiet_libraries()
    ray = None
    if any(executor == "ray" for _, executor, _, _ in chosen):
        import os

        import ray

        os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        table(chosen, args)
    finally:
        if ray is not None:
            ray.shutdown()


def table(chosen: list[tuple[int, str, str, list[str]]], args) -> None:
    """Run each chosen (index, executor, name, overrides) combination and print its row."""
    print(f"{'executor':<8} {'placement':<22} {'s/step':>8} {'predicted':>10} {'ratio':>6}  pools")
    with tempfile.TemporaryDirectory() as tmp:
        for k, executor, name, overrides in chosen:
            start = time.perf_counter()
            try:
                pools, measured, predicted = run(executor, [*overrides, *args.overrides], Path(tmp) / f"run{k}", args.steps)
            except Exception as err:  # report and go on: the table says which combinations train
                print(f"{executor:<8} {name:<22} {'-':>8} {'-':>10} {'-':>6}  {type(err).__name__}: {err}")
                continue
            print(f"{executor:<8} {name:<22} {measured:8.3f} {predicted:10.3f} {predicted / measured:6.2f}  {pools}"
                  f"   ({time.perf_counter() - start:.0f} s with start-up)", flush=True)


if __name__ == "__main__":
    main()
