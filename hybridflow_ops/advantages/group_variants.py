"""More group-relative outcome advantages: GPG, OPO (optimal baseline) and pass@k.

As in :mod:`~hybridflow_ops.advantages.group`, responses sharing a ``group_index`` answer
the same prompt, each per-response advantage is put on every valid token of its response
(0 at padding), and a group of one response has no baseline: its advantage is 0.
"""
from __future__ import annotations

import torch

from ..registry import register_op
from ._common import broadcast_to_tokens, check_sequence_inputs
from .group import Advantages, float_scores, group_stats

__all__ = ["gpg_advantage", "opo_advantage", "passk_advantage"]

_SEQ_INPUTS = ("scores: float32[B]", "group_index: int64[B]", "response_mask: float32[B, R]")
_ADV_OUTPUT = ("advantages: float32[B, R]",)


def _group_sum(values: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Each entry's group total, ``(b,)``."""
    _, inverse = torch.unique(group_index, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, inverse, values)[inverse]


@register_op("gpg_advantage", inputs=_SEQ_INPUTS, outputs=_ADV_OUTPUT)
def gpg_advantage(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    norm_by_std: bool = False,
    eps: float = 1e-6,
) -> Advantages:
    """GPG advantage: the group-centred score, scaled up by the share of responses that carry a signal.

    Shapes: scores ``(b,)``, group_index ``(b,)``, response_mask ``(b, r)`` -> advantages ``(b, r)``.

        A_i   = alpha (s_i - mean_g(s)) / F
        alpha = B / (B - M)      B responses in the batch, M of them in groups whose scores are all equal
        F     = 1                (the paper's default), or std_g(s) + eps with norm_by_std

    A group whose responses all score the same (or a group of one) has zero advantage, so
    a batch with M such responses has an effective size ``B - M``; ``alpha`` rescales the
    others so that the gradient is that of the ``B - M`` informative responses averaged
    over themselves (the paper's "accurate gradient estimation"). ``alpha = 1`` when every
    response is uninformative. verl counts ``M`` as the responses with a zero *score*
    instead; here it is those with a zero *advantage*, as the paper defines it.
    Reference: Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline
    for Model Reasoning", arXiv 2504.02546.
    """
    check_sequence_inputs(response_mask, scores=scores, group_index=group_index)
    scores = float_scores(scores)
    stats = group_stats(scores, group_index)
    informative = (stats.size > 1) & (stats.std > 0)
    n_informative = informative.sum().to(scores.dtype)
    alpha = scores.numel() / n_informative if bool(n_informative > 0) else torch.ones((), dtype=scores.dtype)
    centred = scores - stats.mean
    if norm_by_std:
        centred = centred / (stats.std + eps)
    advantage = torch.where(informative, alpha * centred, torch.zeros_like(centred))
    return Advantages(broadcast_to_tokens(advantage, response_mask))


@register_op("opo_advantage", inputs=_SEQ_INPUTS, outputs=_ADV_OUTPUT)
def opo_advantage(scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor) -> Advantages:
    """OPO advantage: the score minus the length-weighted mean score of its group (the optimal baseline).

    Shapes: scores ``(b,)``, group_index ``(b,)``, response_mask ``(b, r)`` -> advantages ``(b, r)``.

        b_g = sum_{j in g} |o_j| s_j / sum_{j in g} |o_j|          |o_j| = valid tokens of response j
        A_i = s_i - b_g

    Under the paper's assumption that per-token score gradients are orthogonal and of
    equal norm, the variance-minimising baseline weights each response by its length
    (the squared norm of its summed score gradient). A group of one gets 0 (verl gives it
    ``s_i``, with a baseline of 0); a group whose responses are all empty gets 0.
    Reference: Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv 2505.23585.
    """
    check_sequence_inputs(response_mask, scores=scores, group_index=group_index)
    scores = float_scores(scores)
    lengths = response_mask.to(torch.bool).sum(dim=-1).to(scores.dtype)
    weight_total = _group_sum(lengths, group_index)
    baseline = _group_sum(lengths * scores, group_index) / weight_total.clamp(min=1.0)
    size = group_stats(scores, group_index).size
    advantage = torch.where((size > 1) & (weight_total > 0), scores - baseline, torch.zeros_like(scores))
    return Advantages(broadcast_to_tokens(advantage, response_mask))


def _log_choose(n: torch.Tensor, k: int) -> torch.Tensor:
    return torch.lgamma(n + 1) - torch.lgamma(torch.full_like(n, k + 1.0)) - torch.lgamma(n - k + 1)


def _choose_ratio(n_top: torch.Tensor, n_bottom: torch.Tensor, k: int) -> torch.Tensor:
    """``C(n_top, k) / C(n_bottom, k)`` with ``C(n, k) = 0`` for ``n < k`` (``n_bottom >= k`` assumed)."""
    if k == 0:
        return torch.ones_like(n_top)
    ratio = torch.exp(_log_choose(n_top.clamp(min=float(k)), k) - _log_choose(n_bottom, k))
    return torch.where(n_top >= k, ratio, torch.zeros_like(ratio))


@register_op("passk_advantage", inputs=_SEQ_INPUTS, outputs=_ADV_OUTPUT)
def passk_advantage(scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor, *, k: int = 4) -> Advantages:
    """Pass@k advantage for binary rewards: each response's share in the pass@k of the k-subsets containing it.

    Shapes: scores ``(b,)`` in {0, 1}, group_index ``(b,)``, response_mask ``(b, r)`` -> advantages ``(b, r)``.

    With ``N`` responses in the group, ``N_neg`` of them failing:

        R     = 1 - C(N_neg, k) / C(N, k)                        mean pass@k over the k-subsets of the group
        sigma = sqrt(R (1 - R))
        A_pos = (1 - R) / sigma
        A_neg = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / sigma

    i.e. ``A_i = (E[max_{j in S} s_j | i in S] - R) / sigma`` over uniformly drawn k-subsets
    ``S``: a correct response makes every subset it is in pass; a failing one only shares
    the subsets that pass without it. ``k = 1`` is GRPO with the *biased* group std.
    ``sigma = 0`` (every subset passes, or none) gives 0; a group of one gives 0; a group
    of ``1 < N < k`` responses raises. Reference: Chen et al. 2025, "Pass@k Training for
    Adaptively Balancing Exploration and Exploitation of Large Reasoning Models", arXiv 2508.10751.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    check_sequence_inputs(response_mask, scores=scores, group_index=group_index)
    scores = float_scores(scores)
    if not bool(((scores == 0) | (scores == 1)).all()):
        raise ValueError("passk_advantage needs binary scores (0 or 1); use a pass/fail reward")
    n = group_stats(scores, group_index).size
    if bool(((n > 1) & (n < k)).any()):
        raise ValueError(f"pass@{k} needs at least k = {k} responses per group; the smallest group has {int(n[n > 1].min())}")
    n_neg = _group_sum(1.0 - scores, group_index)
    mean_pass = 1.0 - _choose_ratio(n_neg, n, k)
    sigma = (mean_pass * (1.0 - mean_pass)).clamp(min=0.0).sqrt()
    fail_shared = _choose_ratio(n_neg - 1, n - 1, k - 1)
    raw = torch.where(scores > 0, 1.0 - mean_pass, 1.0 - mean_pass - fail_shared)
    advantage = torch.where((n > 1) & (sigma > 0), raw / sigma.clamp(min=torch.finfo(sigma.dtype).tiny), torch.zeros_like(raw))
    return Advantages(broadcast_to_tokens(advantage, response_mask))
