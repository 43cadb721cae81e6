"""Safe-RLHF: PPO on a reward model and a cost model, combined by a Lagrangian weight.

Dai et al. 2023, "Safe RLHF: Safe Reinforcement Learning from Human
Feedback", sec. 3.3: maximise ``J_R(theta) - lambda * (J_C(theta) - d)``.
A reward critic and a cost critic give GAE advantages ``A_r`` and ``A_c``;
the actor is trained on

    A = (A_r - lambda * A_c) / (1 + lambda)

(the ``1 + lambda`` keeps the advantage scale independent of lambda). The
KL to the reference is folded into the reward side only.

The multiplier is a runtime quantity: ``lagrange_lambda`` is its initial
value; after each iteration the trainer sets
``lambda <- max(0, lambda + lambda_lr * (mean episode cost - cost_limit))``
and passes it as the ``lagrange_lambda`` attribute of the
``safe_rlhf_advantage`` node. ``cost_limit`` and ``lambda_lr`` are graph
attributes for that purpose; the graph itself does not change.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

import hybridflow as hf
from hybridflow_ops import register_op


class SafeAdvantage(NamedTuple):
    advantages: torch.Tensor


@register_op(
    "safe_rlhf_advantage",
    inputs=("advantages: float32[B, R]", "cost_advantages: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("advantages: float32[B, R]",),
)
def safe_rlhf_advantage(advantages: torch.Tensor, cost_advantages: torch.Tensor, response_mask: torch.Tensor, *,
                        lagrange_lambda: float = 1.0) -> SafeAdvantage:
    """``A = (A_r - lambda * A_c) / (1 + lambda)`` on valid tokens, 0 at padding.

    Shapes: advantages ``(b, r)`` (reward side), cost_advantages ``(b, r)``,
    response_mask ``(b, r)`` -> advantages ``(b, r)``. ``lagrange_lambda >= 0``.
    Reference: Dai et al. 2023 (Safe RLHF), eq. 10 and its implementation's
    normalisation by ``1 + lambda``.
    """
    if lagrange_lambda < 0:
        raise ValueError(f"lagrange_lambda must be >= 0, got {lagrange_lambda}")
    if not (advantages.shape == cost_advantages.shape == response_mask.shape):
        raise ValueError(f"shapes differ: advantages {tuple(advantages.shape)}, cost_advantages "
                         f"{tuple(cost_advantages.shape)}, response_mask {tuple(response_mask.shape)}")
    combined = (advantages - lagrange_lambda * cost_advantages) / (1.0 + lagrange_lambda)
    return SafeAdvantage(torch.where(response_mask.to(torch.bool), combined, torch.zeros_like(combined)))


@hf.algorithm
def safe_rlhf(prompts, actor, critic, cost_critic, ref, reward, cost, *, kl_coef=0.001, kl_type="k1", gamma=1.0, lam=0.95,
              clip_ratio=0.2, value_clip=0.2, lagrange_lambda=1.0, cost_limit=0.0, lambda_lr=0.01):
    rollout = actor.generate(prompts)
    old_logp, ref_logp = actor.logprob(rollout), ref.logprob(rollout)
    values, cost_values = critic.values(rollout), cost_critic.values(rollout)
    scores, costs = reward.score(rollout), cost.score(rollout)
    rewards = hf.compute("kl_in_reward", rollout, scores, old_logp, ref_logp, kl_coef=kl_coef, kl_type=kl_type)
    reward_adv = hf.compute("gae", rollout, rewards, values, gamma=gamma, lam=lam)
    cost_rewards = hf.compute("score_to_token_rewards", rollout, costs.rename(costs="scores"))
    cost_adv = hf.compute("gae", rollout, cost_rewards, cost_values, gamma=gamma, lam=lam)
    adv = hf.compute("safe_rlhf_advantage", rollout, reward_adv, cost_adv.rename(advantages="cost_advantages"),
                     lagrange_lambda=lagrange_lambda)
    actor.update(rollout, adv, old_logp, loss="ppo_clip", clip_low=clip_ratio, clip_high=clip_ratio)
    critic.update(rollout, reward_adv, values, loss="value_clip", clip_range=value_clip)
    cost_critic.update(rollout, cost_adv, cost_values, loss="value_clip", clip_range=value_clip)
