"""REINFORCE++: REINFORCE with the KL folded into per-token rewards and global advantage normalisation.

Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
Language Models", sec. 3: token rewards ``r_t = -beta * KL_t (+ s at the last
token)``, returns ``G_t = sum_{k>=t} gamma^(k-t) r_k``, advantages = returns
whitened over the whole batch; no critic. ``n > 1`` samples several responses
per prompt (the paper's method works with any n).
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def reinforce_pp(prompts, actor, ref, reward, *, n=1, kl_coef=0.001, kl_type="k2", gamma=1.0, clip_ratio=0.2,
                 loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    old_logp, ref_logp = actor.logprob(rollout), ref.logprob(rollout)
    scores = reward.score(rollout)
    rewards = hf.compute("kl_in_reward", rollout, scores, old_logp, ref_logp, kl_coef=kl_coef, kl_type=kl_type)
    adv = hf.compute("reinforce_pp_advantage", rollout, rewards, gamma=gamma)
    loss = hf.loss("ppo_clip", clip_low=clip_ratio, clip_high=clip_ratio, loss_agg_mode=loss_agg_mode)
    actor.update(rollout, adv, old_logp, loss=loss)
