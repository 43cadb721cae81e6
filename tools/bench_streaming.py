"""Benchmark: streamed rollouts (``stream_rollouts``) against whole-batch rollouts, GRPO steps of one run.

    .venv/bin/python tools/bench_streaming.py                      # Ray, 2 pools, 4 interleaved rounds (~2 min)
    .venv/bin/python tools/bench_streaming.py --rounds 8           # steadier
    .venv/bin/python tools/bench_streaming.py --executor local     # one process: no pools run at once (ratio ~1)

Workload: GRPO (``n=4``, KL loss, so the actor's and the reference's log-probs follow the rollout) on a tiny
qwen2 model with random weights, sampled with EOS on: whether a response ends at a step is the model's draw,
so response lengths spread from 1 to ``--new-tokens`` (64 by default; the run prints their spread). With
``--executor ray`` the rollout has a pool of its own (placement ``actor+ref+reward@1;actor.generate@1``) and
each pool is pinned to a core of its own: streamed, the log-probs and scores of the groups that ended early
run on the train pool while the rollout pool still decodes the long ones; whole-batch, they wait for the
longest response.

Both plans run on one executor (the same workers; the streamed plan is the compiled plan with its generate op
marked, run with ``run_plan``), their steps interleaved (whole, streamed, whole, ...) so that a change of the
machine's load, and the model's drift as it trains, hit both alike. Printed: the spread of response lengths, the median
step time of each and their ratio (whole-batch / streamed: > 1 means streaming is faster). The machine is
shared: read the ratio of one run, not its seconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def workload(args):
    """GRPO's graph, the role specs of one executor (fresh models from fixed seeds) and a prompt batch per step."""
    from hybridflow.algorithms import grpo
    from hybridflow.data import make_prompt_batch, make_tiny_model, make_tiny_tokenizer
    from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
    from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig
    from hybridflow.runtime.roles import RoleSpec
    from hybridflow_ops.rewards.arithmetic import compute_score

    tokenizer = make_tiny_tokenizer("arithmetic")

    def specs():
        model = make_tiny_model("qwen2", vocab_size=len(tokenizer), hidden=args.hidden, layers=args.layers, heads=4,
                                kv_heads=2, seed=0)
        ref = make_tiny_model("qwen2", vocab_size=len(tokenizer), hidden=args.hidden, layers=args.layers, heads=4,
                              kv_heads=2, seed=0)
        sampling = SamplingParams(max_new_tokens=args.new_tokens, seed=0)
        train = TrainEngineConfig(lr=1e-4, precision="fp32", num_threads=1)
        return {"actor": RoleSpec(model=model, tokenizer=tokenizer, sampling=sampling, train=train),
                "ref": RoleSpec(model=ref), "reward": RoleSpec(reward=compute_score, tokenizer=tokenizer)}

    rows = make_arithmetic_rows()
    batches = [{"prompts": make_prompt_batch([rows[(i * args.prompts + j) % len(rows)] for j in range(args.prompts)],
                                             tokenizer)} for i in range(args.rounds + args.warmup)]
    return grpo.build(n=4), specs, batches


def plans(graph, specs, batches, args):
    """The whole-batch and the streamed plan (the same plan, its generate op marked) for this run's shape."""
    from hybridflow.compiler import Machine, ModelSpec, compile_for, local_machine
    from hybridflow.compiler.passes import BatchShape
    from hybridflow.runtime.streaming import mark_streaming

    actor = ModelSpec.from_config(specs()["actor"].model.config.to_dict(), name="actor")
    shape = BatchShape(prompts=args.prompts, prompt_len=batches[0]["prompts"]["prompt_ids"].shape[1],
                       response_len=args.new_tokens, mini_batches=1)
    if args.executor == "ray":
        machine, placement = Machine("cpu", 2, threads_per_slot=1, where="ray"), "actor+ref+reward@1;actor.generate@1"
    else:
        machine, placement = local_machine(1), {"actor": "cpu", "ref": "cpu", "reward": "cpu"}
    plain = compile_for(graph, actor, machine=machine, placement=placement, batch=shape)
    return plain, mark_streaming(plain)


def executor_for(plan, specs, args):
    if args.executor == "local":
        from hybridflow.runtime.local import LocalExecutor

        return LocalExecutor(plan, specs(), seed=0)
    from hybridflow.runtime.ray import RayExecutor

    generation = next(p.generation_pool for p in plan.placements if p.generation_pool)
    cores = os.cpu_count() or 1
    pins = {p.name: (0 if p.name == generation else cores - 1,) for p in plan.pools}
    return RayExecutor(plan, specs(), pin_cpus=pins, seed=0)


def measure(args) -> dict:
    """Interleaved steps of both plans on one executor (the same pools and workers: a streamed step is the
    executor's plan with its generate op marked, run through ``run_plan``); returns step times per plan and the
    response lengths seen."""
    graph, specs, batches = workload(args)
    compiled = dict(zip(("whole", "streamed"), plans(graph, specs, batches, args)))
    executor = executor_for(compiled["whole"], specs, args)
    times: dict[str, list[float]] = {name: [] for name in compiled}
    parts: dict[str, list[float]] = {"generation": [], "region": []}
    lengths: list[int] = []
    try:
        for i, batch in enumerate(batches):
            for name, plan in compiled.items():
                start = time.perf_counter()
                seen = len(executor.side_spans)
                result = executor.run_plan(plan, batch)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - start)
                    if name == "whole":
                        split = _split(executor.side_spans[seen:], plan)
                        parts["generation"].append(split[0])
                        parts["region"].append(split[1])
                lengths += result.env["actor.generate"]["response_mask"].sum(-1).int().tolist()
    finally:
        if hasattr(executor, "shutdown"):
            executor.shutdown()
    return {"times": times, "lengths": lengths, "parts": parts}


def _split(spans, plan) -> tuple[float, float]:
    """Seconds of the whole-batch step's generation and of the ops streaming would run per piece (pool spans)."""
    from hybridflow.runtime.streaming import streamed_region

    generate = next(op for op in plan.ops if op.kind == "node" and plan.graph.node(op.node).kind == "generate")
    region = {op.name for op in streamed_region(plan.ops, plan.graph, generate)}
    generation = sum(s.end - s.start for s in spans if s.op == generate.name)  # run_plan's spans: one per pool op
    return generation, sum(s.end - s.start for s in spans if s.op in region)


def report(found: dict, args) -> dict:
    """Print the figures; returns them (step seconds, ratio, length spread)."""
    lengths = sorted(found["lengths"])
    whole, streamed = (statistics.median(found["times"][k]) for k in ("whole", "streamed"))
    print(f"response lengths: min {lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]} tokens "
          f"(of {args.new_tokens}; {len(lengths)} responses)")
    print(f"step time ({args.executor}, median of {args.rounds} interleaved rounds): whole-batch {whole:.3f} s, "
          f"streamed {streamed:.3f} s")
    g, r = (statistics.median(found["parts"][k]) for k in ("generation", "region"))
    bound = whole / max(whole - r, 1e-9) if args.executor == "ray" else 1.0  # one process: nothing runs beside generation
    print(f"whole-batch step: generation {g:.3f} s, row/group-wise ops after it {r:.3f} s; streaming saves at most "
          f"those {r:.3f} s (hidden under generation): ratio <= {bound:.2f}x")
    print(f"ratio whole-batch / streamed = {whole / streamed:.2f}x")
    return {"whole_s": whole, "streamed_s": streamed, "ratio": whole / streamed, "bound": bound,
            "lengths": (lengths[0], lengths[len(lengths) // 2], lengths[-1])}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executor", choices=("ray", "local"), default="ray")
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds (one step of each plan per round)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds before measuring")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (4 responses each)")
    parser.add_argument("--new-tokens", type=int, default=64, help="longest response")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.executor == "local":
        return report(measure(args), args)
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        return report(measure(args), args)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
