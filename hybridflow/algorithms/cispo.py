"""CISPO: GRPO's advantages with REINFORCE weighted by a clipped, detached importance ratio.

MiniMax 2025, "MiniMax-M1", arXiv 2506.13585, sec. 3.1: no token loses its gradient to the
clip (only the weight is clipped, to ``1 + clip_high`` above and, by default, nothing below),
token-level loss. ``kl_coef > 0`` adds a KL loss to a reference model (the paper has none).
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def cispo(prompts, actor, ref, reward, *, n=8, clip_low=1.0, clip_high=0.28, loss_agg_mode="token-mean", kl_coef=0.0,
          kl_type="low_var_kl"):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
    inputs, loss = [rollout, adv, actor.logprob(rollout)], hf.loss("cispo", clip_low=clip_low, clip_high=clip_high, loss_agg_mode=loss_agg_mode)
    if kl_coef:
        inputs.append(ref.logprob(rollout))
        loss += hf.loss("kl_loss", weight=kl_coef, kl_type=kl_type, loss_agg_mode=loss_agg_mode)
    actor.update(*inputs, loss=loss)
