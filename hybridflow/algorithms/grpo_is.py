"""GRPO for overlapped (one-step off-policy) training: the PPO loss weighted by truncated IS.

When generation of step i+1 overlaps training of step i (a plan with ``staleness=1``),
responses are sampled by weights one update older than the policy being trained. The
policy loss is then weighted per token by ``min(pi_old / pi_rollout, cap)`` (truncated
importance sampling; Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"). On-policy the weights are 1 and this is plain GRPO without KL.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def grpo_is(prompts, actor, reward, *, n=8, cap=2.0, clip_ratio=0.2, loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    old_logp = actor.logprob(rollout)
    adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
    weights = hf.compute("truncated_is_weight", old_logp, rollout, cap=cap)
    loss = hf.loss("ppo_clip_is", clip_low=clip_ratio, clip_high=clip_ratio, loss_agg_mode=loss_agg_mode)
    actor.update(rollout, adv, old_logp, weights, loss=loss)
