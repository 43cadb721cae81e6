"""Benchmark: weight-sync transitions on the RayExecutor against a raw ``state_dict()`` copy of the same model.

    .venv/bin/python tools/bench_weight_sync.py               # ~120 MB model, 5 repeats (~2 min)
    .venv/bin/python tools/bench_weight_sync.py --hidden 256  # ~30 MB, quicker

The model is a tiny-vocabulary qwen2 (``--hidden``, ``--layers``; float32). Figures,
each the median of ``--repeats`` syncs after one warm-up, timed inside the workers
(first start to last end over the ranks taking part):

* **raw copy** — ``dst[k].copy_(src[k])`` for every entry of ``model.state_dict()``
  into a second model, in one process with one torch thread: the least any
  transition must do;
* **hybrid engine, dp=1** — the transition of a colocated actor whose rollout engine
  holds its own copy of the weights: full tensors streamed into the rollout engine in
  buckets (``--bucket-mb``), what the plan's ``weight_sync`` op runs. Goal: <= 1.2x raw;
* **hybrid engine, dp=2 (FSDP2)** — the same on two ranks: every tensor is first
  all-gathered from the shards (gloo over loopback TCP on this CPU machine; NVLink
  and NCCL on GPUs), then streamed;
* **cross-pool broadcast** — trainer (one rank) to a generation pool of one rank:
  the bucketed broadcast over their process group (gloo here).

Each worker runs pinned to one core when the machine has enough (``pin_cpus``).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch


def model(args):
    from hybridflow.data import make_tiny_model, make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer("arithmetic")
    return make_tiny_model("qwen2", vocab_size=len(tokenizer), hidden=args.hidden, layers=args.layers, heads=8,
                           kv_heads=2, seed=0), tokenizer


def raw_copy_s(module, repeats: int) -> float:
    target = copy.deepcopy(module).state_dict()
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with torch.no_grad():
            for name, tensor in module.state_dict().items():
                target[name].copy_(tensor)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def plan_for(graph, module, spec: str):
    """``graph`` placed by ``spec`` on two CPU slots of a local Ray instance, compiled for ``module``'s sizes
    and bound to the slots (executors run bound plans only)."""
    from hybridflow.compiler import Machine, ModelSpec, compile_for

    actor = ModelSpec.from_config(module.config.to_dict(), name="actor")
    return compile_for(graph, actor, machine=Machine("cpu", 2, threads_per_slot=1, where="ray"), placement=spec)


def sync_s(executor, repeats: int) -> tuple[float, float]:
    """Median seconds of the plan's weight sync (worker clocks) and megabytes it moved."""
    import ray

    from hybridflow.runtime.topology import sync_group

    op = next(op for op in executor.plan.ops if op.kind == "weight_sync")
    times, moved = [], 0.0
    for _ in range(repeats + 1):
        if op.target_pool and op.target_pool != op.pool:
            senders, receivers = executor.topology.pool_slots(op.pool), executor.topology.pool_slots(op.target_pool)
            group, src = sync_group(op.role, op.pool, op.target_pool), senders[0].global_rank
            refs = [executor.actor(s).send_weights.remote(op.role, group, src) for s in senders]
            refs += [executor.actor(s).receive_weights.remote(op.role, group, src) for s in receivers]
        else:
            refs = [executor.actor(s).sync_weights.remote(op.role) for s in executor.topology.pool_slots(op.pool)]
        results = ray.get(refs)
        starts, ends = zip(*(span for _, span in results))
        times.append(max(ends) - min(starts))
        moved = max(stats.bytes for stats, _ in results) / 2**20
    return statistics.median(times[1:]), moved


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=32.0)
    return parser.parse_args(argv)


CASES = {"hybrid engine, dp=1": "actor+reward@1",
         "hybrid engine, dp=2 (FSDP2)": "actor(dp2,tp1,pp1)+reward@2",
         "cross-pool broadcast 1 -> 1": "actor+reward@1;actor.generate@1"}
"""The transitions measured: name -> placement of the RLOO graph."""


def setup(args):
    """The model, the role specs and a plan per transition of :data:`CASES`; nothing here needs Ray."""
    from hybridflow.algorithms import ALGORITHMS
    from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig
    from hybridflow.runtime.roles import RoleSpec
    from hybridflow_ops.rewards.arithmetic import compute_score

    module, tokenizer = model(args)
    graph = ALGORITHMS["rloo"].build()
    specs = {"actor": RoleSpec(model=module, tokenizer=tokenizer, sampling=SamplingParams(max_new_tokens=2),
                               train=TrainEngineConfig(precision="fp32", num_threads=1), share_rollout_module=False),
             "reward": RoleSpec(reward=compute_score, tokenizer=tokenizer)}
    return module, specs, {name: plan_for(graph, module, spec) for name, spec in CASES.items()}


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)

    import ray

    from hybridflow.runtime.ray import RayExecutor

    module, specs, plans = setup(args)
    nbytes = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    raw = raw_copy_s(module, args.repeats)
    cpus = os.cpu_count() or 1
    ray.init(address="local", num_cpus=max(cpus, 4), include_dashboard=False, log_to_driver=False)
    print(f"model: {nbytes / 2**20:.1f} MB float32 ({args.hidden} hidden, {args.layers} layers); "
          f"buckets of {args.bucket_mb:g} MB; raw state_dict copy {raw * 1e3:.1f} ms")
    print(f"{'transition':<30} {'ms':>9} {'MB moved':>9} {'x raw copy':>11}")
    try:
        for name, plan in plans.items():
            pins = {pool.name: (i % cpus,) for i, pool in enumerate(plan.pools)}
            with RayExecutor(plan, specs, bucket_bytes=int(args.bucket_mb * 2**20), pin_cpus=pins) as executor:
                seconds, moved = sync_s(executor, args.repeats)
            print(f"{name:<30} {seconds * 1e3:>9.1f} {moved:>9.1f} {seconds / raw:>10.2f}x")
    finally:
        ray.shutdown()
    print("goal: the hybrid-engine transition <= 1.2x the raw copy")


if __name__ == "__main__":
    main()
