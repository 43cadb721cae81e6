"""Rollout correction: weights and masks for rollouts sampled by an engine that differs from the trainer.

The rollout engine (vLLM, bf16 kernels, an older checkpoint) samples from ``mu``; the
trainer's policy at the start of the update is ``pi_old``. Each op here compares the two
on the sampled tokens, ``log k_t = old_log_probs_t - rollout_log_probs_t``, and returns a
*detached* weight (to multiply the per-token loss, e.g. with ``ppo_clip_is``) or a new
response mask (rejection). Token-level truncated IS is :func:`~hybridflow_ops.truncated_is_weight`;
rejection by the k1/k2/k3 divergence estimators is :mod:`hybridflow_ops.rollout_rejection`.

A rejection op replaces ``response_mask``: the losses' token and sequence counts then
come from the new mask, so rejected tokens leave both the numerator and the denominator.
References: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy
RL Training" (blog); Ling team 2025, "Every Step Evolves: Scaling Reinforcement Learning
for Trillion-Scale Thinking Model", arXiv 2510.18855 (IcePop).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .losses._common import LOG_RATIO_CLAMP, check_loss_inputs, clamped_exp, select_valid
from .losses.policy import ISWeights
from .masked import masked_mean
from .registry import register_op

__all__ = ["RejectionMask", "sequence_is_weight", "icepop_is_weight", "decoupled_is_weight", "normalize_is_weight",
           "sequence_rejection_mask"]

_PAIR = ("old_log_probs: float32[B, R]", "rollout_log_probs: float32[B, R]", "response_mask: float32[B, R]")
_IS_WEIGHTS = ("is_weights: float32[B, R]",)
_SEQ_STATISTICS = ("geometric_mean", "product")
_NORMALIZE_MIN_MEAN = 1e-8


class RejectionMask(NamedTuple):
    response_mask: torch.Tensor
    rejected_frac: torch.Tensor


def _token_log_ratio(old_log_probs, rollout_log_probs, response_mask):
    valid = check_loss_inputs(response_mask, old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs)
    log_ratio = select_valid(old_log_probs.detach(), valid) - select_valid(rollout_log_probs.detach(), valid)
    return log_ratio, valid


def _sequence_log_ratio(log_ratio, valid, statistic):
    if statistic not in _SEQ_STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; use one of {', '.join(_SEQ_STATISTICS)}")
    total = log_ratio.sum(dim=-1, keepdim=True)
    if statistic == "product":
        return total
    return total / valid.sum(dim=-1, keepdim=True).clamp(min=1).to(log_ratio.dtype)


@register_op("sequence_is_weight", inputs=_PAIR, outputs=_IS_WEIGHTS, rollout_input="rollout_log_probs",
             correction="sequence-level truncated importance weights (one weight per response)")
def sequence_is_weight(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, *, cap: float = 2.0,
) -> ISWeights:
    """Sequence-level truncated importance weight, the same on every valid token of a response.

    Shapes: old_log_probs, rollout_log_probs, response_mask ``(b, r)`` -> is_weights ``(b, r)``, 0 at padding, detached.

        w_i = min( exp( sum_{t valid} (old_log_probs_i,t - rollout_log_probs_i,t) ), cap )
            = min( pi_old(y_i) / mu(y_i), cap )

    The ratio of whole-sequence probabilities is the unbiased correction for a
    sequence-level reward (token-level weights are biased, but of lower variance); the cap
    trades the bias back for variance (truncated IS, Ionides 2008). The summed log-ratio is
    clamped to ``[-20, 20]`` before ``exp``. Reference: Precup, Sutton & Singh 2000,
    "Eligibility Traces for Off-Policy Policy Evaluation" (trajectory-wise IS); Yao et al. 2025.
    """
    if cap <= 0:
        raise ValueError(f"cap must be positive (e.g. 2.0), got {cap}")
    log_ratio, valid = _token_log_ratio(old_log_probs, rollout_log_probs, response_mask)
    weight = clamped_exp(_sequence_log_ratio(log_ratio, valid, "product")).clamp(max=cap)
    return ISWeights(select_valid(weight.expand_as(log_ratio), valid))


@register_op("icepop_is_weight", inputs=_PAIR, outputs=_IS_WEIGHTS, rollout_input="rollout_log_probs",
             correction="IS weights that zero tokens (or whole responses) whose ratio leaves a band (IcePop)")
def icepop_is_weight(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    low: float = 0.5,
    high: float = 5.0,
    keep_ratio: bool = True,
    level: str = "token",
    statistic: str = "geometric_mean",
) -> ISWeights:
    """IcePop: the IS ratio where it lies in ``[low, high]``, 0 (masked) outside; per token or per response.

    Shapes: old_log_probs, rollout_log_probs, response_mask ``(b, r)`` -> is_weights ``(b, r)``, 0 at padding, detached.

        level="token":     k_t = exp(old_log_probs_t - rollout_log_probs_t) = pi_old(y_t) / mu(y_t)
                           w_t = M(k_t),  M(k) = k * [low <= k <= high]     (IcePop's M; keep_ratio=True)
        level="sequence":  rho_i = exp( mean_{t valid} log k_i,t )         statistic="geometric_mean"
                           rho_i = exp(  sum_{t valid} log k_i,t )         statistic="product" (= pi_old(y_i) / mu(y_i))
                           w_i,t = M(rho_i) on every valid token of response i
        keep_ratio=False:  the indicator alone, ``[low <= k <= high]`` (masking without weighting)

    Unlike truncation, a token (or response) whose probabilities disagree too much in *either*
    direction gets no gradient at all: the paper finds such tokens carry the mismatch that makes
    MoE training collapse. ``[0.5, 5]`` are the paper's bounds (alpha, beta), for tokens. The
    sequence level applies the same double-sided mask to a response's ratio: with ``product``
    it is the sequence-level masked IS of Liu et al. 2025 with a lower bound too; with
    ``geometric_mean`` (the default) one pair of bounds serves every length ("geometric sequence
    masking"), as :func:`sequence_rejection_mask` does, and the weight is the per-token
    geometric-mean ratio. Log-ratios are clamped to ``[-20, 20]`` before ``exp``.
    Reference: Ling team 2025, arXiv 2510.18855 (Ring-1T), Sec. on IcePop, eq. of ``J_IcePop`` and ``M(k)``;
    Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch" (blog).
    """
    if not 0.0 <= low <= 1.0 <= high:
        raise ValueError(f"IcePop bounds must satisfy 0 <= low <= 1 <= high (e.g. 0.5 and 5), got low={low}, high={high}")
    if level not in ("token", "sequence"):
        raise ValueError(f"IcePop level must be 'token' or 'sequence', got {level!r}")
    log_ratio, valid = _token_log_ratio(old_log_probs, rollout_log_probs, response_mask)
    if level == "sequence":
        log_ratio = _sequence_log_ratio(log_ratio, valid, statistic).expand_as(log_ratio)
    ratio = clamped_exp(log_ratio)
    inside = valid & (ratio >= low) & (ratio <= high)
    kept = ratio if keep_ratio else torch.ones_like(ratio)
    return ISWeights(torch.where(inside, kept, torch.zeros_like(kept)))


@register_op("decoupled_is_weight", inputs=_PAIR, outputs=_IS_WEIGHTS, rollout_input="rollout_log_probs",
             correction="behaviour importance weights pi_prox / mu of AReaL's decoupled PPO")
def decoupled_is_weight(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, *, cap: float | None = None,
) -> ISWeights:
    """AReaL's decoupled PPO: the behaviour weight ``pi_prox / mu``; tokens above ``cap`` are dropped, not truncated.

    Shapes: old_log_probs (the proximal policy's), rollout_log_probs (the behaviour policy's),
    response_mask ``(b, r)`` -> is_weights ``(b, r)``, 0 at padding and at dropped tokens, detached.

        u_t = exp(old_log_probs_t - rollout_log_probs_t) = pi_prox(y_t) / mu(y_t)
        w_t = u_t * [u_t <= cap]                                      (cap=None: w_t = u_t)

    AReaL decouples the two roles PPO's ``pi_old`` plays: the *behaviour* policy ``mu`` that
    sampled the tokens (possibly several versions old, even within one response) enters only
    through this importance weight, and the *proximal* policy ``pi_prox`` -- the weights at the
    start of this update, i.e. the recomputed ``actor.logprob`` -- anchors the clip:

        J(theta) = E_mu[ sum_t (pi_prox / mu) min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t) ],
        r_t = pi_theta / pi_prox                                       (AReaL, Sec. 5.1, eq. 5)

    which is ``ppo_clip_is`` (or any ``*_is`` loss) with ``old_log_probs = log pi_prox`` and these
    weights (algorithm ``grpo_decoupled``). AReaL drops tokens whose weight exceeds a cap
    (``behav_imp_weight_cap``) instead of truncating them; ``cap=None`` keeps every weight.
    Log-ratios are clamped to ``[-20, 20]`` before ``exp``.
    Reference: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
    Language Reasoning", arXiv 2505.24298 (decoupled PPO objective); Hilton et al. 2022, "Batch size-invariance
    for policy optimization", arXiv 2110.00641 (the proximal policy).
    """
    if cap is not None and cap < 1.0:
        raise ValueError(f"cap must be >= 1 (e.g. 5.0: drop tokens whose pi_prox / mu exceeds it) or None, got {cap}")
    log_ratio, valid = _token_log_ratio(old_log_probs, rollout_log_probs, response_mask)
    weight = clamped_exp(log_ratio)
    keep = valid if cap is None else valid & (weight <= cap)
    return ISWeights(torch.where(keep, weight, torch.zeros_like(weight)))


@register_op("normalize_is_weight", inputs=("is_weights: float32[B, R]", "response_mask: float32[B, R]"), outputs=_IS_WEIGHTS)
def normalize_is_weight(is_weights: torch.Tensor, response_mask: torch.Tensor, *, level: str = "token") -> ISWeights:
    """Divide IS weights by their batch mean, so that they average to 1 (self-normalised IS).

    Shapes: is_weights, response_mask ``(b, r)`` -> is_weights ``(b, r)``, 0 at padding, detached.

        level="token":     w_t / mean_{valid t} w_t
        level="sequence":  w_t / mean_{i non-empty} w_i,   w_i = mean_{valid t of i} w_i,t

    ``sequence`` is the right mean for per-sequence weights (:func:`sequence_is_weight`):
    every response counts once, whatever its length. A mean of at most 1e-8 (every weight
    masked) leaves the weights unchanged, as verl's ``rollout_is_batch_normalize`` does. Normalising by the batch's own mean makes the estimate
    self-normalised: biased, but consistent and of lower variance; the mean is that of
    the tensor given, so apply it to the whole batch before it is split.
    Reference: Owen 2013, "Monte Carlo theory, methods and examples", Ch. 9.2 (self-normalised IS).
    """
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    valid = check_loss_inputs(response_mask, is_weights=is_weights)
    weights = select_valid(is_weights.detach(), valid)
    if level == "token":
        mean = masked_mean(weights, valid)
    else:
        per_seq = masked_mean(weights, valid, dim=-1)
        mean = masked_mean(per_seq, valid.any(dim=-1))
    mean = torch.where(mean > _NORMALIZE_MIN_MEAN, mean, torch.ones_like(mean))
    return ISWeights(weights / mean)


@register_op("sequence_rejection_mask", inputs=_PAIR, outputs=("response_mask: float32[B, R]",), rollout_input="rollout_log_probs",
             correction="drops responses whose sequence-level IS ratio leaves a band (rejection sampling)")
def sequence_rejection_mask(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    low: float = 0.5,
    high: float = 2.0,
    statistic: str = "geometric_mean",
) -> RejectionMask:
    """Reject whole responses whose trainer/engine probability ratio is out of ``[low, high]``.

    Shapes: old_log_probs, rollout_log_probs, response_mask ``(b, r)``
    -> response_mask ``(b, r)`` (rejected rows all 0) and the metric ``rejected_frac``, a scalar.

        rho_i = exp( mean_{t valid} log k_i,t )     statistic="geometric_mean"
        rho_i = exp(  sum_{t valid} log k_i,t )     statistic="product"  (= pi_old(y_i) / mu(y_i))
        response_mask_i,t <- response_mask_i,t * [low <= rho_i <= high]

    The geometric mean does not drift with the response length, so one pair of bounds
    serves short and long responses; the product is the sequence IS ratio itself. Bounds
    are this library's defaults. ``rejected_frac``: fraction of non-empty responses rejected.
    Reference: Yao et al. 2025 (blog), and the sequence-level masked IS of Liu et al. 2025,
    "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch" (blog).
    """
    if not 0.0 <= low <= 1.0 <= high:
        raise ValueError(f"rejection bounds must satisfy 0 <= low <= 1 <= high, got low={low}, high={high}")
    log_ratio, valid = _token_log_ratio(old_log_probs, rollout_log_probs, response_mask)
    log_rho = _sequence_log_ratio(log_ratio, valid, statistic).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho = log_rho.exp()
    keep = (rho >= low) & (rho <= high)
    non_empty = valid.any(dim=-1)
    rejected = (~keep.squeeze(-1)) & non_empty
    frac = rejected.sum().to(log_ratio.dtype) / non_empty.sum().clamp(min=1).to(log_ratio.dtype)
    new_mask = torch.where(keep & valid, response_mask, torch.zeros_like(response_mask))
    return RejectionMask(new_mask, frac)
