"""GRPO learns single-digit addition from scratch, on a CPU, in minutes.

Task: all 100 prompts ``a+b=`` with a, b in 0..9. Reward 1 only for the exact sum
followed by EOS, 0 otherwise (hybridflow_ops.rewards.arithmetic). The model is a
127k-parameter Qwen2-architecture transformer with random weights.

1. Format warm-up: 40 supervised steps on ``a+b=<random wrong answer><eos>`` — answers
   drawn uniformly from 0..18 *excluding the true sum*, so the model learns the shape of
   an answer and nothing of which answer is right.
2. GRPO (Shao et al. 2024): 64 prompts per step, 16 samples each, group-normalised
   advantages, PPO clip, no KL; greedy accuracy over all 100 prompts every 10 steps.

Run: python examples/grpo_arith/train.py [--out runs/grpo_arith] [--max-time 600]
Prints the accuracy curve and writes metrics.jsonl (and curve.json) to --out.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from hybridflow import PPOConfig
from hybridflow.algorithms import GRPOTrainer
from hybridflow.data import create_tiny_model_dir, load_causal_lm, load_tokenizer
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows, random_wrong_answer
from hybridflow.trainer.warmup import supervised_warmup


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/grpo_arith", help="output folder")
    parser.add_argument("--max-time", type=float, default=600.0, help="wall-time budget for RL, seconds")
    parser.add_argument("--target", type=float, default=0.95, help="stop once greedy accuracy reaches this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=64, help="prompts per step")
    parser.add_argument("--samples", type=int, default=16, help="responses per prompt")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for this model)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = Path(args.out)
    torch.set_num_threads(args.threads)

    # 1. a random tiny model, and its format warm-up on wrong answers only
    model_dir = create_tiny_model_dir(out / "model", task="arithmetic", seed=args.seed, hidden=64, layers=2, heads=4,
                                      kv_heads=2)
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    losses = supervised_warmup(model, tokenizer, make_arithmetic_rows(), random_wrong_answer, steps=40, lr=3e-3,
                               seed=args.seed)
    model.save_pretrained(model_dir)
    print(f"format warm-up: nll {losses[0]:.2f} -> {losses[-1]:.2f} in {time.perf_counter() - start:.1f} s")

    # 2. GRPO
    config = PPOConfig(
        actor_model_name=str(model_dir), output_dir=str(out), seed=args.seed, num_threads=args.threads,
        rollout_batch_size=args.prompts, n_samples=args.samples, max_response_length=3, temperature=1.0,
        actor_lr=2e-3, adam_betas=(0.9, 0.9999), max_grad_norm=1.0, clip_ratio=0.2, loss_agg_mode="token-mean",
        kl_coef=0.0, recompute_old_log_probs=False, max_steps=100_000, max_time_s=args.max_time,
        eval_freq=10, val_samples=1, stop_at_val_score=args.target, resume="never", trackers=("console", "jsonl"),
        log_every=10, progress_bar=False,
    )
    trainer = GRPOTrainer(config=config)  # kl_coef=0: no KL term, so no reference model either
    history = trainer.train()

    curve, elapsed = [], 0.0  # (step, seconds of RL steps so far, greedy accuracy), from the metrics log
    for line in (out / "metrics.jsonl").read_text().splitlines():
        metrics = json.loads(line)
        elapsed += metrics.get("timing_s/step", 0.0)
        if "val/score/greedy" in metrics:
            curve.append((metrics["step"], round(elapsed, 1), metrics["val/score/greedy"]))
    print("\nstep  train_s  greedy_accuracy")
    for step, seconds, acc in curve:
        print(f"{step:5d}  {seconds:7.1f}  {acc:.2f}  {'#' * round(acc * 40)}")
    summary = {"final_accuracy": curve[-1][2] if curve else None, "steps": len(history),
               "wall_s": round(time.perf_counter() - start, 1), "curve": curve}
    (out / "curve.json").write_text(json.dumps(summary, indent=1))
    print(f"\nfinal greedy accuracy {summary['final_accuracy']:.2f} after {len(history)} steps, "
          f"{summary['wall_s']} s wall in all; metrics in {out / 'metrics.jsonl'}")
    return summary


if __name__ == "__main__":
    main()
