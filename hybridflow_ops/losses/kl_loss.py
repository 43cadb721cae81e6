"""KL-to-reference as a loss term (GRPO's KL, instead of KL in the reward)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..kl import kl_penalty
from ..registry import register_op
from ._common import check_loss_inputs, select_valid, token_metric
from .aggregate import aggregate_loss

__all__ = ["KLLoss", "kl_loss"]


class KLLoss(NamedTuple):
    loss: torch.Tensor
    kl: torch.Tensor


@register_op(
    "kl_loss",
    model_inputs=("log_probs: float32[B, R]",),
    inputs=("ref_log_probs: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("loss: float32",),
    kind="loss",
)
def kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> KLLoss:
    """KL penalty between the policy and the reference, as a loss.

    Shapes: log_probs (with grad), ref_log_probs, response_mask ``(b, r)`` -> loss and the metric ``kl``, scalars.

        k_t  = kl_penalty(log_probs_t, ref_log_probs_t, kl_type=kl_type)     (see hybridflow_ops.kl)
        loss = aggregate_loss(k, response_mask, mode=loss_agg_mode, ...)

    Its weight (beta) is the loss term's: ``hf.loss("kl_loss", weight=beta)``; the op itself has no
    coefficient, so that a term is scaled in one place only.

    Reference: Shao et al. 2024 (DeepSeekMath), eq. 4, which uses the k3 estimator
    (Schulman 2020, "Approximating KL Divergence"); hence the default ``low_var_kl``.
    Metric: ``kl``, the mean estimate over this batch's valid tokens.
    """
    valid = check_loss_inputs(response_mask, log_probs=log_probs, ref_log_probs=ref_log_probs)
    kl = kl_penalty(select_valid(log_probs, valid), select_valid(ref_log_probs.detach(), valid), kl_type=kl_type)
    aggregated = aggregate_loss(
        kl, response_mask, mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length,
    )
    return KLLoss(loss=aggregated, kl=token_metric(kl, valid))
