"""Outcome advantages relative to the other responses to the same prompt.

Responses sharing a ``group_index`` answer the same prompt. Group indices are
arbitrary int64 labels (they need not be contiguous or sorted). Each estimator
turns the per-response ``scores`` into a per-response advantage and puts it on
every valid token of the response (0 at padding).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..masked import masked_whiten
from ..registry import register_op
from ._common import broadcast_to_tokens, check_sequence_inputs

__all__ = ["GroupStats", "group_stats", "grpo_advantage", "rloo_advantage", "reinforce_pp_baseline_advantage", "Advantages"]

_SEQ_INPUTS = ("scores: float32[B]", "group_index: int64[B]", "response_mask: float32[B, R]")
_ADV_OUTPUT = ("advantages: float32[B, R]",)


class Advantages(NamedTuple):
    advantages: torch.Tensor


class GroupStats(NamedTuple):
    """Per-response statistics of its group, each ``(b,)``."""

    mean: torch.Tensor
    std: torch.Tensor
    size: torch.Tensor


def group_stats(scores: torch.Tensor, group_index: torch.Tensor) -> GroupStats:
    """Mean, unbiased std (0 for a group of one) and size of each response's group.

    Shapes: scores ``(b,)``, group_index ``(b,)`` -> three ``(b,)`` tensors.

    A group whose scores are all equal gets exactly that score as its mean (and std 0), so
    that ``score - mean`` is exactly 0 there: ``sum / size`` can be one ulp off (eight
    responses scoring 0.3 in float32 average to 0.30000001), and an advantage divided by
    ``std + eps`` would turn that ulp into about +-0.03.
    """
    _, inverse = torch.unique(group_index, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    size = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, inverse, torch.ones_like(scores))
    total = torch.zeros_like(size).index_add_(0, inverse, scores)
    low = torch.full_like(size, float("inf")).scatter_reduce_(0, inverse, scores, reduce="amin")
    high = torch.full_like(size, float("-inf")).scatter_reduce_(0, inverse, scores, reduce="amax")
    mean = torch.where(low == high, low, total / size)[inverse]
    sq = torch.zeros_like(size).index_add_(0, inverse, (scores - mean).square())
    var = sq / (size - 1).clamp(min=1.0)
    return GroupStats(mean=mean, std=var.sqrt()[inverse], size=size[inverse])


def float_scores(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` ``(b,)`` as a floating tensor (integer scores in the default float dtype)."""
    return scores if scores.is_floating_point() else scores.to(torch.get_default_dtype())


@register_op("grpo_advantage", inputs=_SEQ_INPUTS, outputs=_ADV_OUTPUT)
def grpo_advantage(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Advantages:
    """GRPO outcome advantage: the score relative to its group.

    Shapes: scores ``(b,)``, group_index ``(b,)``, response_mask ``(b, r)`` -> advantages ``(b, r)``.

        A_i = (s_i - mean_g(s)) / (std_g(s) + eps)   if norm_by_std   (Shao et al. 2024, DeepSeekMath, Sec. 4.1.2)
        A_i =  s_i - mean_g(s)                       otherwise        (Dr.GRPO, Liu et al. 2025, Sec. 3.1)

    ``std_g`` is the unbiased (Bessel-corrected) standard deviation of the group.
    A group of size 1 has no baseline to compare with and gets advantage 0.
    """
    check_sequence_inputs(response_mask, scores=scores, group_index=group_index)
    scores = float_scores(scores)
    stats = group_stats(scores, group_index)
    centred = scores - stats.mean
    if norm_by_std:
        centred = centred / (stats.std + eps)
    advantage = torch.where(stats.size > 1, centred, torch.zeros_like(centred))
    return Advantages(broadcast_to_tokens(advantage, response_mask))


@register_op("rloo_advantage", inputs=_SEQ_INPUTS, outputs=_ADV_OUTPUT)
def rloo_advantage(scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor) -> Advantages:
    """REINFORCE leave-one-out: the score minus the mean score of the *other* responses of the group.

    Shapes: scores ``(b,)``, group_index ``(b,)``, response_mask ``(b, r)`` -> advantages ``(b, r)``.

        A_i = s_i - (1 / (n - 1)) sum_{j != i} s_j = n / (n - 1) * (s_i - mean_g(s))

    with ``n`` the group size; a group of size 1 gets 0.
    Reference: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs", Sec. 3.2 (Kool et al. 2019).
    """
    check_sequence_inputs(response_mask, scores=scores, group_index=group_index)
    scores = float_scores(scores)
    stats = group_stats(scores, group_index)
    n = stats.size
    advantage = torch.where(n > 1, n / (n - 1).clamp(min=1.0) * (scores - stats.mean), torch.zeros_like(scores))
    return Advantages(broadcast_to_tokens(advantage, response_mask))


@register_op("reinforce_pp_baseline_advantage", inputs=_SEQ_INPUTS, outputs=_ADV_OUTPUT)
def reinforce_pp_baseline_advantage(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    eps: float = 1e-8,
) -> Advantages:
    """REINFORCE++-baseline: subtract the group mean score, then whiten over the batch's valid tokens.

    Shapes: scores ``(b,)``, group_index ``(b,)``, response_mask ``(b, r)`` -> advantages ``(b, r)``.

        a_i   = s_i - mean_g(s)                      on every valid token of response i
        A_i,t = (a_i,t - mean(a)) / sqrt(var(a) + eps)   mean, var over all valid tokens of the batch

    A group of size 1 has ``a_i = 0``.
    Reference: Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning
    Large Language Models" (arXiv 2501.03262), the "baseline" variant.
    """
    check_sequence_inputs(response_mask, scores=scores, group_index=group_index)
    scores = float_scores(scores)
    centred = scores - group_stats(scores, group_index).mean
    return Advantages(masked_whiten(broadcast_to_tokens(centred, response_mask), response_mask, eps=eps).whitened)
