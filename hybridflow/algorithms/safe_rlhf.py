"""Safe-RLHF: PPO on a reward and a cost, combined by a Lagrange multiplier that adapts.

Dai et al. 2023, "Safe RLHF: Safe Reinforcement Learning from Human
Feedback" (arXiv 2310.12773), sec. 3.3: the constrained problem
``max J_R(theta) s.t. J_C(theta) <= d`` is solved through its Lagrangian
``min_{lambda >= 0} max_theta J_R(theta) - lambda * (J_C(theta) - d)``.
A reward critic and a cost critic give GAE advantages ``A_r`` and ``A_c``;
the actor is trained on

    A = (A_r - lambda * A_c) / (1 + lambda)

(the ``1 + lambda`` keeps the advantage scale independent of lambda). The
KL to the reference is folded into the reward side only.

The cost comes from the ``cost`` role, configured apart from the reward
(``cost_fn``, a compute_score-style rule returning a cost, or
``cost_model_name``). The multiplier is run state (:data:`LAGRANGE_MULTIPLIER`,
see :mod:`hybridflow.graph.state`): ``lagrange_lambda`` is its initial value;
after each step the trainer sets it with :func:`lagrange_update` from the
step's mean episode cost (metric ``critic/costs/mean``), feeds it to the
``safe_rlhf_advantage`` node of the next step, logs the value each step ran
with as ``safe/lagrange_lambda``, and checkpoints it. ``cost_limit`` and
``lambda_lr`` are graph attributes for that purpose; the graph itself does
not change.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

import hybridflow as hf
from hybridflow_ops import register_op

from ..graph import StateRule


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


def lagrange_update(lagrange_lambda: float, mean_cost: float, *, cost_limit: float, lambda_lr: float) -> float:
    """One projected gradient-ascent step on the dual: ``max(0, lambda + lambda_lr * (mean_cost - cost_limit))``.

    ``mean_cost`` is the step's mean episode cost ``J_C`` (one cost per response,
    averaged over the step's responses), ``cost_limit`` the threshold ``d``: lambda
    grows while the constraint ``J_C <= d`` is violated and shrinks (to 0 at most)
    while it holds. This is projected (sub)gradient descent on the dual of the
    Lagrangian of Dai et al. 2023 (Safe RLHF), sec. 3.3 (its derivative in lambda is
    ``-(J_C - d)``). The paper's appendix (eq. 31) and its code step ``ln lambda``
    instead (``ln lambda_{k+1} = ln lambda_k + alpha * lambda_k * J_C``, with the
    threshold inside ``J_C``; Adam in the code); the projected step on lambda is kept
    here because it is exact to check by hand and lets lambda reach exactly 0 once
    the cost stays under the limit (``ln lambda`` never does).
    """
    if lagrange_lambda < 0 or lambda_lr < 0:
        raise ValueError(f"lagrange_lambda and lambda_lr must be >= 0, got {lagrange_lambda} and {lambda_lr}")
    return max(0.0, lagrange_lambda + lambda_lr * (mean_cost - cost_limit))


LAGRANGE_MULTIPLIER = StateRule(
    name="lagrange_lambda", observes="critic/costs/mean", update=lagrange_update, hyper=("cost_limit", "lambda_lr"),
    feeds=(("safe_rlhf_advantage", "lagrange_lambda"),), metric="safe/lagrange_lambda")
"""Safe-RLHF's run state: lambda, updated from the mean episode cost after each step."""


@hf.algorithm(state=(LAGRANGE_MULTIPLIER,))
def safe_rlhf(prompts, actor, critic, cost_critic, ref, reward, cost, *, n=1, kl_coef=0.001, kl_type="k1", gamma=1.0,
              lam=0.95, clip_ratio=0.2, value_clip=0.2, lagrange_lambda=1.0, cost_limit=0.0, lambda_lr=0.01):
    rollout = actor.generate(prompts, n=n)
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
