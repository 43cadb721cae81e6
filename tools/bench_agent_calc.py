"""Learning of the agent_calc task over seeds: held-out greedy accuracy before and after RL, with and without the tool.

Runs ``examples/agent_calc/train.py`` once per seed, one run at a time, each in a process of its own
with one torch thread, and prints a table from each run's curve.json: greedy accuracy after the
warm-up (step 0) and at the end, the RL steps, the RL seconds (sum of step times) and the wall time
of the whole run (warm-up included). ``--no-tool`` runs the same task without the calculator.

Run: python tools/bench_agent_calc.py [--seeds 0 1 2 3 4] [--max-time 900] [--no-tool] [--out runs/bench_agent_calc]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--max-time", type=float, default=900, help="RL wall-time budget per run, seconds")
    parser.add_argument("--no-tool", action="store_true", help="the baseline without the calculator")
    parser.add_argument("--out", default="runs/bench_agent_calc")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more arguments for train.py")
    args = parser.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    rows = []
    for seed in args.seeds:
        out = Path(args.out) / f"{'no_tool' if args.no_tool else 'tool'}_seed{seed}"
        command = [sys.executable, str(ROOT / "examples" / "agent_calc" / "train.py"), "--out", str(out),
                   "--seed", str(seed), "--max-time", str(args.max_time), *(["--no-tool"] if args.no_tool else []),
                   *args.extra]
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        summary = json.loads((out / "curve.json").read_text())
        rows.append(summary)
        print(f"seed {seed}: {'tool' if summary['tool'] else 'no tool'}  greedy {summary['initial_accuracy']:.2f} -> "
              f"{summary['final_accuracy']:.2f}  in {summary['steps']} steps, RL {summary['rl_s']:.0f} s, "
              f"wall {summary['wall_s']:.0f} s", flush=True)
    return rows


if __name__ == "__main__":
    main()
