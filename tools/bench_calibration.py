"""Start-up time and peak memory of a run with calibration off, the full (old) profile and the quick (new) one.

Each measurement is a fresh Python process (its peak RSS is its own) that builds a GRPO run on the bench model
(``--size``: tiny, or 10m for the ~8M model of tools/bench_vs_trl.py) as ``hybridflow run`` does,
``Trainer.prepare()``: data, graph, calibration, plan, engines (the run's models loaded); then ``--steps`` training
steps (0: start-up only; 1 or more: the run's own memory peak is in the figure too). Each process gets an empty
calibration cache, so calibration measures (a cached profile costs nothing). The three modes run in interleaved
rounds, in a rotating order: a neighbour's burst of work lands on all of them alike.

Printed per mode: the median over rounds of the start-up wall seconds, the start-up CPU seconds of the process
(user + system: less sensitive to a loaded machine than wall time), the calibration's own wall seconds (the
profiles' ``seconds``), the process's peak RSS, and the ratio of each to calibration off; then the load average
before and after. Modes: ``off`` (calibrate=false), ``old`` (calibrate_quick=false: the whole model at batch sizes
16-512), ``new`` (calibrate_quick=true, the default).

Run: PYTHONPATH=. python tools/bench_calibration.py [--size 10m] [--rounds 3] [--steps 1] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {"off": {"calibrate": False}, "old": {"calibrate": True, "calibrate_quick": False},
         "new": {"calibrate": True, "calibrate_quick": True}}


def child(spec: dict) -> dict:
    """One start-up (and ``steps`` steps) in this process; what it measured."""
    import resource
    import time

    import torch

    from hybridflow import PPOConfig
    from hybridflow.algorithms import GRPOTrainer

    torch.set_num_threads(spec["threads"])
    config = PPOConfig(actor_model_name=spec["model"], output_dir=spec["out"], seed=0, num_threads=spec["threads"],
                       rollout_batch_size=spec["prompts"], n_samples=spec["group"], max_response_length=spec["new_tokens"],
                       max_steps=max(1, spec["steps"]), eval_freq=100000, save_freq=100000, val_samples=1,
                       resume="never", trackers=("jsonl",), progress_bar=False, **MODES[spec["mode"]])
    wall, cpu = time.perf_counter(), time.process_time()
    trainer = GRPOTrainer(config=config)
    trainer.prepare()
    startup_wall, startup_cpu = time.perf_counter() - wall, time.process_time() - cpu
    startup_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if spec["steps"]:
        trainer.train()
    return {"startup_s": startup_wall, "startup_cpu_s": startup_cpu,
            "calibration_s": sum(p.seconds for p, cached in trainer.run_spec.profiles if not cached),
            "startup_rss_mb": startup_rss, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "predicted_step_s": trainer.plan.predicted_iteration_s}


def _model(size: str, folder: Path) -> Path:
    from hybridflow.data import create_tiny_model_dir
    from hybridflow.data.tiny import bench_model_shape

    if not (folder / "config.json").is_file():
        create_tiny_model_dir(folder, task="arithmetic", seed=0, **bench_model_shape(size))
    return folder


def _measure(spec: dict) -> dict:
    env = {**os.environ, "HYBRIDFLOW_CACHE": spec["cache"], "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(spec["threads"]),
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench_calibration: the {spec['mode']} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def extrapolation(model: Path, threads: int, rounds: int) -> None:
    """Print each figure of the quick profile (shallow copies, extrapolated) over the same figure measured on the
    whole model at the same batch sizes: how far the extrapolation is from a measurement (medians over rounds,
    the two profiles alternating)."""
    from hybridflow.compiler.profiling import load_model_config
    from hybridflow.runtime.calibration import profile_model, quick_settings

    settings = quick_settings(load_model_config(model)[0])
    if not settings["depths"]:
        print(f"extrapolation: the model is no deeper than {2} layers: the quick profile measures it whole")
        return
    ratios: dict[str, list[float]] = {}
    for r in range(rounds):
        both = {}
        for depths in ((settings["depths"], None) if r % 2 == 0 else (None, settings["depths"])):
            both[depths is None] = profile_model(model, threads=threads, batch_sizes=settings["batch_sizes"], depths=depths)
        quick, whole = both[False], both[True]
        for name in ("forward_s", "train_s", "prefill_s", "generate_s"):
            for b, q, w in zip(quick.batch_sizes, getattr(quick, name), getattr(whole, name)):
                ratios.setdefault(f"{name[:-2]} b={b}", []).append(q / w)
        ratios.setdefault("train_split", []).append(quick.train_split_s / whole.train_split_s)
        print(f"round {r + 1}: quick profile {quick.seconds:.1f} s, whole model {whole.seconds:.1f} s", flush=True)
    print(f"\nquick (layers {settings['depths']} extrapolated to {quick.model.layers}) / whole model, same batch sizes, "
          f"median over {rounds} round(s):")
    print("  " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in ratios.items()))


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=("tiny", "10m", "100m"), default="tiny",
                   help="the bench model (hybridflow.data.tiny.BENCH_MODELS): tiny (default, cheap) or 10m (~8M)")
    p.add_argument("--modes", default="off,old,new", help="comma-separated modes to run, of off, old, new")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (each runs every mode once)")
    p.add_argument("--steps", type=int, default=0, help="training steps after start-up (0: start-up only)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="responses per prompt")
    p.add_argument("--new-tokens", type=int, default=8, help="response length limit")
    p.add_argument("--out", type=Path, default=None, help="folder for the model and the runs (default: a temporary one)")
    p.add_argument("--extrapolation", action="store_true",
                   help="instead: compare the quick profile's extrapolated figures with the whole model measured at the "
                        "same batch sizes, in this process (--rounds alternating pairs)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        p.error(f"--modes: unknown {unknown}; choose from {sorted(MODES)}")
    if args.rounds < 1 or args.steps < 0:
        p.error("--rounds must be >= 1 and --steps >= 0")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_calibration-"))
    model = _model(args.size, out / f"model_{args.size}")
    if args.extrapolation:
        load_before = _load()
        extrapolation(model, args.threads, args.rounds)
        print(f"load average before: {load_before}; after: {_load()} (on {os.cpu_count()} cores)")
        return 0
    load_before = _load()
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            spec = {"mode": mode, "model": str(model), "out": str(out / f"run_{mode}_{r}"), "cache": str(out / f"cache_{mode}_{r}"),
                    "threads": args.threads, "steps": args.steps, "prompts": args.prompts, "group": args.group,
                    "new_tokens": args.new_tokens}
            results[mode].append(_measure(spec))
            print(f"round {r + 1} {mode}: " + ", ".join(f"{k} {v:.3g}" for k, v in results[mode][-1].items()), flush=True)
    median = {m: {k: statistics.median(run[k] for run in runs) for k in runs[0]} for m, runs in results.items()}
    base = median.get("off")
    print(f"\n{args.size} model, {args.threads} thread(s), {args.rounds} interleaved round(s), {args.steps} step(s), "
          f"{args.prompts} x {args.group} x {args.new_tokens} tokens; medians over rounds")
    print(f"{'mode':5} {'start-up s':>10} {'CPU s':>8} {'calib s':>8} {'start RSS MB':>12} {'peak RSS MB':>11}"
          f"{'  vs off: start-up, CPU, peak RSS' if base else ''}")
    for m, row in median.items():
        ratios = (f"  x{row['startup_s'] / base['startup_s']:.2f}, x{row['startup_cpu_s'] / base['startup_cpu_s']:.2f}, "
                  f"x{row['peak_rss_mb'] / base['peak_rss_mb']:.2f}") if base else ""
        print(f"{m:5} {row['startup_s']:10.2f} {row['startup_cpu_s']:8.2f} {row['calibration_s']:8.2f} "
              f"{row['startup_rss_mb']:12.0f} {row['peak_rss_mb']:11.0f}{ratios}")
    if "old" in median and "new" in median:
        print(f"calibration new / old: wall x{median['new']['calibration_s'] / max(median['old']['calibration_s'], 1e-9):.3f}")
    print(f"load average before: {load_before}; after: {_load()} (on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
