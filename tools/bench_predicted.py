"""Predicted vs measured step time on this machine, with the cost model calibrated to it.

For GRPO (examples/configs/grpo_arith.yaml) and PPO (examples/configs/quickstart.yaml)
on the tiny model: calibrate the ``cpu-local`` cluster to the model
(:func:`hybridflow.compiler.calibrate.calibrate`), compile the algorithm's graph
for it with the run's batch shape, train ``--steps`` steps with the local
executor, and print each op's predicted seconds against its measured median
span, and the step's.

Run: PYTHONPATH=. python tools/bench_predicted.py [--steps 20] [--threads 1] [--no-cache]
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from hybridflow.compiler import ClusterSpec, ModelSpec
from hybridflow.compiler.calibrate import calibrate, engine_cost_options
from hybridflow.compiler.compile import compile
from hybridflow.compiler.passes import BatchShape
from hybridflow.data import create_tiny_model_dir, make_prompt_batch
from hybridflow.trainer import Trainer
from hybridflow.trainer.config_files import load_run_config
from hybridflow.trainer.run_report import predicted_vs_measured, quiet_libraries

CONFIGS = {"grpo": "examples/configs/grpo_arith.yaml", "ppo": "examples/configs/quickstart.yaml"}


def batch_shape(trainer: Trainer) -> tuple[BatchShape, object]:
    """The run's BatchShape (prompts: the rollout batch; the graph's n multiplies it) and its cost options."""
    cfg = trainer.config
    prompts = make_prompt_batch(trainer.train_rows[:cfg.rollout_batch_size], trainer.tokenizer,
                                max_prompt_length=cfg.max_prompt_length, apply_chat_template=cfg.apply_chat_template)
    sequences = cfg.rollout_batch_size * cfg.n_samples
    mini = cfg.batch_size or sequences
    shape = BatchShape(prompts=cfg.rollout_batch_size, prompt_len=prompts["prompt_ids"].shape[1],
                       response_len=trainer.max_response_length, epochs=cfg.ppo_epochs,
                       mini_batches=math.ceil(sequences / mini))
    options = engine_cost_options(train_micro_batch=cfg.micro_batch_size or mini,
                                  infer_micro_batch=cfg.micro_batch_size or sequences)
    return shape, options


def bench(algorithm: str, model_dir: Path, out: Path, steps: int, threads: int, cache: bool) -> tuple[float, float]:
    """Train ``steps`` steps of ``algorithm``, print the table; returns (predicted, measured) step seconds."""
    _, config = load_run_config(CONFIGS[algorithm], [
        f"actor_model_name={model_dir}", f"output_dir={out / algorithm}", f"max_steps={steps}", f"num_threads={threads}",
        "eval_freq=100000", "save_freq=100000", "log_every=100000", "resume=never", "overwrite=true",
        "trackers=[console]", "progress_bar=false"])
    trainer = Trainer(config, algorithm=algorithm)
    start = time.perf_counter()
    cluster = calibrate(ClusterSpec.preset("cpu-local"), {"actor": model_dir}, threads=threads, cache=cache)
    calibration_s = time.perf_counter() - start
    trainer.train()
    shape, options = batch_shape(trainer)
    spec = ModelSpec.from_config(json.loads((model_dir / "config.json").read_text()), name="tiny")
    models = {r.name: ("rule" if r.kind == "reward" else spec) for r in trainer.graph.roles}
    plan = compile(trainer.graph, cluster, models, placement="colocate", batch=shape, options=options)
    spans = [s for s in trainer.executor.recorder.spans if s.iteration >= 1]  # iteration 0 warms up
    print(f"\n== {algorithm}: {steps} steps, {shape.prompts} prompts x {config.n_samples} samples, prompt_len "
          f"{shape.prompt_len}, response_len {shape.response_len}; calibration {calibration_s:.1f} s")
    print(predicted_vs_measured(plan, spans))
    walls = sorted(m["timing_s/step"] for m in trainer.history[1:])
    print(f"trainer timing_s/step median {walls[len(walls) // 2]:.4f} s")
    iterations = {}
    for s in spans:
        first, last = iterations.get(s.iteration, (s.start, s.end))
        iterations[s.iteration] = (min(first, s.start), max(last, s.end))
    measured = sorted(e - b for b, e in iterations.values())[len(iterations) // 2]
    return plan.predicted_iteration_s, measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-cache", action="store_true", help="profile again instead of reading the cache")
    parser.add_argument("--only", choices=sorted(CONFIGS), help="run one algorithm")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quiet_libraries()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        model_dir = create_tiny_model_dir(out / "model", task="arithmetic", seed=0, hidden=64, layers=2, heads=4, kv_heads=2)
        results = {name: bench(name, model_dir, out, args.steps, args.threads, not args.no_cache)
                   for name in ([args.only] if args.only else CONFIGS)}
    print("\nstep time, predicted vs measured (median span of an iteration):")
    for name, (pred, meas) in results.items():
        print(f"  {name:<5} {pred:.4f} s vs {meas:.4f} s  ratio {pred / meas:.2f}  ({abs(pred / meas - 1):.0%} off)")


if __name__ == "__main__":
    main()
