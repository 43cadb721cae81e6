"""Negative log-likelihood of the response tokens: supervised fine-tuning as a loss term."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import check_loss_inputs
from .aggregate import aggregate_loss

__all__ = ["NLLLoss", "nll"]


class NLLLoss(NamedTuple):
    loss: torch.Tensor


@register_op(
    "nll",
    model_inputs=("log_probs: float32[B, R]",),
    inputs=("response_mask: float32[B, R]",),
    outputs=("loss: float32",),
    kind="loss",
)
def nll(
    log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> NLLLoss:
    """Cross-entropy of the given response tokens: ``aggregate(-log p(y_t | x, y_<t))``.

    Shapes: log_probs, response_mask ``(b, r)`` -> loss, a scalar. Used for supervised
    steps (a format warm-up, SFT) with the same engine and aggregation as the RL losses.
    """
    valid = check_loss_inputs(response_mask, log_probs=log_probs)
    loss_mat = torch.where(valid, -log_probs, torch.zeros((), dtype=log_probs.dtype, device=log_probs.device))
    return NLLLoss(aggregate_loss(loss_mat, response_mask, mode=loss_agg_mode, global_tokens=global_tokens,
                                  global_seqs=global_seqs, norm_length=norm_length))
