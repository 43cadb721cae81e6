"""GRPO step time and peak memory on a bigger model: full fine-tune vs LoRA, padded vs packed, fixed vs token-budget.

    python tools/bench_scale.py [--size 100m] [--steps 3] [--prompts 8] [--n 4] [--tokens 32] [--threads 2]

Each variant is one process running ``--steps + 1`` GRPO steps of ``hybridflow.trainer.Trainer`` (local
executor, hf rollout, KL to the initial model) on the same model folder (a standard bench model of
``hybridflow.data.tiny.BENCH_MODELS``, random weights, the arithmetic task's prompts; a random model stops
at EOS at random, so responses have varied lengths and the padded batch holds real padding). Printed per
variant: the median seconds of a step after the first (``timing_s/step``) and of its actor update and
generation, the peak resident memory of the process (``ru_maxrss``; on CUDA the peak of
``torch.cuda.max_memory_allocated``), the weight-sync megabytes per step, and each figure as a ratio to the
first variant's (the full, padded, fixed-micro-batch baseline), all measured in the same run. ``--rounds R``
runs every variant R times, interleaved (baseline, lora, ..., baseline, lora, ...), and takes the medians.

Variants (the config fields each sets):

* ``full``: full fine-tune, padded micro-batches of ``--micro`` responses (the baseline);
* ``lora``: ``lora_rank`` / ``lora_alpha`` (the reference log-probs come from the same module with the
  adapters off; only adapters train and sync);
* ``packed``: ``pack_sequences`` (the micro-batch's rows concatenated without padding);
* ``budget``: ``pack_sequences`` and ``max_tokens_per_micro_batch`` = ``--micro`` x the padded row width
  (micro-batches by real tokens);
* ``lora+packed+budget``: all three.

A variant whose config fields this checkout lacks is reported as such and left out.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def variants(args) -> dict[str, dict]:
    width = args.tokens + 8  # the arithmetic prompts are at most 8 tokens with their chat markers
    lora = {"lora_rank": args.lora_rank, "lora_alpha": 2 * args.lora_rank}
    packed = {"pack_sequences": True}
    budget = {"pack_sequences": True, "max_tokens_per_micro_batch": args.micro * width}
    return {"full": {}, "lora": lora, "packed": packed, "budget": budget, "lora+packed+budget": {**lora, **budget}}


def child(spec: dict) -> dict:
    """One variant's run in this process: its step figures and peak memory."""
    import torch

    from hybridflow import PPOConfig
    from hybridflow.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    config = PPOConfig(actor_model_name=spec["model"], output_dir=spec["out"], seed=0, num_threads=spec["threads"],
                       rollout_batch_size=spec["prompts"], n_samples=spec["n"], max_response_length=spec["tokens"],
                       actor_lr=1e-5, kl_coef=0.01, kl_type="low_var_kl", micro_batch_size=spec["micro"],
                       max_steps=spec["steps"] + 1, eval_freq=0, resume="never", overwrite=True, trackers=("jsonl",),
                       progress_bar=False, calibrate=False, **spec["fields"])
    history = Trainer(config, algorithm="grpo").train()
    later = history[1:] or history
    median = lambda key: statistics.median(m.get(key, 0.0) for m in later)  # noqa: E731
    filled = statistics.mean(m.get("response_length/mean", 0.0) for m in later)
    peak = (torch.cuda.max_memory_allocated() if torch.cuda.is_available()
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"step_s": median("timing_s/step"), "update_s": median("timing_s/update_actor"),
            "gen_s": median("timing_s/gen"), "ref_s": median("timing_s/ref"), "sync_mb": median("weight_sync/actor/mb"),
            "response_length": filled, "peak_mb": peak / 2**20, "steps": len(history)}


def run_variant(name: str, fields: dict, args, model: Path, work: Path) -> dict | str:
    from hybridflow import PPOConfig

    missing = [f for f in fields if f not in PPOConfig.model_fields]
    if missing:
        return f"this checkout's PPOConfig has no {', '.join(missing)}"
    spec = {"model": str(model), "out": str(work / name.replace("+", "_")), "threads": args.threads,
            "prompts": args.prompts, "n": args.n, "tokens": args.tokens, "micro": args.micro, "steps": args.steps,
            "fields": fields}
    path = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return f"failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_model(size: str, work: Path) -> Path:
    from hybridflow.data import bench_model_shape, create_tiny_model_dir

    folder = work / f"model_{size}"
    if not (folder / "config.json").is_file():
        create_tiny_model_dir(folder, task="arithmetic", seed=0, max_positions=512,
                              **{k: v for k, v in bench_model_shape(size).items() if k != "max_positions"})
    return folder


def table(results: dict[str, list], args) -> str:
    base = {k: statistics.median(r[k] for r in results["full"]) for k in ("step_s", "update_s", "peak_mb")} \
        if results.get("full") and not isinstance(results["full"][0], str) else None
    lines = [f"{args.size} model, GRPO {args.prompts} prompts x {args.n}, <= {args.tokens} new tokens, micro-batch "
             f"{args.micro}, {args.threads} threads, {args.steps} timed steps x {args.rounds} rounds",
             f"{'variant':<20} {'step_s':>8} {'update_s':>9} {'gen_s':>7} {'peak_mb':>9} {'sync_mb':>8} "
             f"{'resp_len':>8}   ratios to full (step, update, peak)"]
    for name, runs in results.items():
        if isinstance(runs[0], str):
            lines.append(f"{name:<20} {runs[0]}")
            continue
        m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        ratios = (f"{m['step_s'] / base['step_s']:.2f}  {m['update_s'] / base['update_s']:.2f}  "
                  f"{m['peak_mb'] / base['peak_mb']:.2f}") if base else "-"
        lines.append(f"{name:<20} {m['step_s']:8.2f} {m['update_s']:9.2f} {m['gen_s']:7.2f} {m['peak_mb']:9.0f} "
                     f"{m['sync_mb']:8.1f} {m['response_length']:8.1f}   {ratios}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="100m", help="a bench model of hybridflow.data.tiny.BENCH_MODELS")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run (after one untimed first step)")
    p.add_argument("--rounds", type=int, default=1, help="runs of every variant, interleaved")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=4, help="responses per prompt")
    p.add_argument("--tokens", type=int, default=32, help="response length limit")
    p.add_argument("--micro", type=int, default=8, help="micro-batch size of the fixed variants")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    p.add_argument("--variants", default="all", help="comma-separated names (full is always run first)")
    p.add_argument("--work", help="folder for the model and the runs (default: a temporary one)")
    p.add_argument("--json", help="write the per-run figures here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return {}
    chosen = variants(args)
    if args.variants != "all":
        names = ["full"] + [v for v in args.variants.split(",") if v != "full"]
        unknown = [v for v in names if v not in chosen]
        if unknown:
            p.error(f"unknown variants {unknown}; choose from {sorted(chosen)}")
        chosen = {v: chosen[v] for v in names}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        model = make_model(args.size, work)
        results: dict[str, list] = {name: [] for name in chosen}
        for _ in range(args.rounds):
            for name, fields in chosen.items():
                if results[name] and isinstance(results[name][0], str):
                    continue
                results[name].append(run_variant(name, fields, args, model, work))
    print(table(results, args))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
