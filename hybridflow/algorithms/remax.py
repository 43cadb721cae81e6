"""ReMax: REINFORCE with the reward of the greedy response as the baseline.

Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement
Learning Method for Aligning Large Language Models", Algorithm 1: for each
prompt, sample a response and decode a greedy one; ``A = s(sampled) -
s(greedy)`` on every token of the sampled response. The greedy rollout is
scored into ``baseline_scores``; its batch dim must equal the sampled one.
``kl_coef > 0`` adds a KL loss term and the reference model.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def remax(prompts, actor, ref, reward, *, clip_ratio=0.2, kl_coef=0.0, kl_type="low_var_kl", loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts)
    greedy = actor.generate(prompts, greedy=True)
    old_logp, scores = actor.logprob(rollout), reward.score(rollout)
    baseline = reward.score(greedy, as_="baseline_scores")
    adv = hf.compute("remax_advantage", rollout, scores, baseline)
    policy_loss = hf.loss("ppo_clip", clip_low=clip_ratio, clip_high=clip_ratio, loss_agg_mode=loss_agg_mode)
    inputs = [rollout, adv, old_logp]
    if kl_coef:
        inputs.append(ref.logprob(rollout))
        policy_loss += hf.loss("kl_loss", weight=kl_coef, kl_type=kl_type, loss_agg_mode=loss_agg_mode)
    actor.update(*inputs, loss=policy_loss)
