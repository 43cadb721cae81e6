"""Benchmark: how much a busy neighbour process slows a GRPO step, with torch's default threads and with ours.

    python tools/bench_neighbour.py                    # 2 rounds, 30 steps per run
    python tools/bench_neighbour.py --steps 20 --json

Each run is a fresh process training GRPO on the built-in task (tiny model, 8 prompts x 8,
8 new tokens, no validation), timed by its ``timing_s/step`` (median, first 3 steps left out).
Two thread settings:

- ``all-cores``: ``num_threads`` = the machine's cores, which is what torch picks by itself
  (the behaviour before :mod:`hybridflow.runtime.threads`);
- ``auto``: ``num_threads`` unset, so the trainer chooses (its slot's share, minus the cores
  other processes keep busy).

Each setting runs alone and beside a *neighbour*: ``--burners`` processes spinning a Python
loop, started by this tool right before the run and stopped right after it (each also ends
by itself after ``--burn-limit-s``). Runs alternate (alone, beside, per setting, per round).
Printed: per setting, median s/step alone and beside the neighbour, and the slowdown.
Other load on the machine falls on both; the "alone" runs are not on an idle machine when
other work shares it, which the printed load average says.
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

ROOT = Path(__file__).resolve().parent.parent

RUN = """
import json, sys
from hybridflow import PPOConfig
from hybridflow.algorithms import GRPOTrainer
threads = None if sys.argv[2] == 'auto' else int(sys.argv[2])
cfg = PPOConfig(output_dir=sys.argv[1], num_threads=threads, rollout_batch_size=8, n_samples=8, max_response_length=8,
                actor_lr=2e-3, kl_coef=0.0, max_steps=int(sys.argv[3]), eval_freq=0, trackers=(), progress_bar=False,
                resume='never', calibrate=False)
trainer = GRPOTrainer(config=cfg)
trainer.validate = lambda: {}
history = trainer.train()
import torch
print(json.dumps({'times': [m['timing_s/step'] for m in history], 'threads': torch.get_num_threads()}))
"""

BURN = "import time\nend = time.time() + {limit}\nwhile time.time() < end: pass\n"


def one_run(threads: str, steps: int, burners: int, limit: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    env.pop("OMP_NUM_THREADS", None)
    hogs = [subprocess.Popen([sys.executable, "-c", BURN.format(limit=limit)]) for _ in range(burners)]
    try:
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run([sys.executable, "-c", RUN, out, threads, str(steps)], env=env, capture_output=True,
                                  text=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    if done.returncode:
        raise SystemExit(f"run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip", type=int, default=3, help="first steps of a run left out")
    parser.add_argument("--burners", type=int, default=1, help="busy-loop processes of the neighbour")
    parser.add_argument("--burn-limit-s", type=float, default=300.0, help="each burner ends by itself after this")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    settings = {"all-cores": str(cores), "auto": "auto"}
    times = {(s, n): [] for s in settings for n in ("alone", "beside")}
    used = {}
    load = os.getloadavg()[0]
    for _ in range(args.rounds):
        for name, threads in settings.items():
            for where in ("alone", "beside"):
                record = one_run(threads, args.steps, args.burners if where == "beside" else 0, args.burn_limit_s)
                times[(name, where)] += record["times"][args.skip:]
                used[(name, where)] = record["threads"]
    result = {"cores": cores, "load_average_at_start": round(load, 2), "burners": args.burners, "settings": {}}
    for name in settings:
        alone, beside = statistics.median(times[(name, "alone")]), statistics.median(times[(name, "beside")])
        result["settings"][name] = {"alone_s": round(alone, 4), "beside_s": round(beside, 4),
                                    "slowdown": round(beside / alone, 2),
                                    "threads_alone": used[(name, "alone")], "threads_beside": used[(name, "beside")]}
    if args.json:
        print(json.dumps(result))
        return result
    print(f"GRPO step beside {args.burners} busy process(es), {cores} cores, load average {load:.1f} at the start, "
          f"{args.rounds} round(s) of {args.steps} steps")
    for name, r in result["settings"].items():
        print(f"  {name:10} alone {r['alone_s'] * 1e3:7.1f} ms ({r['threads_alone']} thr), beside "
              f"{r['beside_s'] * 1e3:7.1f} ms ({r['threads_beside']} thr) -> {r['slowdown']:.2f}x")
    return result


if __name__ == "__main__":
    main()
