"""Clipped value loss of the critic (PPO2)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import check_loss_inputs, select_valid, token_metric
from .aggregate import aggregate_loss

__all__ = ["ValueLoss", "value_clip"]


class ValueLoss(NamedTuple):
    loss: torch.Tensor
    vf_clipfrac: torch.Tensor
    vpred_mean: torch.Tensor


@register_op(
    "value_clip",
    model_inputs=("value_preds: float32[B, R]",),
    inputs=("values: float32[B, R]", "returns: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("loss: float32",),
    kind="loss",
)
def value_clip(
    value_preds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_range: float = 0.2,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> ValueLoss:
    """Clipped squared-error value loss.

    Shapes: value_preds (with grad), values (the critic's values at rollout time),
    returns, response_mask ``(b, r)`` -> loss and metrics, scalars.

        V_clip = values + clip(value_preds - values, -clip_range, clip_range)
        l_t    = 0.5 * max((value_preds - returns)^2, (V_clip - returns)^2)
        loss   = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    Reference: the PPO2 value clipping of OpenAI baselines (Dhariwal et al. 2017),
    discussed in Engstrom et al. 2020, "Implementation Matters in Deep RL", Sec. 3.
    Metrics: ``vf_clipfrac`` (fraction of valid tokens where the clipped term is
    larger), ``vpred_mean`` (mean prediction).
    """
    if clip_range < 0:
        raise ValueError(f"clip_range must be >= 0, got {clip_range}")
    valid = check_loss_inputs(response_mask, value_preds=value_preds, values=values, returns=returns)
    preds = select_valid(value_preds, valid)
    old = select_valid(values, valid)
    target = select_valid(returns, valid)
    clipped_preds = old + (preds - old).clamp(-clip_range, clip_range)
    unclipped_sq = (preds - target).square()
    clipped_sq = (clipped_preds - target).square()
    loss_mat = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    return ValueLoss(
        loss=aggregate_loss(
            loss_mat, response_mask, mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length,
        ),
        vf_clipfrac=token_metric(clipped_sq > unclipped_sq, valid, loss_mat.dtype),
        vpred_mean=token_metric(preds, valid),
    )
