"""Policy-gradient losses: PPO clip (asymmetric, dual-clip) and GSPO, and the token-level truncated IS weight.

Every loss takes the log-probs of the policy being trained (``log_probs``,
with grad), the behaviour policy's (``old_log_probs``), the advantages and the
response mask, and optionally detached importance weights ``is_weights`` (registered
as the ``*_is`` ops of :mod:`.is_weighted`); hyper-parameters are keyword-only; the per-token loss is
reduced by :func:`~hybridflow_ops.losses.aggregate.aggregate_loss`
(``loss_agg_mode``, global counts). Metrics are detached means over this
batch's valid tokens.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import check_loss_inputs, clamped_exp, select_valid, token_metric, weigh_tokens
from .aggregate import aggregate_loss

__all__ = ["PolicyLoss", "GSPOLoss", "ISWeights", "ppo_clip", "gspo", "truncated_is_weight"]

_POLICY_INPUTS = ("old_log_probs: float32[B, R]", "advantages: float32[B, R]", "response_mask: float32[B, R]")
_LOG_PROBS = ("log_probs: float32[B, R]",)
_LOSS = ("loss: float32",)


class PolicyLoss(NamedTuple):
    loss: torch.Tensor
    pg_clipfrac: torch.Tensor
    pg_clipfrac_lower: torch.Tensor
    ppo_kl: torch.Tensor


class GSPOLoss(NamedTuple):
    loss: torch.Tensor
    pg_clipfrac: torch.Tensor
    ppo_kl: torch.Tensor


class ISWeights(NamedTuple):
    is_weights: torch.Tensor


def _check_clip(clip_low: float, clip_high: float, dual_clip: float | None = None) -> None:
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"clip range must satisfy 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0), or None to disable it; got {dual_clip}")


def _clipped_surrogate(ratio, advantages, clip_low, clip_high):
    """Per-token ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` and where the clipped term won."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _ppo_token_loss(log_probs, old_log_probs, advantages, valid, clip_low, clip_high, dual_clip):
    """Per-token PPO loss ``(b, r)``, the clip and dual-clip indicators, and the log-ratio."""
    log_ratio = select_valid(log_probs, valid) - select_valid(old_log_probs, valid)
    adv = select_valid(advantages, valid)
    loss, was_clipped = _clipped_surrogate(clamped_exp(log_ratio), adv, clip_low, clip_high)
    lower = torch.zeros_like(was_clipped)
    if dual_clip is not None:
        floor = -adv * dual_clip
        lower = (adv < 0) & (loss > floor)
        loss = torch.where(lower, floor, loss)
    return loss, was_clipped, lower, log_ratio


def _policy_loss(loss_mat, log_ratio, was_clipped, lower, valid, response_mask, agg) -> PolicyLoss:
    return PolicyLoss(
        loss=aggregate_loss(loss_mat, response_mask, **agg),
        pg_clipfrac=token_metric(was_clipped, valid, loss_mat.dtype),
        pg_clipfrac_lower=token_metric(lower, valid, loss_mat.dtype),
        ppo_kl=token_metric(-log_ratio, valid),
    )


@register_op("ppo_clip", model_inputs=_LOG_PROBS, inputs=_POLICY_INPUTS, outputs=_LOSS, kind="loss", vanishes_with="advantages",
             ratio_input="old_log_probs")
def ppo_clip(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> PolicyLoss:
    """PPO clipped surrogate loss with an asymmetric clip range and an optional dual clip.

    Shapes: log_probs, old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        r_t    = exp(log_probs_t - old_log_probs_t)
        l_t    = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))        (Schulman et al. 2017, eq. 7)
        l_t    = min(l_t, -c A_t)   where A_t < 0, if dual_clip = c               (Ye et al. 2020, eq. 5)
        loss   = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    ``clip_high > clip_low`` is DAPO's "clip-higher" (Yu et al. 2025, Sec. 3.1).
    Metrics: ``pg_clipfrac`` (fraction of valid tokens where the clipped term is
    taken), ``pg_clipfrac_lower`` (where the dual clip is taken), ``ppo_kl``
    (mean of ``old_log_probs - log_probs``, the k1 estimate of KL(old || new)).
    ``is_weights`` (op ``ppo_clip_is``): each token's loss is multiplied by the detached weight,
    ``loss = aggregate_loss(w_t * l_t, ...)`` (Yao et al. 2025; verl's ``rollout_is_weights``).
    """
    _check_clip(clip_low, clip_high, dual_clip)
    valid = check_loss_inputs(response_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    loss_mat, was_clipped, lower, log_ratio = _ppo_token_loss(log_probs, old_log_probs, advantages, valid, clip_low, clip_high, dual_clip)
    loss_mat = weigh_tokens(loss_mat, is_weights, valid)
    agg = dict(mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length)
    return _policy_loss(loss_mat, log_ratio, was_clipped, lower, valid, response_mask, agg)


@register_op("gspo", model_inputs=_LOG_PROBS, inputs=_POLICY_INPUTS, outputs=_LOSS, kind="loss", vanishes_with="advantages",
             ratio_input="old_log_probs")
def gspo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> GSPOLoss:
    """Group Sequence Policy Optimization: the PPO clip applied to a sequence-level ratio.

    Shapes: log_probs, old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        s_i     = exp( mean_{t valid} (log_probs_i,t - old_log_probs_i,t) )               (Zheng et al. 2025, eq. 7)
        s_i,t   = sg[s_i] * exp(log_probs_i,t - sg[log_probs_i,t])                        (GSPO-token, eq. 13)
        l_i,t   = max(-A_i,t s_i,t, -A_i,t clip(s_i,t, 1 - clip_low, 1 + clip_high))
        loss    = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    ``s_i,t`` equals ``s_i`` in value; its gradient is ``s_i * grad log_probs_i,t``,
    so with the default ``seq-mean-token-mean`` and a per-sequence advantage the
    gradient is GSPO's. Clip ranges are small (3e-4 / 4e-4 in the paper) because
    the ratio is a per-token geometric mean.
    ``is_weights`` (op ``gspo_is``): ``l_i,t`` is multiplied by the detached ``w_i,t``, as verl's
    ``gspo`` loss does with ``rollout_is_weights``; with a per-sequence weight (:func:`~hybridflow_ops.sequence_is_weight`)
    that is GSPO's sequence objective weighted by ``pi_old(y_i) / mu(y_i)``.
    Reference: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071.
    """
    _check_clip(clip_low, clip_high)
    valid = check_loss_inputs(response_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    new = select_valid(log_probs, valid)
    log_ratio = new - select_valid(old_log_probs, valid)
    lengths = valid.sum(dim=-1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
    seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True) / lengths
    token_log_ratio = seq_log_ratio.detach() + new - new.detach()
    loss_mat, was_clipped = _clipped_surrogate(clamped_exp(token_log_ratio), select_valid(advantages, valid), clip_low, clip_high)
    loss_mat = weigh_tokens(loss_mat, is_weights, valid)
    return GSPOLoss(
        loss=aggregate_loss(
            loss_mat, response_mask, mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length,
        ),
        pg_clipfrac=token_metric(was_clipped, valid, loss_mat.dtype),
        ppo_kl=token_metric(-log_ratio, valid),
    )


@register_op(
    "truncated_is_weight",
    inputs=("old_log_probs: float32[B, R]", "rollout_log_probs: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("is_weights: float32[B, R]",),
    correction="token-level truncated importance weights min(pi_old / pi_rollout, cap) (TIS)", rollout_input="rollout_log_probs",
)
def truncated_is_weight(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, *, cap: float = 2.0,
) -> ISWeights:
    """Truncated importance weight of the trainer's policy against the rollout engine's, detached.

    Shapes: old_log_probs ``(b, r)``, rollout_log_probs ``(b, r)``, response_mask ``(b, r)`` -> is_weights ``(b, r)``, 0 at padding.

        w_t = min(exp(old_log_probs_t - rollout_log_probs_t), cap)

    Reference: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training" (truncated importance sampling, after Espeholt et al. 2018, IMPALA).
    """
    if cap <= 0:
        raise ValueError(f"cap must be positive (e.g. 2.0), got {cap}")
    valid = check_loss_inputs(response_mask, old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs)
    log_ratio = select_valid(old_log_probs.detach(), valid) - select_valid(rollout_log_probs.detach(), valid)
    return ISWeights(select_valid(clamped_exp(log_ratio).clamp(max=cap), valid))
