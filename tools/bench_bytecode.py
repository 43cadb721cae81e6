"""CPU of one process importing hybridflow, with and without the checkout's bytecode.

Where ``PYTHONDONTWRITEBYTECODE`` is set (some CI machines and sandboxes), Python never writes ``__pycache__``,
so every process compiles hybridflow's modules from source again; tests/conftest.py therefore writes the
bytecode of ``hybridflow`` and ``hybridflow_ops`` once per session, and each Ray worker and subprocess of the
suite reads it. This measures what that saves per process: it copies the two packages twice into a temporary
folder, compiles one copy, and runs ``python -c "import MODULES"`` against each copy with
``PYTHONDONTWRITEBYTECODE=1``, in interleaved rounds (plain, compiled, compiled, plain), timing each child's CPU
(user + system, from the operating system). It prints the median CPU per process of each side and their ratio.

    python tools/bench_bytecode.py --rounds 5
    python tools/bench_bytecode.py --rounds 1 --modules hybridflow.graph --json
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hybridflow", "hybridflow_ops")
MODULES = "hybridflow.trainer.trainer,hybridflow.runtime.worker,hybridflow.runtime.ray.executor"
"""What a Ray worker or a ``hybridflow run`` subprocess of the suite imports."""


def _copy(into: Path) -> Path:
    into.mkdir(parents=True)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, into / package, ignore=shutil.ignore_patterns("__pycache__"))
    return into


def _child_cpu(source: Path, modules: list[str]) -> float:
    """CPU seconds of one ``python -c "import ..."`` that imports ``modules`` from the copy at ``source``."""
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONDONTWRITEBYTECODE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import " + ", ".join(modules)], check=True, env=env, cwd=source)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(rounds: int, modules: list[str]) -> dict:
    """Median CPU per process importing ``modules`` without (``source_s``) and with (``bytecode_s``) bytecode."""
    with tempfile.TemporaryDirectory(prefix="bench-bytecode-") as tmp:
        plain, compiled = _copy(Path(tmp) / "plain"), _copy(Path(tmp) / "compiled")
        for package in PACKAGES:
            if not compileall.compile_dir(compiled / package, quiet=2):
                raise SystemExit(f"bench_bytecode: {package} does not compile")
        _child_cpu(plain, modules)  # warm the OS's file cache for both sides' libraries
        times: dict[str, list[float]] = {"source_s": [], "bytecode_s": []}
        for _ in range(rounds):
            for side, folder in (("source_s", plain), ("bytecode_s", compiled), ("bytecode_s", compiled),
                                 ("source_s", plain)):
                times[side].append(_child_cpu(folder, modules))
    result = {side: statistics.median(values) for side, values in times.items()}
    result.update(processes_each=2 * rounds, modules=modules,
                  saved_s=result["source_s"] - result["bytecode_s"], ratio=result["bytecode_s"] / result["source_s"])
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (plain, compiled, compiled, plain) (default 5)")
    parser.add_argument("--modules", default=MODULES, help=f"comma-separated modules to import (default {MODULES})")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    result = measure(args.rounds, [m.strip() for m in args.modules.split(",") if m.strip()])
    if args.json:
        print(json.dumps(result))
    else:
        print(f"import {', '.join(result['modules'])}: {result['processes_each']} processes each side, median CPU")
        print(f"  from source   {result['source_s']:.3f} s")
        print(f"  from bytecode {result['bytecode_s']:.3f} s")
        print(f"  bytecode / source: {result['ratio']:.2f} ({result['saved_s']:.3f} s of CPU saved per process)")
    return result


if __name__ == "__main__":
    main()
