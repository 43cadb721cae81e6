"""GRPO: n responses per prompt, advantages normalised within each group, no critic.

Shao et al. 2024 (DeepSeekMath), sec. 4.1: ``A_i = (s_i - mean(s_group)) / std(s_group)``
on every token, with the KL to the reference as a loss term (``kl_loss``;
set ``kl_loss=False`` to drop it and the reference model).

Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") is
``grpo.build(norm_by_std=False, loss_agg_mode="seq-mean-token-sum-norm")``:
no division by the group's std, and a constant length normaliser.

``recompute_old_log_probs=False`` takes PPO's old log-probs from the rollout engine
(saves one actor forward per step; exact on-policy when the rollout engine computes
the train engine's log-probs, as the transformers engine does).

``entropy_coef > 0`` adds an entropy bonus to the actor's loss (verl's ``entropy_coeff``):
with binary rewards a group whose samples all agree has advantage 0, so nothing else
keeps a prompt that has collapsed onto one wrong answer exploring.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def grpo(prompts, actor, ref, reward, *, n=8, norm_by_std=True, clip_ratio=0.2, kl_loss=True, kl_coef=0.001,
         kl_type="low_var_kl", loss_agg_mode="token-mean", recompute_old_log_probs=True, entropy_coef=0.0):
    rollout = actor.generate(prompts, n=n)
    if recompute_old_log_probs:
        old_logp = actor.logprob(rollout)
    else:
        old_logp = hf.compute("old_log_probs_from_rollout", rollout)
    adv = hf.compute("grpo_advantage", rollout, reward.score(rollout), norm_by_std=norm_by_std)
    grpo_update(actor, ref, rollout, adv, old_logp, clip_ratio=clip_ratio, kl_loss=kl_loss, kl_coef=kl_coef,
                kl_type=kl_type, loss_agg_mode=loss_agg_mode, entropy_coef=entropy_coef)


def grpo_update(actor, ref, rollout, adv, old_logp, *, clip_ratio, kl_loss, kl_coef, kl_type, loss_agg_mode,
                entropy_coef):
    """GRPO's actor update (traced inside an algorithm): PPO-clip, plus the KL to ``ref`` as a loss term when
    ``kl_loss`` (the reference's log-probs then feed it) and an entropy bonus when ``entropy_coef``."""
    policy_loss = hf.loss("ppo_clip", clip_low=clip_ratio, clip_high=clip_ratio, loss_agg_mode=loss_agg_mode)
    inputs = [rollout, adv, old_logp]
    if kl_loss:
        inputs.append(ref.logprob(rollout))
        policy_loss += hf.loss("kl_loss", weight=kl_coef, kl_type=kl_type, loss_agg_mode=loss_agg_mode)
    if entropy_coef:
        policy_loss += hf.loss("entropy_bonus", weight=entropy_coef, loss_agg_mode=loss_agg_mode)
    actor.update(*inputs, loss=policy_loss)
