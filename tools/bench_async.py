"""Benchmark: trained samples/s against staleness k in {0, 1, 2, 4} on the RayExecutor, ratios to k = 0.

    .venv/bin/python tools/bench_async.py                  # 3 rounds x 6 measured steps per k and sync (minutes)
    .venv/bin/python tools/bench_async.py --sync staged    # only the staged weight sync for k >= 1
    .venv/bin/python tools/bench_async.py --rounds 1 --steps 3 --ks 0 1   # quicker, noisier

Placement (compiled: ``actor+reward@1;actor.generate@1`` on a machine of 2 CPU slots): the rollout
engine on a generation pool of one worker pinned to core 0, the actor's training (and the rule
reward's host slot) pinned to the last core, one torch thread each. GRPO with the truncated-IS policy
loss (``grpo_is``), as a plan with staleness k > 0 needs. The tiny qwen2 model samples with its EOS
on, up to ``--max-new-tokens`` (64) tokens: a random model's responses end anywhere from 1 to 64
tokens, so their lengths vary as the issue asks, and the model's size is chosen so that a step's
generation takes about as long as the rest of it (printed: g and t, from the k = 0 spans).

**Weight sync** (``--sync``, default both): each k >= 1 runs with the ``collective`` sync (one collective of both
pools after each update) and with the ``staged`` one (``async_weight_sync: staged``, runtime/staged_sync.py: the
train pool stages each version in the object store, the rollout pool loads it before the generation that needs
it); k = 0 is the one baseline of both. The prediction beside each is ``predict_async(..., sync=<the same>)``.

**Rounds, interleaved.** Each round runs, for every (k, sync) in a rotated order, a segment on a fresh executor
(one at a time: the pools' placement groups are named per pool; its start is not timed), after one
untimed segment that lets Ray's freshly started processes settle: ``--warmup``
steps, ``--steps`` timed steps and k untimed steps that drain the buffer; the figure of a segment is
trained samples (prompts x n of the timed steps) per second of those steps. The
ratio to k = 0 is taken within each round, and the median over rounds is printed. The machine is
shared: read ratios, not absolute figures.

What to expect (runtime/overlap.py, compiler/async_cost.py): with the collective sync one generation runs
beside each training step for every k >= 1 (the generation pool is idle at each weight sync), so k = 1 is the
gain over k = 0, ideally (g + s + t) / (s + max(g, t)); k = 2 and 4 keep more rollouts ready but are not expected
to add to it. With the staged sync the rollout pool runs up to k generations ahead, so a larger k absorbs the
variance of the generation times (responses of 1 to 64 tokens): the prediction rises with k towards
(g + s + t) / max(g + s, t) with the mean g.
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


def configs(args) -> list[tuple[int, str]]:
    """The (k, weight sync) pairs a round measures: k = 0 once (no sync mode applies), each k >= 1 per ``--sync``."""
    modes = ("collective", "staged") if args.sync == "both" else (args.sync,)
    return [(k, mode) for k in args.ks for mode in (("collective",) if k == 0 else modes)]


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


def predicted_step_s(gens: list[float], t: float, sync_s: float, k: int, sync: str = "collective") -> float:
    """PREDICTED: the compiler's step time for staleness k (:func:`hybridflow.compiler.async_cost.predict_async`)
    from the k = 0 run's measured generation times (used in turn: they vary with the response lengths), training
    time and weight-sync time, with weight sync ``sync`` (collective or staged)."""
    from hybridflow.compiler.async_cost import predict_async

    return predict_async(None, t, k, sync_s=sync_s, gen_samples=gens, sync=sync)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    import ray

    from hybridflow.runtime.ray import RayExecutor

    role_specs, batches, plans = workload(args)
    cores = os.cpu_count() or 1
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # logical: slots are pinned
    pairs = configs(args)
    figures: dict[tuple[int, str], list[float]] = {c: [] for c in pairs}
    ratios: dict[tuple[int, str], list[float]] = {c: [] for c in pairs}
    splits = []
    try:
        for r in range(-1, args.rounds):  # round -1: untimed, while Ray's freshly started processes settle
            order = pairs[r % len(pairs):] + pairs[:r % len(pairs)] if r >= 0 else pairs[:1]
            this = {}
            for k, sync in order:
                plan = plans[k]
                generation = plan.placement("actor").generation_pool
                pins = {p.name: (0 if p.name == generation else cores - 1,) for p in plan.pools}
                executor = RayExecutor(plan, role_specs, pin_cpus=pins)
                try:
                    if k:
                        executor.set_weight_sync(sync)
                    this[k, sync] = segment(executor, k, batches, args)
                    if k == 0 and r >= 0:
                        splits.append(split_times(executor))
                finally:
                    executor.shutdown()
            if r < 0:
                continue
            for pair in pairs:
                figures[pair].append(this[pair])
                ratios[pair].append(this[pair] / this[pairs[0]])
            print(f"round {r + 1}: " + ", ".join(f"k={k} {sync} {this[k, sync]:.1f} samples/s" for k, sync in pairs),
                  flush=True)
    finally:
        ray.shutdown()
    gens = [x for run in splits for x in run[0]]
    t, sync_s = (statistics.median(run[i] for run in splits) for i in (1, 2)) if splits else (float("nan"),) * 2
    return report(figures, ratios, gens, t, sync_s, args)


def report(figures: dict, ratios: dict, gens: list[float], t: float, sync_s: float, args) -> dict:
    """Print the table (measured ratio, % of the ideal, predicted ratio) per (k, sync) of :func:`configs`; returns
    (k, sync) -> measured ratio. % of the ideal: of (g + s + t) / (s + max(g, t)) for the collective sync, of
    (g + s + t) / max(g + s, t) for the staged one (async_cost's constant-time forms, at the median g)."""
    pairs = configs(args)
    base = pairs[0]
    g = statistics.median(gens) if gens else float("nan")
    ideal = {"collective": (g + sync_s + t) / (sync_s + max(g, t)), "staged": (g + sync_s + t) / max(g + sync_s, t)}
    print(f"generation g = {g:.3f} s (median; {min(gens, default=0):.3f}-{max(gens, default=0):.3f}), training t = "
          f"{t:.3f} s, weight sync s = {sync_s:.3f} s (k=0 spans); responses up to {args.max_new_tokens} tokens, EOS on; "
          f"{args.prompts} prompts x {args.n} samples a step; {os.cpu_count()} cores")
    print(f"ideal speedup for the two pinned cores: collective (g + s + t) / (s + max(g, t)) = {ideal['collective']:.2f}x,"
          f" staged (g + s + t) / max(g + s, t) = {ideal['staged']:.2f}x")
    print(f"{'k':>3} {'sync':>10} {'samples/s':>10} {'measured':>10} {'% of ideal':>10} {'predicted':>10}   "
          f"(ratios to k={base[0]})")
    predicted = {(k, sync): predicted_step_s(gens, t, sync_s, k, sync) for k, sync in pairs} if gens else {}
    out = {}
    for k, sync in pairs:
        ratio = statistics.median(ratios[k, sync])
        shown = f"{predicted[base] / predicted[k, sync]:.2f}x" if predicted else "-"
        print(f"{k:>3} {sync:>10} {statistics.median(figures[k, sync]):>10.1f} {ratio:>9.2f}x "
              f"{100 * ratio / ideal[sync]:>9.0f}% {shown:>10}")
        out[k, sync] = ratio
    return out


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4], help="staleness values (the first is the baseline)")
    parser.add_argument("--sync", choices=("collective", "staged", "both"), default="both",
                        help="weight sync of the k >= 1 runs (runtime async_weight_sync); both: each k with each")
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
