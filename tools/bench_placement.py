"""Benchmark: wall time of the automatic placement search (PPO, four roles of one model).

    .venv/bin/python tools/bench_placement.py                      # llama2-70b on 128 and 1,024 A100-80G
    .venv/bin/python tools/bench_placement.py --model llama2-7b --gpus 16 128 --cluster h100-80g
    .venv/bin/python tools/bench_placement.py --engine fsdp,megatron   # the search chooses each role's engine

Each size runs in a fresh process state (the module-level caches are cleared
first), so the time includes building every per-(role, device count)
candidate; the search then also prices the three fixed strategies. Targets
(issue 4): < 5 s on 128 GPUs, < 60 s on 1,024, on one CPU core.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time


def clear_caches() -> None:
    """Forget every lru_cache of the compiler, so each run starts cold."""
    import functools

    for obj in gc.get_objects():
        if isinstance(obj, functools._lru_cache_wrapper) and obj.__module__.startswith("hybridflow.compiler"):
            obj.cache_clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama2-70b", help="model preset for all four PPO roles")
    parser.add_argument("--gpus", type=int, nargs="+", default=[128, 1024], help="cluster sizes (multiples of the node size)")
    parser.add_argument("--cluster", default="a100-80g", help="cluster preset")
    parser.add_argument("--engine", default="fsdp", help="training engines the roles may use, comma-separated (fsdp, megatron)")
    parser.add_argument("--workload", default="default", help="workload preset (default, paper)")
    args = parser.parse_args(argv)

    from hybridflow.compiler.cluster import ClusterSpec
    from hybridflow.compiler.placement import search
    from hybridflow.compiler.workload import paper_workload

    base = ClusterSpec.preset(args.cluster)
    engines = tuple(e.strip() for e in args.engine.split(",") if e.strip())
    workload = paper_workload(args.model, args.workload).with_engines(engines)
    for gpus in args.gpus:
        cluster = base.with_nodes(gpus // base.devices_per_node)
        clear_caches()
        wall, cpu = time.perf_counter(), time.process_time()
        result = search(workload, cluster)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{args.model} PPO on {cluster.num_devices} x {args.cluster}, engine {args.engine}: search {wall:.2f} s wall, {cpu:.2f} s CPU; "
              f"iteration {result.best.iteration_s:.1f} s")
        print("  " + result.best.placement.describe().replace("\n", "\n  "))
        for name, fixed in result.fixed:
            print(f"  {name:<10} {fixed.iteration_s if fixed else float('inf'):8.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
