"""Clip-Cov and KL-Cov: entropy control by acting on the tokens whose log-prob and advantage covary most.

Cui et al. show that the entropy of the policy falls in proportion to the covariance,
over sampled tokens, of their log-probability and their advantage; a few tokens of
very high covariance drive the collapse. Both losses score every valid token by

    cov_t = (log_probs_t - mean(log_probs)) * (A_t - mean(A))      means over the batch's valid tokens

and treat a small fraction of them differently. Because the means and the fraction are
taken over the batch given to the op, the result depends on the *other* rows: these
losses are not row-separable, so neither declares ``vanishes_with`` (an engine must not
drop rows, even those with zero advantage), and a split into micro-batches selects per
micro-batch, as in the authors' implementation.
Reference: Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models", arXiv 2505.22617, Sec. 4.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..masked import masked_mean
from ..registry import register_op
from ._common import check_loss_inputs, clamped_exp, select_valid, token_metric, weigh_tokens
from .aggregate import aggregate_loss

__all__ = ["ClipCovLoss", "KLCovLoss", "clip_cov", "kl_cov", "token_covariance"]

_INPUTS = ("old_log_probs: float32[B, R]", "advantages: float32[B, R]", "response_mask: float32[B, R]")


class ClipCovLoss(NamedTuple):
    loss: torch.Tensor
    cov_clipfrac: torch.Tensor
    pg_clipfrac: torch.Tensor
    ppo_kl: torch.Tensor


class KLCovLoss(NamedTuple):
    loss: torch.Tensor
    cov_klfrac: torch.Tensor
    ppo_kl: torch.Tensor


def token_covariance(log_probs: torch.Tensor, advantages: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-token ``(logp - mean logp)(A - mean A)``, detached, means over valid tokens; 0 at padding.

    Shapes: log_probs, advantages, valid ``(b, r)`` -> ``(b, r)``.
    """
    logp = select_valid(log_probs.detach(), valid)
    adv = select_valid(advantages.detach(), valid)
    cov = (logp - masked_mean(logp, valid)) * (adv - masked_mean(adv, valid))
    return select_valid(cov, valid)


def _selection_count(ratio: float, valid: torch.Tensor) -> int:
    return max(int(ratio * int(valid.sum().item())), 1)


@register_op("clip_cov", model_inputs=("log_probs: float32[B, R]",), inputs=_INPUTS, outputs=("loss: float32",), kind="loss", ratio_input="old_log_probs")
def clip_cov(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    seed: int = 0,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> ClipCovLoss:
    """Clip-Cov: the PPO clip loss with the gradient of a few random high-covariance tokens detached.

    Shapes: log_probs (with grad), old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        l_t    = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))         (PPO)
        C      = {t valid, not clipped by PPO : clip_cov_lb < cov_t < clip_cov_ub}
        I_clip = n tokens drawn uniformly without replacement from C,
                 n = min(|C|, max(1, floor(clip_cov_ratio * N)))                    (Clip-Cov)
        l_t    = sg[l_t]  for t in I_clip  (its value is kept, its gradient is 0)
        loss   = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    ``N`` is the number of valid tokens given to the op. The draw is a pure function of
    ``seed`` and of the candidates' order (row-major over valid tokens, so padding does not
    move it); pass e.g. the step number as ``seed`` for a fresh draw each step. Defaults are
    the paper's (r = 2e-4, bounds 1 and 5). The authors' code also multiplies the chosen
    tokens' loss by 0; here its value is kept (only the gradient is detached, as the paper
    states), which changes the logged loss, not the update.
    Metrics: ``cov_clipfrac`` (fraction of valid tokens detached), ``pg_clipfrac``,
    ``ppo_kl``. Not row-separable: see the module docstring.
    ``is_weights`` (op ``clip_cov_is``): each token's loss is multiplied by ``sg[w_t]`` after the
    selection (verl's ``clip_cov`` loss with ``rollout_is_weights``); the covariance is not weighted.
    Reference: Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv 2505.22617 (Clip-Cov).
    """
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"clip range must satisfy 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if not 0.0 < clip_cov_ratio <= 1.0 or clip_cov_lb >= clip_cov_ub:
        raise ValueError(f"need 0 < clip_cov_ratio <= 1 and clip_cov_lb < clip_cov_ub, got {clip_cov_ratio}, {clip_cov_lb}, {clip_cov_ub}")
    valid = check_loss_inputs(response_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    log_ratio = select_valid(log_probs, valid) - select_valid(old_log_probs, valid)
    adv = select_valid(advantages, valid)
    ratio = clamped_exp(log_ratio)
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    cov = token_covariance(log_probs, advantages, valid)
    candidates = valid & ~was_clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    flat = torch.nonzero(candidates.flatten()).squeeze(-1)
    chosen = torch.zeros_like(candidates)
    if flat.numel():
        n = min(flat.numel(), _selection_count(clip_cov_ratio, valid))
        keys = torch.rand(flat.numel(), generator=torch.Generator().manual_seed(seed))
        picked = flat[keys.topk(n).indices.to(flat.device)]
        chosen = chosen.flatten().index_fill(0, picked, True).view_as(candidates)
    loss_mat = weigh_tokens(torch.where(chosen, loss_mat.detach(), loss_mat), is_weights, valid)
    return ClipCovLoss(
        loss=aggregate_loss(
            loss_mat, response_mask, mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length,
        ),
        cov_clipfrac=token_metric(chosen, valid, loss_mat.dtype),
        pg_clipfrac=token_metric(was_clipped, valid, loss_mat.dtype),
        ppo_kl=token_metric(-log_ratio, valid),
    )


@register_op("kl_cov", model_inputs=("log_probs: float32[B, R]",), inputs=_INPUTS, outputs=("loss: float32",), kind="loss", ratio_input="old_log_probs")
def kl_cov(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    kl_cov_ratio: float = 2e-3,
    kl_coef: float = 1.0,
    loss_agg_mode: str = "token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> KLCovLoss:
    """KL-Cov: the unclipped surrogate plus a KL penalty on the top-covariance tokens.

    Shapes: log_probs (with grad), old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        l_t   = -A_t r_t                                   for t not in I_KL
        l_t   = -A_t r_t + kl_coef |log r_t|               for t in I_KL           (KL-Cov)
        I_KL  = the k valid tokens of largest cov_t, k = max(1, floor(kl_cov_ratio * N))
        loss  = aggregate_loss(l, response_mask, mode=loss_agg_mode, ...)

    ``|log r_t|`` is the paper's estimate of ``KL(pi_old || pi)`` at the token. Defaults are
    the paper's for 7B models (k = 2e-3, beta = 1). Ties at the k-th covariance are broken by
    ``torch.topk``. The penalty does not vanish with the advantage: a token of a
    zero-advantage row can be selected (its covariance is ``-mean(A) (logp - mean logp)``)
    and gets a gradient from ``|log r_t|``, so this loss declares no ``vanishes_with``.
    Metrics: ``cov_klfrac`` (fraction of valid tokens penalised), ``ppo_kl``.
    ``is_weights`` (op ``kl_cov_is``): each token's loss, penalty included, is multiplied by ``sg[w_t]``
    (verl's ``kl_cov`` loss with ``rollout_is_weights``).
    Reference: Cui et al. 2025, arXiv 2505.22617 (KL-Cov).
    """
    if not 0.0 < kl_cov_ratio <= 1.0:
        raise ValueError(f"kl_cov_ratio must be in (0, 1], got {kl_cov_ratio}")
    valid = check_loss_inputs(response_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    log_ratio = select_valid(log_probs, valid) - select_valid(old_log_probs, valid)
    loss_mat = -select_valid(advantages, valid) * clamped_exp(log_ratio)
    chosen = torch.zeros_like(valid)
    positions = torch.nonzero(valid.flatten()).squeeze(-1)  # row-major over valid tokens: padding does not move it
    if positions.numel():
        cov = token_covariance(log_probs, advantages, valid).flatten()[positions]
        top = positions[cov.topk(_selection_count(kl_cov_ratio, valid)).indices]
        chosen = chosen.flatten().index_fill(0, top, True).view_as(valid)
    loss_mat = weigh_tokens(loss_mat + kl_coef * torch.where(chosen, log_ratio.abs(), torch.zeros_like(log_ratio)), is_weights, valid)
    return KLCovLoss(
        loss=aggregate_loss(
            loss_mat, response_mask, mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length,
        ),
        cov_klfrac=token_metric(chosen, valid, loss_mat.dtype),
        ppo_kl=token_metric(-log_ratio, valid),
    )
