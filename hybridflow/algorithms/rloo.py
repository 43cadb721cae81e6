"""RLOO: REINFORCE with a leave-one-out baseline over n responses per prompt.

Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization
for Learning from Human Feedback in LLMs", eq. 4:
``A_i = s_i - mean_{j != i} s_j`` within each prompt's group, on every token.
The paper folds the KL to the reference into the sequence reward; here, as
the score is per sequence, the KL is a loss term instead (``kl_coef > 0``
adds it and the reference model; the default 0 needs no reference).
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def rloo(prompts, actor, ref, reward, *, n=4, clip_ratio=0.2, kl_coef=0.0, kl_type="low_var_kl", loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    old_logp = actor.logprob(rollout)
    adv = hf.compute("rloo_advantage", rollout, reward.score(rollout))
    policy_loss = hf.loss("ppo_clip", clip_low=clip_ratio, clip_high=clip_ratio, loss_agg_mode=loss_agg_mode)
    inputs = [rollout, adv, old_logp]
    if kl_coef:
        inputs.append(ref.logprob(rollout))
        policy_loss += hf.loss("kl_loss", weight=kl_coef, kl_type=kl_type, loss_agg_mode=loss_agg_mode)
    actor.update(*inputs, loss=policy_loss)
