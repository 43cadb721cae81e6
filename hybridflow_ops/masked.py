"""Masked reductions over ``(b, t)`` tensors.

A mask holds 1 (or ``True``) at valid positions and 0 at padding. Masks of any
numeric or bool dtype are accepted; values at masked-out positions never affect
a result, even when they are ``inf`` or ``nan``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .registry import register_op

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten", "Whitened"]


def _select(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Values with padding replaced by 0 (so nan/inf there cannot leak), and the float mask."""
    if values.shape != mask.shape:
        raise ValueError(f"values of shape {tuple(values.shape)} and mask of shape {tuple(mask.shape)} must match")
    valid = mask.to(torch.bool)
    return torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device)), valid.to(values.dtype)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(values * mask)`` over ``dim`` (all dims when None).

    Shapes: values ``(b, t)``, mask ``(b, t)`` -> scalar, or ``(b,)`` / ``(t,)`` with ``dim``.
    """
    selected, _ = _select(values, mask)
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(values * mask) / sum(mask)``; a row with no valid entry gives 0, not nan.

    Shapes: values ``(b, t)``, mask ``(b, t)`` -> scalar, or reduced along ``dim``.
    """
    selected, weights = _select(values, mask)
    total = selected.sum() if dim is None else selected.sum(dim=dim)
    count = weights.sum() if dim is None else weights.sum(dim=dim)
    return total / count.clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid entries: ``sum(mask * (x - mean)^2) / (n - 1)`` (or ``/ n`` when biased).

    Shapes: values ``(b, t)``, mask ``(b, t)`` -> scalar. With ``unbiased`` and a
    single valid entry the Bessel correction is undefined; a ``ValueError`` says so.
    """
    selected, weights = _select(values, mask)
    count = weights.sum()
    mean = selected.sum() / count.clamp(min=1.0)
    sq = torch.where(weights.bool(), (selected - mean) ** 2, torch.zeros_like(selected)).sum()
    if unbiased:
        if count.item() < 2:
            raise ValueError(f"unbiased variance needs at least 2 valid entries, the mask has {int(count.item())}")
        return sq / (count - 1)
    return sq / count.clamp(min=1.0)


class Whitened(NamedTuple):
    whitened: torch.Tensor


@register_op(
    "whiten",
    inputs=("advantages: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("advantages: float32[B, R]",),
)
def masked_whiten(values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Whitened:
    """Whiten the valid entries: ``(x - mean) / sqrt(var + eps)`` (mean added back when ``shift_mean`` is False).

    Shapes: values ``(b, t)``, mask ``(b, t)`` -> whitened ``(b, t)``, 0 at padding.
    Mean and the unbiased variance are taken over valid entries only (as in PPO's
    advantage normalisation, Schulman et al. 2017; OpenAI baselines ``ppo2``).
    """
    selected, weights = _select(values, mask)
    count = weights.sum()
    mean = selected.sum() / count.clamp(min=1.0)
    sq = torch.where(weights.bool(), (selected - mean) ** 2, torch.zeros_like(selected)).sum()
    var = sq / (count - 1).clamp(min=1.0)
    out = (selected - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return Whitened(out * weights)
