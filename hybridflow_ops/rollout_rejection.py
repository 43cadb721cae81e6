"""Rejection by divergence estimators: drop tokens or responses whose trainer/engine divergence is too large.

With ``log r_t = old_log_probs_t - rollout_log_probs_t = log(pi_old(y_t) / mu(y_t))`` on tokens sampled
from ``mu``, Schulman's three estimators of ``KL(mu || pi_old)`` are, per token (clamped to ``[-20, 20]``):

    k1 = -log r               = log(mu / pi_old)   unbiased, signed
    k2 = (log r)^2 / 2                             biased, >= 0
    k3 = (r - 1) - log r                           unbiased, >= 0

(k1 is written with the sign that makes it an estimate of ``KL(mu || pi_old)``; ``log r`` itself is its
negative.) A rejection op aggregates one estimator over a *level*

    token:     the token's own value
    seq_sum:   sum over the response's valid tokens
    seq_mean:  mean over the response's valid tokens
    seq_max:   max over the response's valid tokens (k2, k3: the worst token decides)

and keeps the token (or every token of the response) when the statistic is in bounds: for k1 a band
``log(low) <= stat <= log(high)`` (so ``[low, high]`` bounds ``exp(k1) = mu / pi_old``, per token or per
response; ``low`` defaults to ``1 / high``), for k2 and k3 ``stat <= high``. The output replaces
``response_mask``, so rejected tokens leave both the loss and its token and sequence counts.

:func:`chained_rejection_mask` applies several criteria, each computed on the *incoming* mask, and keeps a
token only where all of them keep it: its mask is the product of the single criteria's masks. (Chaining
:func:`kl_rejection_mask` nodes in a graph instead computes each ``seq_*`` statistic over the tokens the
previous criteria left, which differs when a token-level criterion comes first.)
These are the criteria and the threshold convention of verl's rollout rejection sampling
(``rollout_rs``: ``token_k1`` ... ``seq_max_k3``, chained with commas).
Reference: Schulman 2020, "Approximating KL Divergence" (blog: k1, k2, k3); Yao et al. 2025 and Liu et al.
2025 (blogs on the training-inference mismatch) for rejecting tokens and responses.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from .losses._common import LOG_RATIO_CLAMP, check_loss_inputs, select_valid
from .masked import masked_mean
from .registry import register_op

__all__ = ["KLRejectionMask", "KL_ESTIMATORS", "REJECTION_LEVELS", "kl_rejection_mask", "chained_rejection_mask",
           "parse_criteria"]

KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda log_r: -log_r,
    "k2": lambda log_r: 0.5 * log_r.square(),
    "k3": lambda log_r: log_r.exp() - 1.0 - log_r,
}
"""Estimator name -> its per-token value from the clamped ``log r = log(pi_old / mu)``."""


def _seq_sum(stat, valid):
    return select_valid(stat, valid).sum(dim=-1, keepdim=True)


def _seq_mean(stat, valid):
    return masked_mean(stat, valid, dim=-1).unsqueeze(-1)


def _seq_max(stat, valid):
    worst = torch.where(valid, stat, torch.full_like(stat, -math.inf)).amax(dim=-1, keepdim=True)
    return torch.where(valid.any(dim=-1, keepdim=True), worst, torch.zeros_like(worst))


REJECTION_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": lambda stat, valid: stat,
    "seq_sum": _seq_sum,
    "seq_mean": _seq_mean,
    "seq_max": _seq_max,
}
"""Level name -> the statistic it compares (per token ``(b, r)`` or per response ``(b, 1)``)."""


class KLRejectionMask(NamedTuple):
    response_mask: torch.Tensor
    rejected_token_frac: torch.Tensor
    rejected_seq_frac: torch.Tensor


def _check_criterion(level: str, estimator: str, low: float | None, high: float | None) -> tuple[float | None, float]:
    """Validate one criterion; return its (low, high), low filled in as 1 / high for k1."""
    if level not in REJECTION_LEVELS:
        raise ValueError(f"unknown rejection level {level!r}; use one of {', '.join(REJECTION_LEVELS)}")
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; use one of {', '.join(KL_ESTIMATORS)}")
    if high is None or not high > 0:
        raise ValueError(f"rejection {level}_{estimator} needs an upper bound high > 0, got {high!r}")
    if estimator == "k1":
        if level == "seq_max":
            raise ValueError("seq_max with k1 is not a bound on a divergence (k1 is signed); use k2 or k3 with seq_max")
        low = 1.0 / high if low is None else low
        if not 0 < low <= high:
            raise ValueError(f"k1 bounds must satisfy 0 < low <= high (on mu / pi_old), got low={low}, high={high}")
    elif low is not None:
        raise ValueError(f"{estimator} is >= 0 and takes only an upper bound; drop low={low} (low is for k1)")
    return low, high


def _keep(log_ratio, valid, level, estimator, low, high) -> torch.Tensor:
    """Boolean ``(b, r)``: where one criterion keeps the token (before intersecting with ``valid``)."""
    stat = REJECTION_LEVELS[level](KL_ESTIMATORS[estimator](log_ratio), valid)
    if estimator == "k1":
        keep = (stat >= math.log(low)) & (stat <= math.log(high))
    else:
        keep = stat <= high
    return keep.expand_as(log_ratio)


def _result(response_mask, valid, keep) -> KLRejectionMask:
    kept = keep & valid
    dropped = valid & ~kept
    non_empty = valid.any(dim=-1)
    dtype = torch.promote_types(response_mask.dtype, torch.float32)
    token_frac = dropped.sum().to(dtype) / valid.sum().clamp(min=1).to(dtype)
    seq_frac = (dropped.any(dim=-1) & non_empty).sum().to(dtype) / non_empty.sum().clamp(min=1).to(dtype)
    return KLRejectionMask(torch.where(kept, response_mask, torch.zeros_like(response_mask)), token_frac, seq_frac)


def _log_ratio(old_log_probs, rollout_log_probs, response_mask):
    valid = check_loss_inputs(response_mask, old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs)
    log_ratio = select_valid(old_log_probs.detach(), valid) - select_valid(rollout_log_probs.detach(), valid)
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), valid


_PAIR = ("old_log_probs: float32[B, R]", "rollout_log_probs: float32[B, R]", "response_mask: float32[B, R]")
_MASK = ("response_mask: float32[B, R]",)


@register_op("kl_rejection_mask", inputs=_PAIR, outputs=_MASK, rollout_input="rollout_log_probs",
             correction="drops tokens or responses whose k1/k2/k3 divergence to the rollout leaves its bounds")
def kl_rejection_mask(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    level: str = "token",
    estimator: str = "k3",
    high: float | None = None,
    low: float | None = None,
) -> KLRejectionMask:
    """Reject tokens (level ``token``) or whole responses (``seq_sum``, ``seq_mean``, ``seq_max``) by a KL estimator.

    Shapes: old_log_probs, rollout_log_probs, response_mask ``(b, r)`` -> response_mask ``(b, r)`` and the
    metrics ``rejected_token_frac`` (valid tokens dropped) and ``rejected_seq_frac`` (non-empty responses
    with a dropped token), scalars.

        s     = level( estimator( log r ) )                       (module docstring)
        keep  = log(low) <= s <= log(high)                        k1 (low defaults to 1 / high)
        keep  = s <= high                                         k2, k3
        response_mask_t <- response_mask_t * keep_t

    Worked case (k3, token, high=0.2): ``log r = (0, ln 2, -ln 2)`` gives ``k3 = (0, 0.307, 0.193)``, so the
    mask ``(1, 1, 1)`` becomes ``(1, 0, 1)``. ``high`` has no default: the right bound depends on the
    estimator and the level (a ``seq_sum`` grows with the length).
    Reference: Schulman 2020, "Approximating KL Divergence" (blog); verl's ``rollout_rs`` criteria.
    """
    low, high = _check_criterion(level, estimator, low, high)
    log_ratio, valid = _log_ratio(old_log_probs, rollout_log_probs, response_mask)
    return _result(response_mask, valid, _keep(log_ratio, valid, level, estimator, low, high))


def parse_criteria(criteria: str) -> list[tuple[str, str, float | None, float]]:
    """``"token_k1=0.5_2.0, seq_max_k3=0.3"`` -> ``[(level, estimator, low, high), ...]``, each checked.

    A criterion is ``<level>_<estimator>=<bound>``; a k1 bound is ``high`` or ``low_high`` (verl's format)."""
    parsed = []
    for part in (p.strip() for p in criteria.split(",")):
        name, sep, bound = part.partition("=")
        level, _, estimator = name.strip().rpartition("_")
        try:
            if not sep or not level:
                raise ValueError
            low_text, _, high_text = bound.strip().rpartition("_")
            low, high = (float(low_text) if low_text else None), float(high_text)
        except ValueError:
            raise ValueError(f"cannot read rejection criterion {part!r}; write '<level>_<estimator>=<bound>', e.g. "
                             "'token_k1=0.5_2.0' or 'seq_mean_k3=0.01' (levels: " + ", ".join(REJECTION_LEVELS) +
                             "; estimators: k1, k2, k3)") from None
        parsed.append((level, estimator) + _check_criterion(level, estimator, low, high))
    return parsed


@register_op("chained_rejection_mask", inputs=_PAIR, outputs=_MASK, rollout_input="rollout_log_probs",
             correction="drops tokens or responses failing any of several k1/k2/k3 rejection criteria")
def chained_rejection_mask(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    criteria: str = "token_k1=0.5_2.0,seq_max_k3=0.5",
) -> KLRejectionMask:
    """Several rejection criteria at once: a token is kept only where every criterion keeps it.

    Shapes: as :func:`kl_rejection_mask`.

        keep = prod_c keep_c,   each keep_c computed by :func:`kl_rejection_mask`'s rule on the incoming mask
        response_mask_t <- response_mask_t * keep_t

    ``criteria``: comma-separated ``<level>_<estimator>=<bound>`` (see :func:`parse_criteria`); the
    default drops tokens whose ratio leaves ``[0.5, 2]`` and responses holding a token with ``k3 > 0.5``
    (this library's defaults). The result equals the product of the single criteria's masks.
    Reference: verl's chained ``rollout_rs`` options; Schulman 2020, "Approximating KL Divergence" (blog).
    """
    parsed = parse_criteria(criteria)
    log_ratio, valid = _log_ratio(old_log_probs, rollout_log_probs, response_mask)
    keep = torch.ones_like(valid)
    for level, estimator, low, high in parsed:
        keep = keep & _keep(log_ratio, valid, level, estimator, low, high)
    return _result(response_mask, valid, keep)
