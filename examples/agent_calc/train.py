"""A tiny model learns by RL to answer sums of three two-digit numbers with a calculator.

Task: prompts ``a+b+c=`` (a, b, c in 10..99; 2,000 training prompts, 100 held-out ones for
greedy accuracy). A 127k-parameter model cannot add three two-digit numbers in its head; with
the ``calc`` environment it can write ``[a+b+c]``, read the calculator's ``{sum}`` and answer.
Reward 1 for exactly the sum, 0 otherwise.

1. Format warm-up (``turns_warmup``): transcripts ``[a+b+c]{sum}W`` where the call is correct,
   ``{sum}`` is the calculator's real answer (an observation: masked out, never trained on) and
   the final answer W is always wrong, the sum with its last digit one higher: the warm-up
   teaches how to call and where and in what shape to answer, and never a right answer
   (greedy accuracy after it is ~0; see hybridflow/data/tasks/agent_calc.py for the choice).
2. GRPO over multi-turn trajectories (``hybridflow.algorithms.agent_grpo``): 32 prompts a step,
   8 trajectories each, at most 3 turns of 12 tokens, 40 tokens in all; observations never in
   the loss; a KL loss (0.01) to the warmed-up model, an entropy bonus (0.001), LR 2e-3
   cosine-decayed over 1,000 steps. Stops once held-out greedy accuracy reaches ``--target``.

Why these numbers (seed 1, the slowest seed tried while choosing): 300 warm-up steps with KL 0.05
and entropy 0.01 reached 0.69 after 260 RL steps; KL 0.01 with entropy 0.001 reached 0.71 after
170; with 100 warm-up steps greedy accuracy was already 0.15 before RL (the off-by-one answer not
yet learned, the model's favourite last digit right one time in ten); KL 0.001 with entropy 0.01
turned seed 0's policy uniform before any sample was right; entropy 0.01 with KL 0.01 was at 0.13
after 80 steps. 200 warm-up steps, KL 0.01, entropy 0.001: 0.86 after 100 steps on seed 1.

``examples/agent_calc/config.yaml`` is step 2 as a run file, for the model and data this script
wrote (``hybridflow run examples/agent_calc/config.yaml``).

``--no-tool``: the same task, model and RL budget without the calculator (single-turn GRPO,
warm-up on the same off-by-one answers given straight away), for comparison.

Run: python examples/agent_calc/train.py [--out runs/agent_calc] [--seed 0] [--max-time 900] [--no-tool]
Prints the accuracy curve; writes metrics.jsonl, trajectories.jsonl and curve.json to --out.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from hybridflow import PPOConfig
from hybridflow.algorithms.agent_grpo import agent_grpo
from hybridflow.data import create_tiny_model_dir, load_causal_lm, load_tokenizer
from hybridflow.data.datasets import write_prompt_dataset
from hybridflow.data.tasks.agent_calc import call_format_segments, direct_answer_segments, make_sum3_rows
from hybridflow.trainer import Trainer
from hybridflow.trainer.metrics import format_curve, learning_curve
from hybridflow.trainer.warmup import turns_warmup


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/agent_calc", help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1000, help="RL steps at most (the LR schedule spans this many)")
    parser.add_argument("--max-time", type=float, default=900, help="wall-time budget for RL, seconds")
    parser.add_argument("--target", type=float, default=0.9, help="stop once held-out greedy accuracy reaches this")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="trajectories per prompt")
    parser.add_argument("--warmup-steps", type=int, default=200, help="format warm-up steps (100 left greedy accuracy at 0.15 on seed 1: the off-by-one answer not yet learned)")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--kl-coef", type=float, default=0.01,
                        help="weight of the KL loss to the warmed-up model (which answers off by one: a strong pull "
                             "back to it slows RL)")
    parser.add_argument("--entropy-coef", type=float, default=0.001,
                        help="entropy bonus (see the module docstring for the values tried)")
    parser.add_argument("--no-tool", action="store_true", help="the baseline: answer directly, no calculator")
    parser.add_argument("--warmup-only", action="store_true",
                        help="stop after writing the data and the warmed-up model (for config.yaml)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start, out = time.perf_counter(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    train_rows, val_rows = make_sum3_rows(2100, seed=1000 + args.seed)[:2000], make_sum3_rows(100, seed=7)
    held_out = {r["prompt"] for r in val_rows}
    train_rows = [r for r in train_rows if r["prompt"] not in held_out]
    train_file = write_prompt_dataset(train_rows, out / "train.jsonl")
    val_file = write_prompt_dataset(val_rows, out / "val.jsonl")

    # 1. a random tiny model, and its format warm-up (never a right answer)
    model_dir = create_tiny_model_dir(out / "model", task="agent_calc", seed=args.seed, hidden=64, layers=2,
                                      heads=4, kv_heads=2)
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    segments = direct_answer_segments if args.no_tool else call_format_segments
    losses = turns_warmup(model, tokenizer, train_rows, segments, steps=args.warmup_steps, lr=3e-3, seed=args.seed)
    model.save_pretrained(model_dir)
    print(f"format warm-up: nll {losses[0]:.2f} -> {losses[-1]:.2f} in {time.perf_counter() - start:.1f} s")
    if args.warmup_only:
        return {"model": str(model_dir), "train": str(train_file), "val": str(val_file)}

    # 2. GRPO over multi-turn trajectories with the calculator (or single-turn without it)
    config = PPOConfig(
        actor_model_name=str(model_dir), train_files=str(train_file), val_files=str(val_file), output_dir=str(out),
        seed=args.seed, num_threads=1, rollout_batch_size=args.prompts, n_samples=args.samples,
        max_response_length=4 if args.no_tool else 40, temperature=1.0, actor_lr=args.lr,
        actor_lr_schedule={"name": "cosine", "min_lr_ratio": 0.05}, adam_betas=(0.9, 0.9999), max_grad_norm=1.0,
        clip_ratio=0.2, loss_agg_mode="token-mean", kl_coef=args.kl_coef, kl_type="low_var_kl", entropy_coef=args.entropy_coef,
        recompute_old_log_probs=False, max_steps=args.steps, max_time_s=args.max_time, eval_freq=args.eval_every,
        val_samples=1, stop_at_val_score=args.target, resume="never", overwrite=True, trackers=("console", "jsonl"),
        log_every=args.eval_every, progress_bar=False,
        algorithm_args={} if args.no_tool else {"max_turns": 3, "max_tokens_per_turn": 12, "max_total_tokens": 40},
    )
    trainer = Trainer(config, algorithm="grpo" if args.no_tool else agent_grpo)
    history = trainer.train()

    curve = learning_curve(out / "metrics.jsonl")  # (step, seconds of RL steps so far, greedy accuracy)
    print("\n" + format_curve(curve))
    summary = {"tool": not args.no_tool, "seed": args.seed, "initial_accuracy": curve[0][2] if curve else None,
               "final_accuracy": curve[-1][2] if curve else None, "steps": len(history),
               "rl_s": curve[-1][1] if curve else 0.0, "wall_s": round(time.perf_counter() - start, 1), "curve": curve}
    (out / "curve.json").write_text(json.dumps(summary, indent=1))
    print(f"\ngreedy accuracy {summary['initial_accuracy']} -> {summary['final_accuracy']} after {len(history)} steps, "
          f"{summary['wall_s']} s wall in all")
    return summary


if __name__ == "__main__":
    main()
