"""Predicted vs measured step time on this machine, with the cost model calibrated to it.

For GRPO (examples/configs/grpo_arith.yaml) and PPO (examples/configs/quickstart.yaml)
on the tiny model: train ``--steps`` steps as ``hybridflow run`` does — the
trainer calibrates this machine's cluster to the model
(:func:`hybridflow.runtime.calibration.calibrate`), compiles the graph for it
with the run's batch shape and runs that plan — and print each op's predicted
seconds (the plan's) against its measured median span, and the step's.

Run: PYTHONPATH=. python tools/bench_predicted.py [--steps 20] [--threads 1] [--no-cache] [OVERRIDE ...]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from hybridflow.data import create_tiny_model_dir
from hybridflow.trainer import Trainer
from hybridflow.trainer.config_files import load_run_config
from hybridflow.trainer.run_report import predicted_vs_measured, quiet_libraries

CONFIGS = {"grpo": "examples/configs/grpo_arith.yaml", "ppo": "examples/configs/quickstart.yaml"}


def bench(algorithm: str, model_dir: Path, out: Path, steps: int, threads: int, cache: bool,
          extra: list[str]) -> tuple[float, float]:
    """Train ``steps`` steps of ``algorithm`` on the plan the trainer compiled (calibrated), print the table;
    returns (predicted, measured) step seconds."""
    if not cache:
        import os

        os.environ["HYBRIDFLOW_CACHE"] = str(out / "cache")  # an empty cache: profile again
    _, config = load_run_config(CONFIGS[algorithm], [
        f"actor_model_name={model_dir}", f"output_dir={out / algorithm}", f"max_steps={steps}", f"num_threads={threads}",
        "eval_freq=100000", "save_freq=100000", "log_every=100000", "resume=never", "overwrite=true",
        "trackers=[console]", "progress_bar=false", "calibrate=true", *extra])
    trainer = Trainer(config, algorithm=algorithm)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    plan = trainer.plan
    spans = [s for s in trainer.executor.recorder.spans if s.iteration >= 1]  # iteration 0 warms up
    print(f"\n== {algorithm}: {steps} steps in {wall:.1f} s (with compile and calibration), placement {plan.strategy} "
          f"on {plan.machine}")
    print(predicted_vs_measured(plan, spans))
    iterations = {}
    for s in spans:
        first, last = iterations.get(s.iteration, (s.start, s.end))
        iterations[s.iteration] = (min(first, s.start), max(last, s.end))
    measured = sorted(e - b for b, e in iterations.values())[len(iterations) // 2]
    return plan.predicted_iteration_s, measured


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-cache", action="store_true", help="profile again instead of reading the cache")
    parser.add_argument("--only", choices=sorted(CONFIGS), help="run one algorithm")
    parser.add_argument("overrides", nargs="*", help="config overrides for both runs, e.g. placement=colocate cpu_slots=1")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet_libraries()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        model_dir = create_tiny_model_dir(out / "model", task="arithmetic", seed=0, hidden=64, layers=2, heads=4, kv_heads=2)
        results = {name: bench(name, model_dir, out, args.steps, args.threads, not args.no_cache, args.overrides)
                   for name in ([args.only] if args.only else CONFIGS)}
    print("\nstep time, predicted vs measured (median span of an iteration):")
    for name, (pred, meas) in results.items():
        print(f"  {name:<5} {pred:.4f} s vs {meas:.4f} s  ratio {pred / meas:.2f}  ({abs(pred / meas - 1):.0%} off)")


if __name__ == "__main__":
    main()
