"""Clip-Cov: GRPO whose PPO loss detaches the gradient of a few random high-covariance tokens.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617, sec. 4: entropy collapse is driven by the tokens whose log-prob
and advantage covary most; Clip-Cov takes a fraction ``clip_cov_ratio`` of the tokens with
covariance in ``(clip_cov_lb, clip_cov_ub)`` out of the gradient (the ``clip_cov`` loss).
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def clip_cov(prompts, actor, reward, *, n=8, clip_low=0.2, clip_high=0.2, clip_cov_ratio=2e-4, clip_cov_lb=1.0,
             clip_cov_ub=5.0, loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
    loss = hf.loss("clip_cov", clip_low=clip_low, clip_high=clip_high, clip_cov_ratio=clip_cov_ratio,
                   clip_cov_lb=clip_cov_lb, clip_cov_ub=clip_cov_ub, loss_agg_mode=loss_agg_mode)
    actor.update(rollout, adv, actor.logprob(rollout), loss=loss)
