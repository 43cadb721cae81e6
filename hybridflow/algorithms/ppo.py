"""PPO with a learned critic (Ouyang et al. 2022, InstructGPT; Schulman et al. 2017).

Advantages by GAE over per-token rewards, whitened over the batch for the actor
(as in PPO's reference implementations); the critic regresses on GAE's returns. The KL to the reference model is
either folded into the reward (``kl_in_reward``, the default) or added to the
actor's loss (``kl_as_loss=True``). ``entropy_coef > 0`` adds an entropy bonus.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def ppo(prompts, actor, critic, ref, reward, *, n=1, kl_coef=0.001, kl_type="k1", kl_as_loss=False, gamma=1.0,
        lam=0.95, clip_ratio=0.2, value_clip=0.2, entropy_coef=0.0, loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    old_logp, ref_logp = actor.logprob(rollout), ref.logprob(rollout)
    values, scores = critic.values(rollout), reward.score(rollout)
    policy_loss = hf.loss("ppo_clip", clip_low=clip_ratio, clip_high=clip_ratio, loss_agg_mode=loss_agg_mode)
    if kl_as_loss:
        rewards = hf.compute("score_to_token_rewards", rollout, scores)
        policy_loss += hf.loss("kl_loss", weight=kl_coef, kl_type=kl_type, loss_agg_mode=loss_agg_mode)
    else:
        rewards = hf.compute("kl_in_reward", rollout, scores, old_logp, ref_logp, kl_coef=kl_coef, kl_type=kl_type)
    if entropy_coef:
        policy_loss += hf.loss("entropy_bonus", weight=entropy_coef, loss_agg_mode=loss_agg_mode)
    adv = hf.compute("gae", rollout, rewards, values, gamma=gamma, lam=lam)
    actor.update(rollout, hf.compute("whiten", rollout, adv), old_logp, ref_logp, loss=policy_loss)
    critic.update(rollout, adv, values, loss="value_clip", clip_range=value_clip, loss_agg_mode=loss_agg_mode)
