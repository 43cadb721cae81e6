"""Pass@k training: GRPO whose advantages reward each response's share in the group's pass@k.

Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and Exploitation of
Large Reasoning Models", arXiv 2508.10751: with binary rewards, the analytic advantage of
``passk_advantage`` (over the k-subsets of the group) replaces GRPO's, under the PPO clip.
``n`` must be at least ``k``.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def passk(prompts, actor, reward, *, n=8, k=4, clip_ratio=0.2, loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("passk_advantage", rollout, reward.score(rollout), k=k)
    loss = hf.loss("ppo_clip", clip_low=clip_ratio, clip_high=clip_ratio, loss_agg_mode=loss_agg_mode)
    actor.update(rollout, adv, actor.logprob(rollout), loss=loss)
