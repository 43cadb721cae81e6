"""Score-function losses ``-w A log pi``: plain REINFORCE, GPG, CISPO, and DRO (with a quadratic penalty).

The three differ only in the detached weight ``w`` in front of ``A log pi`` and in
their default aggregation: REINFORCE and GPG have no weight (on-policy, no ratio),
CISPO weights each token by its clipped, detached importance ratio. Each takes optional
detached ``is_weights`` (the ``*_is`` ops) multiplying its per-token loss. Their loss
*value* is ``-A log pi`` (the papers' objectives, negated); only its gradient
``-w A grad log pi`` matters for training.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import check_loss_inputs, clamped_exp, select_valid, token_metric, weigh_tokens
from .aggregate import aggregate_loss

__all__ = ["PGLoss", "CISPOLoss", "DROLoss", "reinforce", "gpg", "cispo", "dro"]

_LOG_PROBS = ("log_probs: float32[B, R]",)
_PG_INPUTS = ("advantages: float32[B, R]", "response_mask: float32[B, R]")
_LOSS = ("loss: float32",)


class PGLoss(NamedTuple):
    loss: torch.Tensor


class CISPOLoss(NamedTuple):
    loss: torch.Tensor
    pg_clipfrac: torch.Tensor
    ppo_kl: torch.Tensor


def _score_function_loss(log_probs, advantages, response_mask, is_weights, agg) -> PGLoss:
    valid = check_loss_inputs(response_mask, log_probs=log_probs, advantages=advantages)
    loss_mat = weigh_tokens(-select_valid(advantages, valid) * select_valid(log_probs, valid), is_weights, valid)
    return PGLoss(aggregate_loss(loss_mat, response_mask, **agg))


@register_op("reinforce", model_inputs=_LOG_PROBS, inputs=_PG_INPUTS, outputs=_LOSS, kind="loss", vanishes_with="advantages")
def reinforce(
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    loss_agg_mode: str = "seq-mean-token-sum",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> PGLoss:
    """Plain REINFORCE: the score-function estimator, with no importance ratio and no clipping.

    Shapes: log_probs (with grad), advantages, response_mask ``(b, r)`` -> loss, a scalar.

        l_t  = -A_t log pi(y_t)                                  (Williams 1992)
        loss = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)
        grad = -sum_t A_t grad log pi(y_t) / count

    The default ``seq-mean-token-sum`` is the per-sequence sum over time of the estimator,
    averaged over sequences: with ``A`` the return of the response, its gradient is an
    unbiased estimate of the gradient of the expected return. Valid on-policy only
    (one update per batch): there is no ratio to correct for a policy that has moved.
    ``is_weights`` (op ``reinforce_is``): ``l_t = -sg[w_t] A_t log pi(y_t)``, the importance-weighted
    score function of off-policy REINFORCE (verl's ``compute_policy_loss_reinforce`` with ``rollout_is_weights``).
    Reference: Williams 1992, "Simple statistical gradient-following algorithms for
    connectionist reinforcement learning", Machine Learning 8.
    """
    agg = dict(mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length)
    return _score_function_loss(log_probs, advantages, response_mask, is_weights, agg)


@register_op("gpg", model_inputs=_LOG_PROBS, inputs=_PG_INPUTS, outputs=_LOSS, kind="loss", vanishes_with="advantages")
def gpg(
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> PGLoss:
    """Group Policy Gradient loss: REINFORCE averaged over all the batch's tokens.

    Shapes: log_probs (with grad), advantages, response_mask ``(b, r)`` -> loss, a scalar.

        loss = -(1 / sum_i |o_i|) sum_i sum_t A_i,t log pi(o_i,t)        (GPG)

    i.e. :func:`reinforce` with ``token-mean``: no ratio, no clip, no KL term.
    ``is_weights`` (op ``gpg_is``): each token's term is multiplied by ``sg[w_t]`` (verl's ``gpg`` loss). The
    advantage is GPG's group-centred, rescaled score (:func:`~hybridflow_ops.gpg_advantage`).
    Reference: Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline
    for Model Reasoning", arXiv 2504.02546.
    """
    agg = dict(mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length)
    return _score_function_loss(log_probs, advantages, response_mask, is_weights, agg)


@register_op(
    "cispo", model_inputs=_LOG_PROBS, inputs=("old_log_probs: float32[B, R]",) + _PG_INPUTS, outputs=_LOSS, kind="loss",
    vanishes_with="advantages", ratio_input="old_log_probs",
)
def cispo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> CISPOLoss:
    """CISPO: REINFORCE weighted by the clipped, detached importance ratio; no token loses its gradient.

    Shapes: log_probs (with grad), old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        r_t  = exp(log_probs_t - old_log_probs_t)
        w_t  = sg[ clip(r_t, 1 - clip_low, 1 + clip_high) ]
        l_t  = -w_t A_t log pi(y_t)                                    (CISPO)
        loss = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    Unlike PPO's clip, which zeroes the gradient of a token whose ratio left the trust
    region, CISPO clips only the weight, so every token keeps a gradient. The default
    ``clip_low = 1`` sets no lower bound (the paper imposes none); ``clip_high`` is the
    only active bound. Metrics: ``pg_clipfrac`` (fraction of valid tokens whose ratio was
    clipped), ``ppo_kl`` (mean of ``old_log_probs - log_probs``).
    ``is_weights`` (op ``cispo_is``): ``l_t`` is multiplied by ``sg[is_weights_t]`` (verl's ``cispo`` loss).
    Reference: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with
    Lightning Attention", arXiv 2506.13585 (CISPO).
    """
    if not 0.0 <= clip_low <= 1.0 or clip_high < 0.0:
        raise ValueError(f"CISPO needs 0 <= clip_low <= 1 (1: no lower bound) and clip_high >= 0, got {clip_low}, {clip_high}")
    valid = check_loss_inputs(response_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    new = select_valid(log_probs, valid)
    log_ratio = new - select_valid(old_log_probs, valid)
    ratio = clamped_exp(log_ratio.detach())
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = weigh_tokens(-weight * select_valid(advantages, valid) * new, is_weights, valid)
    agg = dict(mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length)
    return CISPOLoss(
        loss=aggregate_loss(loss_mat, response_mask, **agg),
        pg_clipfrac=token_metric(weight != ratio, valid, loss_mat.dtype),
        ppo_kl=token_metric(-log_ratio, valid),
    )


class DROLoss(NamedTuple):
    loss: torch.Tensor
    ppo_kl: torch.Tensor


@register_op(
    "dro", model_inputs=_LOG_PROBS, inputs=("old_log_probs: float32[B, R]",) + _PG_INPUTS, outputs=_LOSS, kind="loss",
)
def dro(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> DROLoss:
    """DRO: REINFORCE with a quadratic penalty on the log-ratio to the sampling policy.

    Shapes: log_probs (with grad), old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        l_t  = -A_t log pi(y_t) + beta / 2 (log pi(y_t) - log pi_old(y_t))^2          (DRO)
        grad = -(A_t - beta log(pi / pi_old)) grad log pi(y_t)
        loss = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    This is the per-token form of Direct Reward Optimization (Richemond et al. 2024), whose
    single-trajectory loss is ``1/2 (r - V - tau log(pi / pi_ref))^2``: its gradient is
    ``-tau (r - V - tau log(pi / pi_ref)) grad log pi``. With the advantage ``A`` in place of
    ``r - V``, the sampling policy ``pi_old`` as the regulariser and the gradient divided by
    ``tau = beta``'s scale, it is the gradient above: the update follows ``A`` and is pulled
    back in proportion to how far the token's log-prob has moved, instead of being cut off
    by a clip. This is the ``dro`` policy loss of verl's registry (the same formula).
    On-policy (``pi = pi_old``) the penalty and its gradient vanish and DRO is REINFORCE.
    The penalty does not vanish with the advantage once the policy has moved, so this loss
    declares no ``vanishes_with``. The log-ratio is not clamped (it enters squared, not exponentiated).
    Metric: ``ppo_kl`` (mean of ``old_log_probs - log_probs``).
    ``is_weights`` (op ``dro_is``): the whole per-token loss, penalty included, is multiplied by
    ``sg[w_t]``: the expectation over ``mu``'s samples of both terms is re-weighted to ``pi_old``'s.
    Reference: Richemond et al. 2024, "Offline Regularised Reinforcement Learning for Large
    Language Models Alignment", arXiv 2405.19107 (DRO).
    """
    if beta < 0.0:
        raise ValueError(f"DRO's beta must be >= 0, got {beta}")
    valid = check_loss_inputs(response_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    new = select_valid(log_probs, valid)
    log_ratio = new - select_valid(old_log_probs, valid)
    loss_mat = weigh_tokens(-select_valid(advantages, valid) * new + 0.5 * beta * log_ratio.square(), is_weights, valid)
    agg = dict(mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length)
    return DROLoss(loss=aggregate_loss(loss_mat, response_mask, **agg), ppo_kl=token_metric(-log_ratio, valid))
