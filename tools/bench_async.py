"""Benchmark: trained samples/s against staleness k in {0, 1, 2, 4} on the RayExecutor, ratios to k = 0.

    .venv/bin/python tools/bench_async.py                  # 3 rounds x 6 measured steps per k (a few minutes)
    .venv/bin/python tools/bench_async.py --rounds 1 --steps 3 --ks 0 1   # quicker, noisier

Placement (compiled: ``actor+reward@1;actor.generate@1`` on a machine of 2 CPU slots): the rollout
engine on a generation pool of one worker pinned to core 0, the actor's training (and the rule
reward's host slot) pinned to the last core, one torch thread each. GRPO with the truncated-IS policy
loss (``grpo_is``), as a plan with staleness k > 0 needs. The tiny qwen2 model samples with its EOS
on, up to ``--max-new-tokens`` (64) tokens: a random model's responses end anywhere from 1 to 64
tokens, so their lengths vary as the issue asks, and the model's size is chosen so that a step's
generation takes about as long as the rest of it (printed: g and t, from the k = 0 spans).

**Rounds, interleaved.** Each round runs, for every k in a rotated order, a segment on a fresh executor
(one at a time: the pools' placement groups are named per pool; its start is not timed), after one
untimed segment that lets Ray's freshly started processes settle: ``--warmup``
steps, ``--steps`` timed steps and k untimed steps that drain the buffer; the figure of a segment is
trained samples (prompts x n of the timed steps) per second of those steps. The
ratio to k = 0 is taken within each round, and the median over rounds is printed. The machine is
shared: read ratios, not absolute figures.

What to expect (runtime/overlap.py): one generation runs beside each training step for every k >= 1
(the generation pool is idle at each weight sync), so k = 1 is the gain over k = 0, ideally
(g + t) / max(g, t); k = 2 and 4 keep more rollouts ready but are not expected to add to it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

PLACEMENT = "actor+reward@1;actor.generate@1"


def specs(args):
    """The role specs: a tiny qwen2 actor sampling up to ``max_new_tokens`` with EOS on, the arithmetic rule reward."""
    from hybridflow.data import make_tiny_model, make_tiny_tokenizer
    from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig
    from hybridflow.runtime.roles import RoleSpec
    from hybridflow_ops.rewards.arithmetic import compute_score

    tokenizer = make_tiny_tokenizer("arithmetic")
    model = make_tiny_model("qwen2", vocab_size=len(tokenizer), hidden=args.hidden, layers=args.layers, heads=4,
                            kv_heads=2, seed=0)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, seed=0, stop_at_eos=True)
    train = TrainEngineConfig(lr=1e-4, precision="fp32", num_threads=1)
    return {"actor": RoleSpec(model=model, tokenizer=tokenizer, sampling=sampling, train=train),
            "reward": RoleSpec(reward=compute_score, tokenizer=tokenizer)}, tokenizer


def workload(args) -> tuple[dict, list[dict], dict]:
    """Role specs, the prompt batches of one segment (the longest k's) and the plan of each k; no Ray needed."""
    from hybridflow.algorithms import grpo_is
    from hybridflow.compiler import Machine, ModelSpec, compile_for
    from hybridflow.compiler.passes import BatchShape
    from hybridflow.data import make_prompt_batch
    from hybridflow.data.tasks.arithmetic import make_arithmetic_rows

    graph = grpo_is.build(n=args.n)
    role_specs, tokenizer = specs(args)
    rows = make_arithmetic_rows()
    count = args.warmup + args.steps + max(args.ks)
    batches = [{"prompts": make_prompt_batch([rows[(i * args.prompts + j) % len(rows)] for j in range(args.prompts)],
                                             tokenizer)} for i in range(count)]
    shape = BatchShape(prompts=args.prompts, prompt_len=batches[0]["prompts"]["prompt_ids"].shape[1],
                       response_len=args.max_new_tokens, mini_batches=1)
    machine = Machine("cpu", 2, threads_per_slot=1, where="ray")
    actor = ModelSpec.from_config(role_specs["actor"].model.config.to_dict(), name="actor")
    plans = {k: compile_for(graph, actor, machine=machine, placement=PLACEMENT, staleness=k, batch=shape)
             for k in args.ks}
    return role_specs, batches, plans


def segment(executor, k: int, batches: list[dict], args) -> float:
    """Trained samples per second of the timed steps of one segment (module docstring)."""
    total = args.warmup + args.steps + k
    start = end = None
    for i in range(total):
        if i == args.warmup:
            start = time.perf_counter()
        following = batches[i + 1:min(i + 1 + k, total)] if k else None
        executor.run_iteration(batches[i], next_inputs=following)
        if i == args.warmup + args.steps - 1:
            end = time.perf_counter()
    return args.steps * args.prompts * args.n / (end - start)


def split_times(executor) -> tuple[list[float], float, float]:
    """From the spans of a k = 0 executor: the generation seconds of each iteration, and the medians of the rest of
    a step (training: every other op) and of its weight sync."""
    gen, rest, sync = {}, {}, {}
    for s in executor.recorder.spans:
        target = gen if s.kind == "generate" else sync if s.kind == "weight_sync" else rest
        target[s.iteration] = target.get(s.iteration, 0.0) + s.end - s.start
    return list(gen.values()), statistics.median(rest.values()), statistics.median(sync.values() or [0.0])


def predicted_step_s(gens: list[float], t: float, sync_s: float, k: int) -> float:
    """PREDICTED: the compiler's step time for staleness k (:func:`hybridflow.compiler.async_cost.predict_async`)
    from the k = 0 run's measured generation times (used in turn: they vary with the response lengths), training
    time and weight-sync time, with the runtime's collective sync."""
    from hybridflow.compiler.async_cost import predict_async

    return predict_async(None, t, k, sync_s=sync_s, gen_samples=gens, sync="collective")


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    import ray

    from hybridflow.runtime.ray import RayExecutor

    role_specs, batches, plans = workload(args)
    cores = os.cpu_count() or 1
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # logical: slots are pinned
    figures: dict[int, list[float]] = {k: [] for k in args.ks}
    ratios: dict[int, list[float]] = {k: [] for k in args.ks}
    splits = []
    try:
        for r in range(-1, args.rounds):  # round -1: untimed, while Ray's freshly started processes settle
            order = args.ks[r % len(args.ks):] + args.ks[:r % len(args.ks)] if r >= 0 else args.ks[:1]
            this = {}
            for k in order:
                plan = plans[k]
                generation = plan.placement("actor").generation_pool
                pins = {p.name: (0 if p.name == generation else cores - 1,) for p in plan.pools}
                executor = RayExecutor(plan, role_specs, pin_cpus=pins)
                try:
                    this[k] = segment(executor, k, batches, args)
                    if k == 0 and r >= 0:
                        splits.append(split_times(executor))
                finally:
                    executor.shutdown()
            if r < 0:
                continue
            for k in args.ks:
                figures[k].append(this[k])
                ratios[k].append(this[k] / this[args.ks[0]])
            print(f"round {r + 1}: " + ", ".join(f"k={k} {this[k]:.1f} samples/s" for k in args.ks), flush=True)
    finally:
        ray.shutdown()
    gens = [x for run in splits for x in run[0]]
    t, sync_s = (statistics.median(run[i] for run in splits) for i in (1, 2)) if splits else (float("nan"),) * 2
    return report(figures, ratios, gens, t, sync_s, args)


def report(figures: dict, ratios: dict, gens: list[float], t: float, sync_s: float, args) -> dict:
    """Print the table (measured ratio, % of the ideal, predicted ratio); returns k -> measured ratio."""
    base = args.ks[0]
    g = statistics.median(gens) if gens else float("nan")
    ideal = (g + sync_s + t) / (sync_s + max(g, t))
    print(f"generation g = {g:.3f} s (median; {min(gens, default=0):.3f}-{max(gens, default=0):.3f}), training t = "
          f"{t:.3f} s, weight sync s = {sync_s:.3f} s (k=0 spans); responses up to {args.max_new_tokens} tokens, EOS on; "
          f"{args.prompts} prompts x {args.n} samples a step; {os.cpu_count()} cores")
    print(f"ideal speedup for the two pinned cores: (g + s + t) / (s + max(g, t)) = {ideal:.2f}x")
    print(f"{'k':>3} {'samples/s':>10} {'measured':>10} {'% of ideal':>10} {'predicted':>10}   (ratios to k={base})")
    predicted = {k: predicted_step_s(gens, t, sync_s, k) for k in args.ks} if gens else {}
    out = {}
    for k in args.ks:
        ratio = statistics.median(ratios[k])
        shown = f"{predicted[base] / predicted[k]:.2f}x" if predicted else "-"
        print(f"{k:>3} {statistics.median(figures[k]):>10.1f} {ratio:>9.2f}x {100 * ratio / ideal:>9.0f}% {shown:>10}")
        out[k] = ratio
    return out


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4], help="staleness values (the first is the baseline)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per segment")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them (the buffer fills)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
