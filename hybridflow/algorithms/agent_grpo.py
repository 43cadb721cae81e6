"""GRPO over multi-turn, tool-calling trajectories.

The rollout is a generate node with an environment (``env=``): each of the ``n`` responses
per prompt is a trajectory of model turns and observations, with a response mask that is 1
only on the tokens the model sampled, so the PPO-clip and KL terms (masked means over
``response_mask``) never train on observations. The score of a trajectory is the reward
role's score of its final answer (``reward_from="reward"``, which validation uses too) or the
environment's summed reward (``reward_from="env"``); advantages are normalised within each
prompt's group as in GRPO (Shao et al. 2024, sec. 4.1).

Use it as ``algorithm: agent_grpo`` (``examples/agent_calc``).
"""
from __future__ import annotations

import hybridflow as hf

from .grpo import grpo_update


@hf.algorithm
def agent_grpo(prompts, actor, ref, reward, *, env="calc", n=8, max_turns=3, max_tokens_per_turn=16,
               max_total_tokens=48, observation_role=None, reward_from="reward", norm_by_std=True, clip_ratio=0.2, kl_loss=True,
               kl_coef=0.001, kl_type="low_var_kl", loss_agg_mode="token-mean", recompute_old_log_probs=True,
               entropy_coef=0.0):
    rollout = actor.generate(prompts, n=n, env=env, max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn,
                             max_total_tokens=max_total_tokens, observation_role=observation_role)
    old_logp = actor.logprob(rollout) if recompute_old_log_probs else hf.compute("old_log_probs_from_rollout", rollout)
    scores = hf.compute("env_scores", rollout) if reward_from == "env" else reward.score(rollout)
    adv = hf.compute("grpo_advantage", rollout, scores, norm_by_std=norm_by_std)
    grpo_update(actor, ref, rollout, adv, old_logp, clip_ratio=clip_ratio, kl_loss=kl_loss, kl_coef=kl_coef,
                kl_type=kl_type, loss_agg_mode=loss_agg_mode, entropy_coef=entropy_coef)
