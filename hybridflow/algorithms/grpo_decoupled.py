"""GRPO with AReaL's decoupled PPO loss: the behaviour policy weights the samples, the proximal policy anchors the clip.

With asynchronous generation (``staleness=k``) the responses were sampled by weights up to k
updates old (the *behaviour* policy ``mu``, whose log-probs the rollout returns). AReaL's
decoupled objective keeps PPO's clip around the *proximal* policy ``pi_prox`` -- the weights at the
start of this update, whose log-probs ``actor.logprob`` recomputes -- and corrects for ``mu`` with
the importance weight ``pi_prox / mu`` (tokens whose weight exceeds ``behav_cap`` are dropped; None
keeps all):

    J = E_mu[ (pi_prox / mu) min(r A, clip(r, 1 - eps, 1 + eps) A) ],   r = pi_theta / pi_prox

On-policy ``pi_prox = mu`` up to engine numerics, the weights are 1 and this is GRPO without KL.
Reference: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
Language Reasoning", arXiv 2505.24298, eq. 5.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def grpo_decoupled(prompts, actor, reward, *, n=8, behav_cap=None, clip_ratio=0.2, loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    proximal_logp = actor.logprob(rollout)
    adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
    weights = hf.compute("decoupled_is_weight", proximal_logp, rollout, cap=behav_cap)
    loss = hf.loss("ppo_clip_is", clip_low=clip_ratio, clip_high=clip_ratio, loss_agg_mode=loss_agg_mode)
    actor.update(rollout, adv, proximal_logp, weights, loss=loss)
