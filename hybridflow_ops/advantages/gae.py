"""Generalised advantage estimation over token-level rewards (PPO with a critic)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import check_token_inputs, select_valid

__all__ = ["GAEResult", "gae"]


class GAEResult(NamedTuple):
    advantages: torch.Tensor
    returns: torch.Tensor


@register_op(
    "gae",
    inputs=("token_rewards: float32[B, R]", "values: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("advantages: float32[B, R]", "returns: float32[B, R]"),
)
def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> GAEResult:
    """Generalised advantage estimation, skipping padding.

    Shapes: token_rewards ``(b, r)``, values ``(b, r)``, response_mask ``(b, r)``
    -> advantages ``(b, r)``, returns ``(b, r)``; both 0 at padding.

    Over the valid positions ``t_1 < t_2 < ... < t_n`` of a row (padding is
    skipped, so ``next(t)`` is the next *valid* position and the value after
    the last one is 0):

        delta_t = r_t + gamma * V_next(t) - V_t
        A_t     = delta_t + gamma * lam * A_next(t)
        R_t     = A_t + V_t

    Inserting masked positions anywhere, with any values, changes nothing.
    Reference: Schulman et al. 2016, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", eq. 16; returns as in PPO (Schulman et al. 2017).
    Advantages are not whitened here; compose with the ``whiten`` op for that.
    """
    check_token_inputs(response_mask, token_rewards=token_rewards, values=values)
    valid = response_mask.to(torch.bool)
    rewards = select_valid(token_rewards, valid)
    vals = select_valid(values, valid)
    next_value = torch.zeros_like(vals[:, 0])
    running = torch.zeros_like(vals[:, 0])
    columns = []
    for t in reversed(range(vals.shape[1])):
        is_valid = valid[:, t]
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        running = torch.where(is_valid, delta + gamma * lam * running, running)
        next_value = torch.where(is_valid, vals[:, t], next_value)
        columns.append(torch.where(is_valid, running, torch.zeros_like(running)))
    advantages = torch.stack(columns[::-1], dim=1) if columns else torch.zeros_like(vals)
    returns = select_valid(advantages + vals, valid)
    return GAEResult(advantages, returns)
