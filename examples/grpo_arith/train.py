"""GRPO learns single-digit addition from scratch, on a CPU, in minutes.

Task: all 100 prompts ``a+b=`` with a, b in 0..9. Reward 1 only for the exact sum
followed by EOS, 0 otherwise (hybridflow_ops.rewards.arithmetic). The model is a
127k-parameter Qwen2-architecture transformer with random weights.

1. Format warm-up: 40 supervised steps on ``a+b=<random wrong answer><eos>`` — answers
   drawn uniformly from 0..18 *excluding the true sum*, so the model learns the shape of
   an answer and nothing of which answer is right.
2. GRPO (Shao et al. 2024): 32 prompts per step, 16 samples each, group-normalised
   advantages, PPO clip, a low-variance KL loss (0.1) to the warmed-up model, an entropy
   bonus (0.05), actor LR 2e-3 cosine-decayed to 5% over 1,000 steps; greedy accuracy over
   all 100 prompts every 25 steps, stopping once it reaches ``--target``.

Why each piece is there (``tools/bench_learning.py`` measures it over seeds): with a constant
LR and no KL the policy can lock onto the most frequent sum ("9") within a few dozen steps on
some seeds and machines, and never leave it. With the KL and the decaying LR but no entropy
bonus, some seeds (1 of 5 on seeds 0-4) plateau near 0.55: the prompts whose 16 samples all
give the same wrong answer have advantage 0, so nothing moves them while the entropy falls to
~0.3. The entropy bonus keeps those prompts sampling other answers. At 0.01 it reached 0.9 on
46 of 46 seeds on an AVX-512 CPU, but on an AVX2 one 2 of 10 seeds (40, 102) sat at 0.89 from
step ~600 to the end: the entropy had fallen to ~0.02 (nearly every sample the greedy answer),
and the decayed LR no longer moved the eleven prompts still wrong. At 0.02, 26 of 26 seeds there (40, 102,
200-223) reached 0.9, one (206) only at step 875 after 300 steps at 0.89. At 0.05 (the default):
27 of 27 (40, 41, 102, 200-223), at steps 200-575, median 375 (``--entropy-coef`` sets it).

``--algorithm NAME`` trains another standard algorithm of ``hybridflow.algorithms`` (``dapo``,
``cispo``, ...) with the same recipe: the config fields it has attributes for (``n``,
``clip_ratio``, ``kl_coef``, ...) apply, the others are ignored with a warning.
``--response-length`` sets the token budget (DAPO's overlong shaping penalises the last
token of it, so a DAPO run needs one token more than the longest answer: 4).
``--lora-rank R`` trains LoRA adapters of rank R (alpha 2R) on every linear layer of the blocks
instead of every weight, at a higher LR (4e-3 unless ``--lr``); the reference of the KL loss
is then the same module with its adapters disabled.
``--rollout-engine vllm`` samples with vLLM (``.venv-vllm/bin/python``); vLLM's CPU attention needs
head_dim >= 32, so it goes with ``--heads 2`` (hidden 64 in 2 heads of 32, 1 KV head: the same
parameter count as the default 4 heads of 16 with 2 KV heads).

``--staleness K --executor ray`` generates up to K steps ahead of training on a rollout pool of its own
(placement ``actor+ref@1;actor.generate@1``): step i trains on responses sampled by the weights of step i-K.
The recipe needs nothing else: its PPO ratio is taken against the rollout's own log-probs
(``recompute_old_log_probs=False``), so the clip bounds the whole lag (``tools/bench_learning.py --staleness K``).

Run: python examples/grpo_arith/train.py [--out runs/grpo_arith] [--seed 0] [--steps 1000] [--algorithm grpo]
Prints the accuracy curve and writes metrics.jsonl (and curve.json) to --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from hybridflow import PPOConfig
from hybridflow.algorithms import ALGORITHMS
from hybridflow.trainer import Trainer
from hybridflow.trainer.metrics import format_curve, learning_curve
from hybridflow.data import create_tiny_model_dir, load_causal_lm, load_tokenizer
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows, random_wrong_answer
from hybridflow.trainer.run_command import report_errors, stopped_status
from hybridflow.trainer.warmup import supervised_warmup

VLLM_OPTIONS = {"max_model_len": 64, "kv_cache_gib": 1}
"""``--rollout-engine vllm``: prompts of this task are a dozen tokens, so a short model length and a 1 GiB cache."""


def stale_placement(algorithm: str) -> str:
    """The actor (with the reference, where the algorithm has one) on one slot, its generation on another."""
    return "+".join(["actor"] + (["ref"] if "ref" in ALGORITHMS[algorithm].roles else [])) + "@1;actor.generate@1"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/grpo_arith", help="output folder")
    parser.add_argument("--steps", type=int, default=1000, help="RL steps (the LR schedule spans this many)")
    parser.add_argument("--target", type=float, default=0.95, help="stop once greedy accuracy reaches this (1.1: never)")
    parser.add_argument("--max-time", type=float, default=None, help="optional wall-time budget for RL, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step")
    parser.add_argument("--samples", type=int, default=16, help="responses per prompt")
    parser.add_argument("--eval-every", type=int, default=25, help="greedy accuracy on the 100 prompts every this many steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for this model)")
    parser.add_argument("--algorithm", default="grpo", choices=sorted(ALGORITHMS), help="the standard algorithm to train")
    parser.add_argument("--response-length", type=int, default=3, help="max new tokens per response")
    parser.add_argument("--heads", type=int, default=4,
                        help="attention heads of the model (hidden 64; KV heads: half as many). 2 gives head_dim 32, "
                             "which vLLM's CPU attention needs (4 gives 16)")
    parser.add_argument("--rollout-engine", default="hf", choices=("hf", "vllm"),
                        help="the rollout engine (vllm: run with .venv-vllm/bin/python, see docs/rollout_engines.md)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="train LoRA adapters of this rank on every linear layer instead of all weights (needs peft)")
    parser.add_argument("--lora-alpha", type=float, default=None, help="LoRA scale alpha (default: 2 x rank)")
    parser.add_argument("--lr", type=float, default=None, help="peak actor learning rate (default: 2e-3; with LoRA 4e-3)")
    parser.add_argument("--entropy-coef", type=float, default=0.05, help="entropy bonus coefficient")
    parser.add_argument("--kl-coef", type=float, default=0.1, help="coefficient of the KL loss to the warmed-up model")
    parser.add_argument("--min-lr-ratio", type=float, default=0.05, help="the cosine schedule's final LR, as a share of the peak")
    parser.add_argument("--staleness", type=int, default=0,
                        help="k >= 1: generation runs up to k steps ahead of training (needs --executor ray); the PPO "
                             "ratio against the rollout's own log-probs corrects the lag")
    parser.add_argument("--executor", default="local", choices=("local", "ray"), help="run on this process or on Ray")
    parser.add_argument("--placement", default=None,
                        help="the compiler's placement (default: auto; with --staleness, actor+ref@1;actor.generate@1, "
                             "without ref for an algorithm without one: generation on a pool of its own)")
    args = parser.parse_args(argv)
    lora = dict(lora_rank=args.lora_rank, lora_alpha=args.lora_alpha or 2.0 * args.lora_rank) if args.lora_rank else {}
    lr = args.lr or (4e-3 if args.lora_rank else 2e-3)
    start = time.perf_counter()
    out = Path(args.out)
    torch.set_num_threads(args.threads)

    # 1. a random tiny model, and its format warm-up on wrong answers only
    model_dir = create_tiny_model_dir(out / "model", task="arithmetic", seed=args.seed, hidden=64, layers=2,
                                      heads=args.heads, kv_heads=max(1, args.heads // 2))
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    losses = supervised_warmup(model, tokenizer, make_arithmetic_rows(), random_wrong_answer, steps=40, lr=3e-3,
                               seed=args.seed)
    model.save_pretrained(model_dir)
    print(f"format warm-up: nll {losses[0]:.2f} -> {losses[-1]:.2f} in {time.perf_counter() - start:.1f} s")

    # 2. GRPO (or --algorithm)
    config = PPOConfig(
        actor_model_name=str(model_dir), output_dir=str(out), seed=args.seed, num_threads=args.threads,
        rollout_batch_size=args.prompts, n_samples=args.samples, max_response_length=args.response_length, temperature=1.0,
        actor_lr=lr, **lora, actor_lr_schedule={"name": "cosine", "min_lr_ratio": args.min_lr_ratio}, adam_betas=(0.9, 0.9999),
        max_grad_norm=1.0, clip_ratio=0.2, loss_agg_mode="token-mean", kl_coef=args.kl_coef, kl_type="low_var_kl", entropy_coef=args.entropy_coef,
        recompute_old_log_probs=False, max_steps=args.steps, max_time_s=args.max_time, eval_freq=args.eval_every,
        val_samples=1, stop_at_val_score=args.target, resume="never", overwrite=True, trackers=("console", "jsonl"),
        log_every=args.eval_every, progress_bar=False, rollout_engine=args.rollout_engine,
        rollout_engine_options=VLLM_OPTIONS if args.rollout_engine == "vllm" else {},
        staleness=args.staleness, executor=args.executor,
        placement=args.placement or (stale_placement(args.algorithm) if args.staleness else "auto"),
    )
    trainer = Trainer(config, algorithm=args.algorithm)  # the reference model of the KL loss is the warmed-up model
    history = trainer.train()

    curve = learning_curve(out / "metrics.jsonl")  # (step, seconds of RL steps so far, greedy accuracy)
    print("\n" + format_curve(curve))
    summary = {"final_accuracy": curve[-1][2] if curve else None, "steps": len(history),
               "wall_s": round(time.perf_counter() - start, 1), "curve": curve}
    (out / "curve.json").write_text(json.dumps(summary, indent=1))
    print(f"\nfinal greedy accuracy {summary['final_accuracy']:.2f} after {len(history)} steps, "
          f"{summary['wall_s']} s wall in all; metrics in {out / 'metrics.jsonl'}")
    if trainer.stop_signal:  # Ctrl-C or SIGTERM: the curve so far is above; exit 130 / 143 as a shell expects
        sys.exit(stopped_status(trainer, command="grpo_arith/train.py", hint=None))
    return summary


if __name__ == "__main__":
    report_errors("grpo_arith/train.py")  # a hybridflow error prints one line, not a traceback
    main()
