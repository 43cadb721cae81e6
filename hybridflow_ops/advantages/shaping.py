"""Outcome-score shaping and filtering used by DAPO: the overlong penalty and the uniform-group filter."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import check_sequence_inputs
from .group import float_scores, group_stats

__all__ = ["ShapedScores", "GroupFilter", "overlong_penalty", "uniform_group_filter"]


class ShapedScores(NamedTuple):
    scores: torch.Tensor


class GroupFilter(NamedTuple):
    keep: torch.Tensor


@register_op("overlong_penalty", inputs=("scores: float32[B]", "response_mask: float32[B, R]"),
             outputs=("scores: float32[B]",))
def overlong_penalty(
    scores: torch.Tensor, response_mask: torch.Tensor, *, max_length: int | None = None, cache_length: int = 1,
    penalty: float = 1.0,
) -> ShapedScores:
    """DAPO's soft overlong punishment: scores minus a penalty that grows over the last ``cache_length`` tokens.

    Shapes: scores ``(b,)``, response_mask ``(b, r)`` -> scores ``(b,)``.

        L     = valid tokens of the response,  L_max = max_length (None: r, the response dim)
        R_len = 0                                  L <= L_max - cache_length
              = (L_max - cache_length - L) / cache_length     L_max - cache_length < L <= L_max
              = -1                                 L > L_max
        scores' = scores + penalty * R_len

    The penalty ramps linearly from 0 to ``-penalty`` across the "cache" of the last
    ``cache_length`` positions, so a response that fills the budget (often one cut off before
    its end) is discouraged without the hard cliff of a fixed punishment. Reference: Yu et al. 2025, "DAPO: An Open-Source
    LLM Reinforcement Learning System at Scale", arXiv 2503.14476, eq. 13 (overlong reward shaping).
    """
    check_sequence_inputs(response_mask, scores=scores)
    limit = response_mask.shape[-1] if max_length is None else max_length
    if limit < 1 or not 1 <= cache_length <= limit:
        raise ValueError(f"need max_length >= 1 and 1 <= cache_length <= max_length, got {limit}, {cache_length}")
    scores = float_scores(scores)
    length = response_mask.to(torch.bool).sum(dim=-1).to(scores.dtype)
    ramp = ((limit - cache_length) - length) / cache_length
    shaped = torch.where(length > limit, -torch.ones_like(ramp), torch.clamp(ramp, max=0.0))
    return ShapedScores(scores + penalty * shaped)


@register_op("uniform_group_filter", inputs=("scores: float32[B]", "group_index: int64[B]", "response_mask: float32[B, R]"),
             outputs=("keep: bool[B]",))
def uniform_group_filter(scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor) -> GroupFilter:
    """Which responses belong to a group whose scores are not all equal (DAPO's dynamic-sampling filter).

    Shapes: scores ``(b,)``, group_index ``(b,)``, response_mask ``(b, r)`` -> keep ``(b,)`` bool.

        keep_i = std_{g(i)}(s) > 0

    A group whose responses all score the same (all correct, all wrong) has zero
    group-relative advantage everywhere and so no policy gradient; dropping it keeps the
    batch full of informative groups. A group of one is always dropped. Whole groups are
    kept or dropped, never part of one. ``response_mask`` only fixes the batch dim.
    Reference: Yu et al. 2025, "DAPO", arXiv 2503.14476, sec. 3.2 (dynamic sampling, eq. 11's
    constraint ``0 < |{o_i correct}| < G``).
    """
    check_sequence_inputs(response_mask, scores=scores, group_index=group_index)
    stats = group_stats(float_scores(scores), group_index)
    return GroupFilter((stats.size > 1) & (stats.std > 0))
