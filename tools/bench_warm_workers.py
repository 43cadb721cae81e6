"""Warm workers: several short Ray runs in one process, with their slots kept between runs against started anew.

``hybridflow.runtime.ray.warm.keep_workers(True)`` parks the slots of a run that ends healthy and the next run of
the same pool shapes takes them (no process start, no imports). This tool times ``--runs`` consecutive runs of the
grpo_arith config (``executor=ray``, the tiny built-in model unless ``--model`` names one, ``--steps`` steps each)
with keeping off and on, alternating which goes first in each of ``--rounds`` rounds, on one Ray instance started
here; it prints every run's wall seconds, each sequence's total and the ratio off / on per round with its median.
The first run of an "on" sequence starts its workers as an "off" run does; the gain is in the runs after it.

    python tools/bench_warm_workers.py                  # 3 rounds of 3 runs of 2 steps
    python tools/bench_warm_workers.py --runs 5 --steps 1
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def one_run(model_dir: str, out: Path, steps: int) -> float:
    """Wall seconds of one run: its trainer built, trained and its executor shut down (parked or stopped)."""
    from hybridflow.trainer import Trainer
    from hybridflow.trainer.config_files import load_run_config

    start = time.perf_counter()
    algorithm, config = load_run_config("examples/configs/grpo_arith.yaml", [
        f"actor_model_name={model_dir}", "executor=ray", "placement=colocate", f"max_steps={steps}",
        "rollout_batch_size=4", "n_samples=2", "max_response_length=4", "eval_freq=0", "save_freq=0", "val_samples=1",
        "trackers=[jsonl]", "progress_bar=false", "calibrate=false", "num_threads=1", f"output_dir={out}"])
    trainer = Trainer(config, algorithm=algorithm)
    try:
        trainer.train()
    finally:
        if trainer.executor is not None:
            trainer.executor.shutdown()
    return time.perf_counter() - start


def sequence(keep: bool, model_dir: str, work: Path, args) -> list[float]:
    from hybridflow.runtime.ray.warm import keep_workers, stop_parked

    keep_workers(keep)
    try:
        return [one_run(model_dir, work / f"{'on' if keep else 'off'}{i}", args.steps) for i in range(args.runs)]
    finally:
        keep_workers(False)
        stop_parked()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each times an off and an on sequence")
    parser.add_argument("--runs", type=int, default=3, help="consecutive runs in a sequence")
    parser.add_argument("--steps", type=int, default=2, help="training steps of each run")
    parser.add_argument("--model", default=None, help="the actor's model folder (default: the tiny built-in model)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    ratios = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            model_dir = args.model
            if model_dir is None:
                from hybridflow.data import create_tiny_model_dir

                model_dir = str(create_tiny_model_dir(work / "tiny", seed=0))
            for r in range(args.rounds):
                totals = {}
                for keep in ((False, True) if r % 2 == 0 else (True, False)):
                    runs = sequence(keep, model_dir, work / f"round{r}", args)
                    totals[keep] = sum(runs)
                    print(f"round {r} keep {'on ' if keep else 'off'}: runs " + " ".join(f"{s:.2f}" for s in runs)
                          + f" s, total {totals[keep]:.2f} s", flush=True)
                ratios.append(totals[False] / totals[True])
                print(f"round {r}: off / on = {ratios[-1]:.2f}x", flush=True)
    finally:
        ray.shutdown()
    print(f"\n{args.runs} runs of {args.steps} steps: kept workers {statistics.median(ratios):.2f}x faster than started "
          f"anew (median of {len(ratios)} rounds: {', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
