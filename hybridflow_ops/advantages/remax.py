"""ReMax: the score minus the score of the greedy response to the same prompt."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import broadcast_to_tokens, check_sequence_inputs

__all__ = ["ReMaxResult", "remax_advantage"]


class ReMaxResult(NamedTuple):
    advantages: torch.Tensor
    returns: torch.Tensor


@register_op(
    "remax_advantage",
    inputs=("scores: float32[B]", "baseline_scores: float32[B]", "response_mask: float32[B, R]"),
    outputs=("advantages: float32[B, R]", "returns: float32[B, R]"),
)
def remax_advantage(scores: torch.Tensor, baseline_scores: torch.Tensor, response_mask: torch.Tensor) -> ReMaxResult:
    """ReMax advantage: ``A_i = s_i - b_i`` on every valid token, with ``b_i`` the greedy response's score.

    Shapes: scores ``(b,)``, baseline_scores ``(b,)``, response_mask ``(b, r)``
    -> advantages ``(b, r)``, returns ``(b, r)`` (equal to the advantages); 0 at padding.
    Reference: Li et al. 2023, "ReMax: A Simple, Effective, and Efficient
    Reinforcement Learning Method for Aligning Large Language Models", Algorithm 1.
    """
    check_sequence_inputs(response_mask, scores=scores, baseline_scores=baseline_scores)
    advantages = broadcast_to_tokens(scores - baseline_scores, response_mask)
    return ReMaxResult(advantages, advantages.clone())
