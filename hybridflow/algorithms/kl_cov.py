"""KL-Cov: GRPO whose surrogate adds a KL penalty on the top-covariance tokens.

Cui et al. 2025, arXiv 2505.22617, sec. 4: the ``kl_cov_ratio`` fraction of tokens whose
log-prob and advantage covary most get ``kl_coef |log r_t|`` added to their loss, the others
the unclipped surrogate (the ``kl_cov`` loss).
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def kl_cov(prompts, actor, reward, *, n=8, kl_cov_ratio=2e-3, kl_cov_coef=1.0, loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
    loss = hf.loss("kl_cov", kl_cov_ratio=kl_cov_ratio, kl_coef=kl_cov_coef, loss_agg_mode=loss_agg_mode)
    actor.update(rollout, adv, actor.logprob(rollout), loss=loss)
