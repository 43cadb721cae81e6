"""Entropy of the token distribution, and the entropy bonus loss."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import check_loss_inputs, select_valid, token_metric
from .aggregate import aggregate_loss

__all__ = ["EntropyLoss", "entropy_from_logits", "entropy_bonus"]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last dim.

    Shapes: logits ``(b, t, v)`` -> entropy ``(b, t)`` (any leading dims work).

        log p = logits - logsumexp(logits)
        H     = -sum_v p log p

    Computed from the log-softmax, so large logits neither overflow nor lose
    precision; ``-inf`` logits (banned tokens) contribute 0. Half-precision
    logits are computed in float32.
    """
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty vocabulary dim, got shape {tuple(logits.shape)}")
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    # Shifting by the (detached) max first keeps log p exact near the top logits even when they are large.
    shifted = x - x.detach().amax(dim=-1, keepdim=True)
    log_p = shifted - torch.logsumexp(shifted, dim=-1, keepdim=True)
    # 0 * (-inf) would be nan; clamping log p to the most negative finite value makes it 0 * finite = 0.
    return -(log_p.exp() * log_p.clamp(min=torch.finfo(log_p.dtype).min)).sum(dim=-1)


class EntropyLoss(NamedTuple):
    loss: torch.Tensor
    entropy: torch.Tensor


@register_op(
    "entropy_bonus",
    model_inputs=("entropy: float32[B, R]",),
    inputs=("response_mask: float32[B, R]",),
    outputs=("loss: float32",),
    kind="loss",
)
def entropy_bonus(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> EntropyLoss:
    """Entropy bonus: minimising this loss raises the policy's entropy.

    Shapes: entropy ``(b, r)`` (with grad, e.g. from :func:`entropy_from_logits`),
    response_mask ``(b, r)`` -> loss and the metric ``entropy``, scalars.

        loss = -aggregate_loss(H, response_mask, mode=loss_agg_mode, ...)

    Its weight (c2) is the loss term's: ``hf.loss("entropy_bonus", weight=c2)``.

    Reference: Schulman et al. 2017 (PPO), eq. 9, the ``c2 S[pi]`` term.
    Metric: ``entropy``, the mean entropy over this batch's valid tokens.
    """
    valid = check_loss_inputs(response_mask, entropy=entropy)
    aggregated = aggregate_loss(
        select_valid(entropy, valid), response_mask,
        mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length,
    )
    return EntropyLoss(loss=-aggregated, entropy=token_metric(entropy, valid))
