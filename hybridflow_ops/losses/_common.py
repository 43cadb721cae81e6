"""Shared checks and helpers of the loss ops."""
from __future__ import annotations

import torch

from ..masked import masked_mean

__all__ = ["check_loss_inputs", "select_valid", "token_metric", "clamped_exp", "weigh_tokens", "LOG_RATIO_CLAMP"]

# Log-ratios are clamped before exp so that one token cannot overflow the loss (as verl does).
LOG_RATIO_CLAMP = 20.0


def check_loss_inputs(mask: torch.Tensor, **tensors: torch.Tensor) -> torch.Tensor:
    """Check every tensor has ``mask``'s ``(b, r)`` shape; return the boolean mask."""
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be (batch, response_len), got shape {tuple(mask.shape)}")
    for name, tensor in tensors.items():
        if tensor.shape != mask.shape:
            raise ValueError(f"{name} of shape {tuple(tensor.shape)} must match response_mask of shape {tuple(mask.shape)}")
    return mask.to(torch.bool)


def select_valid(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``values`` with padding replaced by 0.

    Applied to the *inputs* of a loss, so that nan/inf at padding reaches
    neither the loss nor the gradient (the gradient at padding is exactly 0).
    """
    return torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))


def token_metric(values: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Detached mean of ``values`` over this batch's valid tokens (a scalar for logging).

    Boolean indicators (e.g. "was clipped") become fractions in ``dtype`` (float32 when None).
    """
    values = values.detach()
    if not values.is_floating_point():
        values = values.to(dtype or torch.float32)
    return masked_mean(values, valid)


def clamped_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp(clamp(log_ratio, -20, 20))``."""
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def weigh_tokens(loss_mat: torch.Tensor, is_weights: torch.Tensor | None, valid: torch.Tensor) -> torch.Tensor:
    """``loss_mat * sg[is_weights]`` on valid tokens (0 at padding); ``loss_mat`` itself when ``is_weights`` is None.

    Shapes: loss_mat, is_weights, valid ``(b, r)``. The weights are detached: an importance weight changes
    the measure the loss is averaged under, not the objective (Yao et al. 2025)."""
    if is_weights is None:
        return loss_mat
    if is_weights.shape != valid.shape:
        raise ValueError(f"is_weights of shape {tuple(is_weights.shape)} must match response_mask of shape {tuple(valid.shape)}")
    return loss_mat * select_valid(is_weights.detach(), valid)
