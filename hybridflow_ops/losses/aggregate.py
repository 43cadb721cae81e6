"""Reduce a per-token loss matrix to the scalar that is back-propagated.

Five modes, each a sum of per-token (or per-sequence) terms divided by a count
that the caller may take from the *whole* batch (``global_tokens``,
``global_seqs``), or by nothing (``token-sum``). With global counts, the losses of the micro-batches of a
split batch add up to the loss of the unsplit batch, so gradient accumulation
gives the same update whatever the split (verl's "global token" normalisation).

========================  ===========================================================
mode                      loss
========================  ===========================================================
token-mean                ``sum_{i,t} l m / global_tokens``
seq-mean-token-sum        ``sum_i (sum_t l m) / global_seqs``
seq-mean-token-mean       ``sum_i (sum_t l m / sum_t m) / global_seqs``
seq-mean-token-sum-norm   ``sum_{i,t} l m / (global_seqs * norm_length)`` (Dr.GRPO)
token-sum                 ``sum_{i,t} l m``
========================  ===========================================================

``seq-mean-token-sum-norm`` is the constant normaliser of Dr.GRPO (Liu et al.
2025, "Understanding R1-Zero-Like Training", Sec. 3.1), which removes the
response-length bias of per-sequence token means.

``token-sum`` divides by nothing: the loss is the plain Monte-Carlo sum of the
per-token terms, as in the REINFORCE estimator written over a batch
(Williams 1992), summed rather than averaged. Its scale grows with the
batch and the response lengths, so the learning rate must absorb both; it needs
no global count (the micro-batch sums add up to the batch sum by construction).
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["LOSS_AGG_MODES", "aggregate_loss", "count_tokens", "count_seqs"]

def count_tokens(mask: torch.Tensor) -> torch.Tensor:
    """Number of valid tokens of ``mask`` ``(b, t)``, as a float scalar tensor."""
    return mask.to(torch.bool).sum().to(torch.float32)


def count_seqs(mask: torch.Tensor) -> torch.Tensor:
    """Number of sequences of ``mask`` ``(b, t)`` with at least one valid token, as a float scalar tensor.

    Rows that are entirely padding are not counted, so appending empty rows
    leaves every sequence-level mean unchanged.
    """
    return mask.to(torch.bool).any(dim=-1).sum().to(torch.float32)


def _count_dtype(loss: torch.Tensor) -> torch.dtype:
    """At least float32, so counts stay exact for half-precision losses (bf16 cannot hold 8193)."""
    return torch.promote_types(loss.dtype, torch.float32)


def _denominator(given, default: torch.Tensor, name: str, like: torch.Tensor) -> torch.Tensor:
    value = default if given is None else torch.as_tensor(given, dtype=_count_dtype(like), device=like.device)
    if value.numel() != 1:
        raise ValueError(f"{name} must be a scalar count, got a tensor of shape {tuple(value.shape)}")
    if given is not None and bool(value < 0):
        raise ValueError(f"{name} must be >= 0 (the count of the whole batch), got {float(value)}")
    # A batch with no valid token gives 0 / 1 = 0 rather than nan.
    return value.to(device=like.device, dtype=_count_dtype(like)).clamp(min=1.0)


def _token_mean(sums, mask, global_tokens, global_seqs, norm_length, loss):
    return sums.sum() / _denominator(global_tokens, count_tokens(mask), "global_tokens", loss)


def _seq_mean_token_sum(sums, mask, global_tokens, global_seqs, norm_length, loss):
    return sums.sum() / _denominator(global_seqs, count_seqs(mask), "global_seqs", loss)


def _seq_mean_token_mean(sums, mask, global_tokens, global_seqs, norm_length, loss):
    lengths = mask.to(torch.bool).sum(dim=-1).to(_count_dtype(loss)).clamp(min=1.0)
    return (sums / lengths).sum() / _denominator(global_seqs, count_seqs(mask), "global_seqs", loss)


def _seq_mean_token_sum_norm(sums, mask, global_tokens, global_seqs, norm_length, loss):
    length = loss.shape[-1] if norm_length is None else norm_length
    if length <= 0:
        raise ValueError(f"norm_length must be positive (e.g. the maximum response length), got {length}")
    return sums.sum() / (_denominator(global_seqs, count_seqs(mask), "global_seqs", loss) * length)


def _token_sum(sums, mask, global_tokens, global_seqs, norm_length, loss):
    return sums.sum()


LOSS_AGG_MODES: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
    "token-sum": _token_sum,
}


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    global_tokens: int | float | torch.Tensor | None = None,
    global_seqs: int | float | torch.Tensor | None = None,
    norm_length: int | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss to a scalar (see the module docstring for the formulas).

    Shapes: loss_mat ``(b, r)``, mask ``(b, r)`` -> scalar.

    ``global_tokens`` / ``global_seqs``: valid tokens / non-empty sequences of the
    whole batch this micro-batch belongs to; ``None`` counts them in ``mask``.
    ``norm_length``: the constant length of ``seq-mean-token-sum-norm``; ``None``
    uses ``r`` (pass the maximum response length to make it independent of padding).
    Values of ``loss_mat`` at padding never enter the result, even if nan or inf.
    """
    try:
        reduce = LOSS_AGG_MODES[mode]
    except KeyError:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes are: {', '.join(LOSS_AGG_MODES)}") from None
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat of shape {tuple(loss_mat.shape)} and mask of shape {tuple(mask.shape)} must match")
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be (batch, response_len), got {loss_mat.dim()} dims")
    valid = mask.to(torch.bool)
    selected = torch.where(valid, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    sums = selected.sum(dim=-1, dtype=_count_dtype(loss_mat))  # half-precision losses are summed in float32
    return reduce(sums, mask, global_tokens, global_seqs, norm_length, loss_mat)
