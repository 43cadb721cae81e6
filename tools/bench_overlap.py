"""Benchmark: one-step-off overlap (staleness 1) against on-policy (staleness 0) on the RayExecutor.

    .venv/bin/python tools/bench_overlap.py                 # 8 measured steps each (~1 min)
    .venv/bin/python tools/bench_overlap.py --steps 4       # quicker, noisier
    .venv/bin/python tools/bench_overlap.py --from-config   # the same comparison through the trainer and its config

Placement (compiled: ``actor+reward@1;actor.generate@1``): the rollout engine
on a generation pool of one worker, the actor's training on a train pool of one
worker, each pinned to one of the machine's cores (``RayExecutor(pin_cpus=...)``,
one torch thread each); the compiler gives the rule reward a host-CPU slot of
its own, pinned to the train pool's core. The algorithm is GRPO
with the truncated importance-sampling policy loss (``truncated_is_weight`` +
``ppo_clip_is``), as an overlapped plan needs; a tiny qwen2 model sized so that
generating and training take comparable time. Both plans are compiled for that
model and the run's batch shape (:func:`workload`), so they fit any machine that
can run it.

Both plans run ``--steps`` steps after ``--warmup`` steps; the figure per plan
is the median wall time of a step. From the staleness-0 run's spans: ``g`` =
median time of the generation (the generate op on the generation pool) and
``t`` = median time of the rest of the step (the train pool's ops: weight sync,
log-probs, reward, update, plus the controller's advantage). Staleness 0 runs
them one after the other (step ~ g + t); staleness 1 runs generation of step
i+1 beside step i (step ~ max(g, t)). Printed: g, t, both step times, the
speedup, the ideal speedup (g + t) / max(g, t), and the fraction of the ideal
reached (goal >= 85%). The machine is shared: read the ratios of one run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def plans(graph, model, batch):
    """The staleness-0 and staleness-1 plans of ``graph`` for the model and batch shape this run trains: the
    placement's memory check and the predicted timeline are the tiny model's (a 0.5B preset does not fit a
    CPU slot's share of the memory of a small machine)."""
    from hybridflow.compiler import Machine, ModelSpec, compile_for

    machine = Machine("cpu", 2, threads_per_slot=1, where="ray")
    spec = "actor+reward@1;actor.generate@1"
    actor = ModelSpec.from_config(model.config.to_dict(), name="actor")
    return {k: compile_for(graph, actor, machine=machine, placement=spec, staleness=k, batch=batch) for k in (0, 1)}


def run_config(staleness: int, model_dir, out, args) -> tuple[list[float], float, float]:
    """``hybridflow run``'s path: the grpo_arith config with a rollout pool of its own
    (``placement=actor@1;actor.generate@1``, as ``split`` gives with staleness 1), ``executor=ray``, ``staleness=K``;
    returns the step times after warm-up and (staleness 0) the median generation and rest-of-step times."""
    from hybridflow.trainer import Trainer
    from hybridflow.trainer.config_files import load_run_config

    _, config = load_run_config("examples/configs/grpo_arith.yaml", [
        "algorithm=grpo_is", f"actor_model_name={model_dir}", "placement=actor@1;actor.generate@1", "executor=ray", f"staleness={staleness}",
        "cpu_slots=2", f"max_steps={args.warmup + args.steps}", f"rollout_batch_size={args.prompts}", "n_samples=4",
        f"max_response_length={args.new_tokens}", "eval_freq=0", "save_freq=0", "trackers=[console]", "log_every=1000",
        "progress_bar=false", f"output_dir={out / f'stale{staleness}'}", "stop_at_val_score=null"])
    trainer = Trainer(config, algorithm="grpo_is")
    try:
        history = trainer.train()
        g, t = split_times(trainer.executor, args.warmup)
    finally:
        if trainer.executor is not None:
            trainer.executor.shutdown()
    return [m["timing_s/step"] for m in history[args.warmup:]], g, t


def specs(args):
    from hybridflow.data import make_tiny_model, make_tiny_tokenizer
    from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig
    from hybridflow.runtime.roles import RoleSpec
    from hybridflow_ops.rewards.arithmetic import compute_score

    tokenizer = make_tiny_tokenizer("arithmetic")
    model = make_tiny_model("qwen2", vocab_size=len(tokenizer), hidden=args.hidden, layers=args.layers, heads=4,
                            kv_heads=2, seed=0)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, seed=0, stop_at_eos=False)
    train = TrainEngineConfig(lr=1e-4, precision="fp32", num_threads=1)
    return {"actor": RoleSpec(model=model, tokenizer=tokenizer, sampling=sampling, train=train),
            "reward": RoleSpec(reward=compute_score, tokenizer=tokenizer)}, tokenizer


def run(plan, role_specs, batches, args) -> tuple[list[float], object]:
    from hybridflow.runtime.ray import RayExecutor

    generation = next(p.generation_pool for p in plan.placements if p.generation_pool)
    cores = os.cpu_count() or 1
    # the generation pool on core 0, everything else (the train pool, the rule reward's host pool) on the last core
    pins = {p.name: (0 if p.name == generation else cores - 1,) for p in plan.pools}
    executor = RayExecutor(plan, role_specs, pin_cpus=pins)
    times = []
    try:
        for i in range(args.warmup + args.steps):
            start = time.perf_counter()
            nxt = batches[i + 1] if plan.staleness else None
            executor.run_iteration(batches[i], next_inputs=nxt)
            times.append(time.perf_counter() - start)
        return times[args.warmup:], executor
    finally:
        executor.shutdown()


def split_times(executor, first: int) -> tuple[float, float]:
    """Median generation time g and rest-of-step time t per iteration, from the per-op spans."""
    gen, rest = {}, {}
    for s in executor.recorder.spans:
        if s.iteration < first:
            continue
        target = gen if s.kind == "generate" else rest
        target[s.iteration] = target.get(s.iteration, 0.0) + s.end - s.start
    return statistics.median(gen.values()), statistics.median(rest.values())


def workload(args) -> tuple[dict, list[dict], dict]:
    """The role specs, a batch of prompts per step (and one more: the overlapped plan's next prompts) and
    both plans, compiled for this run's model and batch shape; nothing here needs Ray."""
    from hybridflow.algorithms import grpo_is
    from hybridflow.compiler.passes import BatchShape
    from hybridflow.data import make_prompt_batch
    from hybridflow.data.tasks.arithmetic import make_arithmetic_rows

    graph = grpo_is.build(n=4)
    role_specs, tokenizer = specs(args)
    rows = make_arithmetic_rows()
    count = args.warmup + args.steps + 1
    batches = [{"prompts": make_prompt_batch([rows[(i * args.prompts + j) % len(rows)] for j in range(args.prompts)],
                                             tokenizer)} for i in range(count)]
    shape = BatchShape(prompts=args.prompts, prompt_len=batches[0]["prompts"]["prompt_ids"].shape[1],
                       response_len=args.new_tokens, mini_batches=1)
    return role_specs, batches, plans(graph, role_specs["actor"].model, shape)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (4 responses each)")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--from-config", action="store_true",
                        help="train from examples/configs/grpo_arith.yaml (a rollout pool of its own, executor=ray, staleness=0|1), "
                             "as 'hybridflow run' does, instead of driving the executor directly")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.from_config:
        import tempfile
        from pathlib import Path

        from hybridflow.data import create_tiny_model_dir

        with tempfile.TemporaryDirectory() as tmp:
            model_dir = create_tiny_model_dir(Path(tmp) / "model", task="arithmetic", seed=0, hidden=args.hidden,
                                              layers=args.layers, heads=4, kv_heads=2)
            on_policy, g, t = run_config(0, model_dir, Path(tmp), args)
            overlapped, _, _ = run_config(1, model_dir, Path(tmp), args)
        report(on_policy, overlapped, g, t, args)
        return

    import ray

    role_specs, batches, compiled = workload(args)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # logical CPUs: slots are pinned to cores
    try:
        on_policy, executor = run(compiled[0], role_specs, batches, args)
        g, t = split_times(executor, args.warmup)
        overlapped, _ = run(compiled[1], role_specs, batches, args)
    finally:
        ray.shutdown()
    report(on_policy, overlapped, g, t, args)


def report(on_policy: list[float], overlapped: list[float], g: float, t: float, args) -> None:
    step0, step1 = statistics.median(on_policy), statistics.median(overlapped)
    speedup, ideal = step0 / step1, (g + t) / max(g, t)
    print(f"generation g = {g:.3f} s, rest of step t = {t:.3f} s   (staleness 0, medians of {args.steps} steps)")
    print(f"step time: staleness 0 = {step0:.3f} s, staleness 1 = {step1:.3f} s")
    print(f"speedup {speedup:.2f}x of ideal (g+t)/max(g,t) = {ideal:.2f}x: {100 * speedup / ideal:.0f}% of ideal "
          f"(goal >= 85%)")


if __name__ == "__main__":
    main()
