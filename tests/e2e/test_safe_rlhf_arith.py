"""End to end: Safe-RLHF keeps a binding cost under its limit while the reward rises.

Task: eight prompts ``a+b=``, four with one-digit sums and four with two-digit sums. The
reward is exact correctness; the cost is ``long_answer_cost`` (1 for an answer of two or
more characters), so every correct answer to half the prompts costs 1. The model is the
built-in one (random weights, then a format warm-up on wrong answers): it starts answering
with two digits about half the time, over the cost limit of 0.2. Trained without the
constraint (lambda fixed at 0) it usually learns the two-digit answers too and stays over
the limit (the control below: last-window mean cost 0.19, 0.40, 1.00, 0.81 on seeds 0-3,
measured on torch 2.13 CPU; earlier code, equal up to float summation order, gave 0.15, 0.64,
0.39, 0.72: one trajectory moves a lot with rounding, so the control is judged on the mean of
four seeds, not on one or two); with the multiplier,
lambda grows while the cost is over the limit, the cost falls under it on every seed
(0.03, 0.01, 0.05, 0.01 on seeds 0-3), and the reward still rises on the answers it can
afford. Fixed step counts; two seeds for the constrained runs, four for the control; 8-30 s per run on one core.
"""
from __future__ import annotations

import pytest
import torch

from hybridflow import PPOConfig
from hybridflow.data.datasets import write_prompt_dataset
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
from hybridflow.trainer import SafeRLHFTrainer

torch.set_num_threads(1)

PAIRS = {(1, 2), (2, 5), (4, 4), (0, 6), (5, 7), (9, 9), (8, 3), (6, 4)}  # sums 3 7 8 6 | 12 18 11 10
LIMIT, LAMBDA_LR, STEPS, WINDOW = 0.2, 0.5, 80, 16


def _train(tmp_path, seed: int, *, lambda_lr: float) -> list[dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    rows = [r for r in make_arithmetic_rows() if (r["extra_info"]["a"], r["extra_info"]["b"]) in PAIRS]
    data = write_prompt_dataset(rows, tmp_path / "train.jsonl")
    config = PPOConfig(
        train_files=str(data), output_dir=str(tmp_path / "run"), seed=seed, max_steps=STEPS, rollout_batch_size=8,
        n_samples=16, max_response_length=3, actor_lr=1e-3, critic_lr=1e-3, kl_coef=0.0, lam=1.0,
        cost_fn="hybridflow_ops.rewards.arithmetic:long_answer_cost", cost_limit=LIMIT, lagrange_lambda=0.0,
        lambda_lr=lambda_lr, val_samples=1, trackers=(), progress_bar=False, num_threads=1)
    return SafeRLHFTrainer(config=config).train()


def _mean(history: list[dict], key: str) -> float:
    return sum(m[key] for m in history) / len(history)


@pytest.mark.e2e
@pytest.mark.parametrize("seed", [0, 1])
def test_cost_ends_under_the_limit_while_the_reward_rises(tmp_path, seed):
    history = _train(tmp_path, seed, lambda_lr=LAMBDA_LR)
    costs = [m["critic/costs/mean"] for m in history]
    lambdas = [m["safe/lagrange_lambda"] for m in history]
    first, last = history[:WINDOW], history[-WINDOW:]
    summary = (f"seed {seed}: cost {_mean(first, 'critic/costs/mean'):.3f} -> {_mean(last, 'critic/costs/mean'):.3f}, "
               f"score {_mean(first, 'critic/score/mean'):.3f} -> {_mean(last, 'critic/score/mean'):.3f}, "
               f"lambda max {max(lambdas):.3f} final {lambdas[-1]:.3f}")
    print(summary)
    assert costs[0] > LIMIT, summary  # the constraint is violated at the start: it binds
    # lambda rose after every step over the limit (and followed the update rule at every step)
    for before, after, cost in zip(lambdas, lambdas[1:], costs):
        assert after == max(0.0, before + LAMBDA_LR * (cost - LIMIT))
        assert after > before or cost <= LIMIT
    assert max(lambdas) > 0.1, summary
    assert _mean(last, "critic/costs/mean") < LIMIT, summary
    # A window is 16 steps x 128 responses: at a score near 0.1 its mean has a standard error of
    # sqrt(0.1 * 0.9 / 2048) = 0.0066, so 0.04 is over 4 standard errors of the difference of two windows.
    assert _mean(last, "critic/score/mean") > _mean(first, "critic/score/mean") + 0.04, summary


@pytest.mark.e2e
def test_without_the_multiplier_the_learned_policy_breaks_the_limit(tmp_path):
    # the control: lambda stays 0, so only the reward is learned, and its two-digit answers cost.
    # Judged over four seeds: one may learn only the one-digit answers within the step budget
    # (seed 0 does, ending at 0.19), and the mean of two (0.29 on seeds 0-1) sat near the margin.
    finals, summaries = [], []
    for seed in (0, 1, 2, 3):
        history = _train(tmp_path / f"seed{seed}", seed, lambda_lr=0.0)
        assert {m["safe/lagrange_lambda"] for m in history} == {0.0}
        first, last = history[:WINDOW], history[-WINDOW:]
        finals.append(_mean(last, "critic/costs/mean"))
        summaries.append(f"seed {seed}: cost {_mean(first, 'critic/costs/mean'):.3f} -> {finals[-1]:.3f}, "
                         f"score {_mean(first, 'critic/score/mean'):.3f} -> {_mean(last, 'critic/score/mean'):.3f}")
    summary = "control: " + "; ".join(summaries)
    print(summary)
    assert sum(finals) / len(finals) > LIMIT + 0.1, summary
