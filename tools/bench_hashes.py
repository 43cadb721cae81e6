"""Benchmark: what ``record_hashes`` adds to a step.

    python tools/bench_hashes.py                      # the quickstart's run (examples/configs/quickstart.yaml), 40 steps
    python tools/bench_hashes.py --steps 20 --json    # quicker, one JSON line
    python tools/bench_hashes.py algorithm=grpo n_samples=8   # any run file override

One trainer of the run file (with the overrides) runs ``--steps`` steps after ``--warmup`` uncounted ones, with
the value hashes on and off in turn (on, off, off, on, ...: drift falls on both alike), in the same process and
on the same evolving weights. Each step is timed on the wall clock and on the process's CPU time
(``time.process_time``: with one torch thread, what the step computed, barely touched by other processes on a
shared machine). Printed: the median step of each side, the overhead ``median(on) / median(off) - 1`` on both
clocks (and the median of the neighbouring pairs' ratios, steadier under drift), and the direct cost, the median time of :meth:`ValueHashes.record` alone (the only work record_hashes
adds) over the median step without it, with the lines it writes per step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed_hashes():
    """ValueHashes that keep the seconds of each record() call (the work record_hashes adds to a step)."""
    from hybridflow.trainer.run_record import ValueHashes

    class TimedHashes(ValueHashes):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seconds: list[float] = []
            self.lines = 0

        def record(self, step, env):
            start = time.perf_counter()
            self.lines = super().record(step, env)
            self.seconds.append(time.perf_counter() - start)
            return self.lines

    return TimedHashes


def main(argv: list[str] | None = None) -> int:
    from hybridflow.trainer import Trainer
    from hybridflow.trainer.config_files import load_run_config
    from hybridflow.trainer.run_report import quiet_libraries

    TimedHashes = timed_hashes()

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="run file overrides")
    parser.add_argument("--config", default=str(ROOT / "examples" / "configs" / "quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=40, help="counted steps, half with hashes (default 40)")
    parser.add_argument("--warmup", type=int, default=4, help="uncounted steps first (default 4)")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-hashes-") as scratch:
        overrides = [*args.overrides, f"output_dir={scratch}/run", "trackers=[]", "progress_bar=false", "save_freq=0",
                     "eval_freq=0", f"max_steps={args.steps + args.warmup}"]
        algorithm, config = load_run_config(args.config, overrides)
        quiet_libraries()
        trainer = Trainer(config, algorithm=algorithm)
        trainer.prepare()
        hashes = TimedHashes(Path(scratch) / "hashes.jsonl", plan=trainer.plan)
        wall: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for k in range(args.warmup + args.steps):
            on = (k - args.warmup) % 4 in (0, 3)  # on, off, off, on, ...
            trainer.value_hashes = hashes if on else None
            trainer.step += 1
            rows = trainer.loader.next_batch()
            w0, c0 = time.perf_counter(), time.process_time()
            trainer.train_step(rows)
            w1, c1 = time.perf_counter(), time.process_time()
            if k < args.warmup:
                del hashes.seconds[:]
                continue
            wall[on].append(w1 - w0)
            cpu[on].append(c1 - c0)
        record_s = hashes.seconds

    def overhead(side: dict[bool, list[float]]) -> float:
        return statistics.median(side[True]) / statistics.median(side[False]) - 1.0

    def paired(side: dict[bool, list[float]]) -> float:
        """The median over neighbouring (on, off) pairs of on / off - 1: each block on, off, off, on gives two."""
        return statistics.median(a / b for a, b in zip(side[True], side[False])) - 1.0

    figures = {
        "steps_each": len(wall[True]),
        "wall_on_s": statistics.median(wall[True]), "wall_off_s": statistics.median(wall[False]),
        "wall_overhead": overhead(wall), "wall_paired": paired(wall), "cpu_paired": paired(cpu),
        "cpu_on_s": statistics.median(cpu[True]), "cpu_off_s": statistics.median(cpu[False]),
        "cpu_overhead": overhead(cpu), "record_s": statistics.median(record_s), "lines_per_step": hashes.lines,
        "record_share": statistics.median(record_s) / statistics.median(wall[False]),
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"{figures['steps_each']} steps each, interleaved (on, off, off, on, ...):")
    print(f"  wall: on {figures['wall_on_s']:.4f} s, off {figures['wall_off_s']:.4f} s per step: "
          f"overhead {figures['wall_overhead']:+.1%} (median of the pairs' ratios {figures['wall_paired']:+.1%})")
    print(f"  cpu:  on {figures['cpu_on_s']:.4f} s, off {figures['cpu_off_s']:.4f} s per step: "
          f"overhead {figures['cpu_overhead']:+.1%} (median of the pairs' ratios {figures['cpu_paired']:+.1%})")
    print(f"  record() alone: {figures['record_s'] * 1e3:.2f} ms for {figures['lines_per_step']} tensors = "
          f"{figures['record_share']:.2%} of a step without hashes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
