"""OPO: exact on-policy training with the length-weighted optimal reward baseline.

Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv 2505.23585: one update
per batch (so the PPO ratio is 1 and the clip never acts), advantages ``s_i - b_g`` with
``b_g`` the group's length-weighted mean score (``opo_advantage``), no KL term.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def opo(prompts, actor, reward, *, n=8, clip_ratio=0.2, loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("opo_advantage", rollout, reward.score(rollout))
    loss = hf.loss("ppo_clip", clip_low=clip_ratio, clip_high=clip_ratio, loss_agg_mode=loss_agg_mode)
    actor.update(rollout, adv, actor.logprob(rollout), loss=loss)
