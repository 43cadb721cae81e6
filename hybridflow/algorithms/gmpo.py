"""GMPO: GRPO with the geometric mean of the token ratios in place of their arithmetic mean.

Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673: the sequence
objective is ``A * prod_t r_t^(1/|y|)`` with each token's log-ratio clipped to
``[-0.4, 0.4]`` (the ``gmpo`` loss), GRPO's advantages, no KL term.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def gmpo(prompts, actor, reward, *, n=8, clip_low=0.4, clip_high=0.4, loss_agg_mode="seq-mean-token-mean"):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
    loss = hf.loss("gmpo", clip_low=clip_low, clip_high=clip_high, loss_agg_mode=loss_agg_mode)
    actor.update(rollout, adv, actor.logprob(rollout), loss=loss)
