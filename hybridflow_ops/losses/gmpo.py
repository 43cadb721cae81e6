"""Geometric-Mean Policy Optimization: the clipped objective on the geometric mean of a sequence's token ratios."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..registry import register_op
from ._common import LOG_RATIO_CLAMP, check_loss_inputs, select_valid, token_metric
from .aggregate import aggregate_loss

__all__ = ["GMPOLoss", "gmpo"]

# Added to an IS weight before its log, so that a token a correction zeroed (IcePop, rejection) stays finite.
_ZERO_WEIGHT = 1e-10


class GMPOLoss(NamedTuple):
    loss: torch.Tensor
    pg_clipfrac: torch.Tensor
    ppo_kl: torch.Tensor


@register_op(
    "gmpo", model_inputs=("log_probs: float32[B, R]",),
    inputs=("old_log_probs: float32[B, R]", "advantages: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("loss: float32",), kind="loss", vanishes_with="advantages", ratio_input="old_log_probs",
)
def gmpo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
    *,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    loss_agg_mode: str = "seq-mean-token-mean",
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> GMPOLoss:
    """GMPO: maximise the geometric mean of token-level clipped ratios times the sequence advantage.

    Shapes: log_probs (with grad), old_log_probs, advantages, response_mask ``(b, r)`` -> loss and metrics, scalars.

        A_i    = mean_{t valid} A_i,t                      (one advantage per sequence)
        x_i,t  = log_probs_i,t - old_log_probs_i,t
        c_i,t  = sgn(A_i) * min(sgn(A_i) x_i,t, sgn(A_i) clip(x_i,t, -clip_low, clip_high))
        L_i    = -A_i exp( mean_{t valid} c_i,t )          (GMPO, in log space)
        loss   = aggregate_loss(L_i on every valid token of i, response_mask, mode=loss_agg_mode, ...)

    ``exp(mean c)`` is the geometric mean ``(prod_t clip(r_t))^(1/|o_i|)``: a single token
    with an outlying ratio moves it far less than it moves the arithmetic mean of GRPO.
    The clip range is in log space, ``[e^-clip_low, e^clip_high]``; 0.4 on both sides is the
    paper's. As in PPO, the clip only bites in the direction the advantage pushes (for
    ``A > 0`` a log-ratio above ``clip_high`` is held there, one below ``-clip_low`` is not).
    Each sequence's loss is put on every valid token, so with the default
    ``seq-mean-token-mean`` the loss is ``mean_i L_i`` exactly, as in the paper; other modes
    weight sequences by their length. ``sgn(A_i)`` is that of the sequence advantage.
    Metrics: ``pg_clipfrac`` (fraction of valid tokens whose log-ratio was held at a bound),
    ``ppo_kl`` (mean of ``old_log_probs - log_probs``).
    ``is_weights`` (op ``gmpo_is``): the weights enter GMPO's geometric mean like the ratios do,
    ``L_i <- L_i * exp( mean_{t valid} log(w_i,t + 1e-10) )``, since ``prod_t (r_t w_t)^(1/|o_i|)`` with
    ``w_t = pi_old / mu`` is the geometric mean of the ratios to the behaviour policy ``mu``; this is
    verl's ``geo_mean`` loss with ``rollout_is_weights`` (the 1e-10 keeps a zero weight finite).
    Reference: "GMPO: Geometric-Mean Policy Optimization" (2025), arXiv 2507.20673.
    """
    if clip_low < 0.0 or clip_high < 0.0:
        raise ValueError(f"GMPO's log-space clip range needs clip_low >= 0 and clip_high >= 0, got {clip_low}, {clip_high}")
    valid = check_loss_inputs(response_mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    log_ratio = select_valid(log_probs, valid) - select_valid(old_log_probs, valid)
    lengths = valid.sum(dim=-1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
    seq_adv = select_valid(advantages, valid).sum(dim=-1, keepdim=True) / lengths
    sign = torch.sign(seq_adv)
    clipped = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-clip_low, clip_high))
    mean_log_ratio = select_valid(clipped, valid).sum(dim=-1, keepdim=True) / lengths
    seq_loss = -seq_adv * mean_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    if is_weights is not None:
        check_loss_inputs(response_mask, is_weights=is_weights)
        log_w = select_valid((is_weights.detach() + _ZERO_WEIGHT).log(), valid)
        seq_loss = seq_loss * (log_w.sum(dim=-1, keepdim=True) / lengths).exp()
    loss_mat = seq_loss.expand_as(log_ratio)
    was_clipped = (clipped != log_ratio) & (sign != 0)
    return GMPOLoss(
        loss=aggregate_loss(
            loss_mat, response_mask, mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length,
        ),
        pg_clipfrac=token_metric(was_clipped, valid, loss_mat.dtype),
        ppo_kl=token_metric(-log_ratio, valid),
    )
