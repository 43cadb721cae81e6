"""GSPO: group-relative advantages with a sequence-level importance ratio and clip.

Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071: the ratio is the
length-normalised sequence ratio ``(pi(y|x) / pi_old(y|x))^(1/|y|)``, clipped to the paper's
tiny range ``[1 - 3e-4, 1 + 4e-4]``, with GRPO's advantages and no KL term (the ``gspo`` loss).
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def gspo(prompts, actor, reward, *, n=8, clip_low=3e-4, clip_high=4e-4, loss_agg_mode="seq-mean-token-mean"):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
    loss = hf.loss("gspo", clip_low=clip_low, clip_high=clip_high, loss_agg_mode=loss_agg_mode)
    actor.update(rollout, adv, actor.logprob(rollout), loss=loss)
