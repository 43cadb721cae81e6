"""REINFORCE++: discounted return-to-go of token rewards, whitened over the batch."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..masked import masked_whiten
from ..registry import register_op
from ._common import check_token_inputs, select_valid

__all__ = ["ReinforcePPResult", "discounted_returns", "reinforce_pp_advantage"]


class ReinforcePPResult(NamedTuple):
    advantages: torch.Tensor
    returns: torch.Tensor


def discounted_returns(token_rewards: torch.Tensor, response_mask: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """Return-to-go ``G_t = r_t + gamma * G_next(t)`` over valid positions, skipping padding.

    Shapes: token_rewards ``(b, r)``, response_mask ``(b, r)`` -> returns ``(b, r)``, 0 at padding.
    ``next(t)`` is the next valid position of the row; after the last one ``G = 0``.
    """
    check_token_inputs(response_mask, token_rewards=token_rewards)
    valid = response_mask.to(torch.bool)
    rewards = select_valid(token_rewards, valid)
    running = torch.zeros_like(rewards[:, 0])
    columns = []
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        columns.append(torch.where(valid[:, t], running, torch.zeros_like(running)))
    return torch.stack(columns[::-1], dim=1) if columns else torch.zeros_like(rewards)


@register_op(
    "reinforce_pp_advantage",
    inputs=("token_rewards: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("advantages: float32[B, R]", "returns: float32[B, R]"),
)
def reinforce_pp_advantage(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> ReinforcePPResult:
    """REINFORCE++ advantage: batch-whitened discounted return-to-go.

    Shapes: token_rewards ``(b, r)``, response_mask ``(b, r)`` -> advantages ``(b, r)``, returns ``(b, r)``.

        G_t = sum_{k >= t, valid} gamma^(#valid steps from t to k) r_k      (returns)
        A_t = (G_t - mean(G)) / sqrt(var(G) + eps)                            (mean, var over the batch's valid tokens)

    The token rewards normally carry the KL penalty and the score on the last
    token (``kl_in_reward``). Reference: Hu 2025, "REINFORCE++: A Simple and
    Efficient Approach for Aligning Large Language Models" (arXiv 2501.03262), Sec. 3.
    """
    returns = discounted_returns(token_rewards, response_mask, gamma=gamma)
    return ReinforcePPResult(masked_whiten(returns, response_mask, eps=eps).whitened, returns)
