"""The optimal token baseline (OTB): a per-token baseline weighted by each path's realised gradient energy.

Responses sharing a ``group_index`` answer the same prompt. With an outcome score the
return-to-go of every valid token of response ``i`` is its score ``s_i``; OTB replaces the
group's one baseline by one per position ``t``, weighting each response by how much
score-function "energy" its path has accumulated up to ``t``.
"""
from __future__ import annotations

import torch

from ..registry import register_op
from ._common import check_sequence_inputs, check_token_inputs, select_valid
from .group import Advantages, float_scores

__all__ = ["token_gradient_energy", "optimal_token_baseline_advantage"]


def token_gradient_energy(old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``||d log pi(y_t) / d logits_t||^2 = 1 - 2 pi(y_t) + sum_v pi(v)^2`` per token, 0 at padding.

    Shapes: old_log_probs, sum_pi_squared, valid ``(b, r)`` -> ``(b, r)``. The gradient of a
    token's log-prob with respect to its softmax logits is ``onehot(y_t) - pi``; its squared
    norm is the formula (the logit-gradient proxy of the OTB paper: no backward pass needed).
    """
    pi = old_log_probs.exp()
    return select_valid(1.0 - 2.0 * pi + sum_pi_squared, valid)


@register_op(
    "optimal_token_baseline_advantage",
    inputs=("scores: float32[B]", "group_index: int64[B]", "response_mask: float32[B, R]",
            "old_log_probs: float32[B, R]", "sum_pi_squared: float32[B, R]"),
    outputs=("advantages: float32[B, R]",),
)
def optimal_token_baseline_advantage(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    *,
    eps: float = 1e-8,
) -> Advantages:
    """OTB advantage: the score minus a per-position baseline weighted by cumulative gradient energy.

    Shapes: scores ``(b,)``, group_index ``(b,)``, response_mask, old_log_probs, sum_pi_squared
    ``(b, r)`` -> advantages ``(b, r)``.

        e_{i,j} = 1 - 2 pi(y_{i,j}) + sum_v pi_{i,j}(v)^2        (:func:`token_gradient_energy`)
        W_{i,t} = sum_{j <= t, j valid} e_{i,j}                   the path's realised energy up to t
        B_{g,t} = sum_{i in g, t valid in i} s_i W_{i,t} / (sum_{i in g, t valid in i} W_{i,t} + eps)
        A_{i,t} = s_i - B_{g(i),t}     on valid tokens; 0 at padding

    Under the paper's assumption that the score-function terms of different tokens are
    uncorrelated, ``W_{i,t}`` is the squared norm of the summed log-prob gradient of the
    prefix, and the baseline that minimises the variance of the gradient at position ``t``
    is the ``W``-weighted mean of the returns-to-go of the responses still running at ``t``
    (a response that has ended adds nothing there: padding is ignored). ``sum_pi_squared``
    is ``sum_v softmax(logits_t)_v^2`` from the same forward pass as ``old_log_probs``.
    A group of one has no baseline: its advantage is 0 (verl's implementation gives it
    ``s_i eps / (W + eps)``, i.e. about 0, as well). A position where every running
    response has ``W = 0`` gets baseline 0.
    Reference: Li et al. 2026, "Optimal Token Baseline" (arXiv 2602.07078), as described
    with the realised-energy statistic in verl's ``optimal_token_baseline`` estimator.
    """
    check_sequence_inputs(response_mask, scores=scores, group_index=group_index)
    check_token_inputs(response_mask, old_log_probs=old_log_probs, sum_pi_squared=sum_pi_squared)
    scores = float_scores(scores)
    valid = response_mask.to(torch.bool)
    energy = token_gradient_energy(select_valid(old_log_probs, valid).to(scores.dtype),
                                   select_valid(sum_pi_squared, valid).to(scores.dtype), valid)
    weight = select_valid(energy.cumsum(dim=-1), valid)                      # W_{i,t}, 0 at padding
    _, inverse = torch.unique(group_index, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    shape = (n_groups, response_mask.shape[-1])
    numerator = torch.zeros(shape, dtype=scores.dtype).index_add_(0, inverse, scores.unsqueeze(-1) * weight)
    denominator = torch.zeros(shape, dtype=scores.dtype).index_add_(0, inverse, weight)
    size = torch.zeros(n_groups, dtype=scores.dtype).index_add_(0, inverse, torch.ones_like(scores))[inverse]
    baseline = (numerator / (denominator + eps))[inverse]
    advantage = torch.where((size > 1).unsqueeze(-1), scores.unsqueeze(-1) - baseline, torch.zeros_like(baseline))
    return Advantages(select_valid(advantage, valid))
