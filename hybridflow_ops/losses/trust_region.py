"""Policy losses that replace PPO's hard ratio clip: SAPO's soft gate, DPPO's divergence masks.

Both take the usual ``(log_probs, old_log_probs, advantages, response_mask)`` and vanish
with the advantage: every per-token term is a multiple of ``A_t``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import check_loss_inputs, clamped_exp, select_valid, token_metric, weigh_tokens
from .aggregate import aggregate_loss

__all__ = ["SAPOLoss", "DPPOLoss", "sapo", "dppo_tv", "dppo_kl", "binary_kl"]

_LOG_PROBS = ("log_probs: float32[B, R]",)
_INPUTS = ("old_log_probs: float32[B, R]", "advantages: float32[B, R]", "response_mask: float32[B, R]")
_LOSS = ("loss: float32",)
# 1 - p is clamped away from 0 so that log(1 - p) stays finite for a token of probability 1.
_ONE_MINUS_P_MIN = 1e-6


class SAPOLoss(NamedTuple):
    loss: torch.Tensor
    ppo_kl: torch.Tensor


class DPPOLoss(NamedTuple):
    loss: torch.Tensor
    pg_maskfrac: torch.Tensor
    ppo_kl: torch.Tensor


def _agg(loss_agg_mode, global_tokens, global_seqs, norm_length):
    return dict(mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length)


@register_op("sapo", model_inputs=_LOG_PROBS, inputs=_INPUTS, outputs=_LOSS, kind="loss", vanishes_with="advantages",
             ratio_input="old_log_probs")
def sapo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_agg_mode: str = "seq-mean-token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> SAPOLoss:
    """Soft Adaptive Policy Optimization: a sigmoid gate on the ratio instead of a hard clip.

    Shapes: log_probs (with grad), old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        r_t    = exp(log_probs_t - old_log_probs_t)
        tau_t  = tau_pos if A_t > 0 else tau_neg
        f(r)   = (4 / tau) * sigmoid(tau (r - 1))
        l_t    = -f(r_t) A_t                                       (SAPO)
        loss   = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    ``f'(1) = 1``: on-policy the gradient is exactly the unclipped surrogate's,
    ``-A_t grad r_t``; away from ``r = 1`` it decays smoothly as
    ``sech^2(tau (r - 1) / 2)`` rather than dropping to 0 at a clip boundary. A larger
    ``tau_neg`` damps negative-advantage tokens faster (the paper argues they destabilise
    training more); 1.0 / 1.05 are this library's defaults. The default aggregation is the
    paper's per-sequence token mean. Metric: ``ppo_kl``.
    ``is_weights`` (op ``sapo_is``): ``l_t`` is multiplied by ``sg[w_t]`` (verl's ``sapo`` loss).
    Reference: Qwen team 2025, "Soft Adaptive Policy Optimization", arXiv 2511.20347.
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be positive, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    valid = check_loss_inputs(response_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    log_ratio = select_valid(log_probs, valid) - select_valid(old_log_probs, valid)
    adv = select_valid(advantages, valid)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (clamped_exp(log_ratio) - 1.0)) * (4.0 / tau)
    loss_mat = weigh_tokens(-gate * adv, is_weights, valid)
    return SAPOLoss(
        loss=aggregate_loss(loss_mat, response_mask, **_agg(loss_agg_mode, global_tokens, global_seqs, norm_length)),
        ppo_kl=token_metric(-log_ratio, valid),
    )


def binary_kl(old_log_probs: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """``KL(Bernoulli(mu) || Bernoulli(p))`` with ``mu = exp(old_log_probs)``, ``p = exp(log_probs)``, elementwise.

        D = mu (log mu - log p) + (1 - mu) (log(1 - mu) - log(1 - p))

    ``1 - mu`` and ``1 - p`` are clamped to at least 1e-6.
    """
    mu, p = old_log_probs.exp(), log_probs.exp()
    one_minus_mu, one_minus_p = (1.0 - mu).clamp(min=_ONE_MINUS_P_MIN), (1.0 - p).clamp(min=_ONE_MINUS_P_MIN)
    return mu * (old_log_probs - log_probs) + one_minus_mu * (one_minus_mu.log() - one_minus_p.log())


def _dppo(log_probs, old_log_probs, advantages, response_mask, is_weights, outside, agg) -> DPPOLoss:
    """``-sg[M_t] r_t A_t`` with ``M_t = 0`` where ``outside(new, old, adv)`` says the token left the trust region."""
    valid = check_loss_inputs(response_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    new, old = select_valid(log_probs, valid), select_valid(old_log_probs, valid)
    adv = select_valid(advantages, valid)
    log_ratio = new - old
    masked = outside(new.detach(), old.detach(), adv) & valid
    loss_mat = weigh_tokens(torch.where(masked, torch.zeros_like(log_ratio), -adv * clamped_exp(log_ratio)), is_weights, valid)
    return DPPOLoss(
        loss=aggregate_loss(loss_mat, response_mask, **agg),
        pg_maskfrac=token_metric(masked, valid, loss_mat.dtype),
        ppo_kl=token_metric(-log_ratio, valid),
    )


@register_op("dppo_tv", model_inputs=_LOG_PROBS, inputs=_INPUTS, outputs=_LOSS, kind="loss", vanishes_with="advantages",
             ratio_input="old_log_probs")
def dppo_tv(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    delta_low: float = 0.15,
    delta_high: float = 0.15,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> DPPOLoss:
    """DPPO-Binary-TV: the unclipped surrogate, masked where the token's probability moved too far.

    Shapes: log_probs (with grad), old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        p_t, mu_t = exp(log_probs_t), exp(old_log_probs_t)
        M_t  = 0  if A_t > 0 and p_t - mu_t >  delta_high
                  or A_t < 0 and p_t - mu_t < -delta_low;   1 otherwise
        l_t  = -sg[M_t] r_t A_t
        loss = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    The trust region is on the *probability* of the sampled token (its binary total
    variation ``|p - mu|``), not on the ratio: a rare token may triple its probability
    while a likely one is held to a small absolute change. As with PPO's clip, only a
    move in the direction the advantage pushes is stopped. The 0.15 thresholds are this
    library's defaults. Metrics: ``pg_maskfrac`` (fraction of valid tokens masked), ``ppo_kl``.
    ``is_weights`` (op ``dppo_tv_is``): ``l_t`` is multiplied by ``sg[w_t]``.
    Reference: "Rethinking the Trust Region in LLM Reinforcement Learning" (2026), arXiv 2602.04879.
    """
    if delta_low < 0 or delta_high < 0:
        raise ValueError(f"DPPO thresholds must be >= 0, got delta_low={delta_low}, delta_high={delta_high}")

    def outside(new, old, adv):
        shift = new.exp() - old.exp()
        return ((adv > 0) & (shift > delta_high)) | ((adv < 0) & (shift < -delta_low))

    return _dppo(log_probs, old_log_probs, advantages, response_mask, is_weights, outside, _agg(loss_agg_mode, global_tokens, global_seqs, norm_length))


@register_op("dppo_kl", model_inputs=_LOG_PROBS, inputs=_INPUTS, outputs=_LOSS, kind="loss", vanishes_with="advantages",
             ratio_input="old_log_probs")
def dppo_kl(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    delta_low: float = 0.05,
    delta_high: float = 0.05,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> DPPOLoss:
    """DPPO-Binary-KL: as :func:`dppo_tv`, with the binary KL of the sampled token as the divergence.

    Shapes: log_probs (with grad), old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        D_t  = KL(Bernoulli(mu_t) || Bernoulli(p_t))        (see :func:`binary_kl`)
        M_t  = 0  if A_t > 0 and p_t > mu_t and D_t > delta_high
                  or A_t < 0 and p_t < mu_t and D_t > delta_low;   1 otherwise
        l_t  = -sg[M_t] r_t A_t
        loss = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    The 0.05 thresholds are this library's defaults. Metrics: ``pg_maskfrac``, ``ppo_kl``.
    ``is_weights`` (op ``dppo_kl_is``): ``l_t`` is multiplied by ``sg[w_t]``.
    Reference: "Rethinking the Trust Region in LLM Reinforcement Learning" (2026), arXiv 2602.04879.
    """
    if delta_low < 0 or delta_high < 0:
        raise ValueError(f"DPPO thresholds must be >= 0, got delta_low={delta_low}, delta_high={delta_high}")

    def outside(new, old, adv):
        divergence = binary_kl(old, new)
        up, down = new > old, new < old
        return ((adv > 0) & up & (divergence > delta_high)) | ((adv < 0) & down & (divergence > delta_low))

    return _dppo(log_probs, old_log_probs, advantages, response_mask, is_weights, outside, _agg(loss_agg_mode, global_tokens, global_seqs, norm_length))
