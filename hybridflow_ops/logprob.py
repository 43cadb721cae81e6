"""Log-probabilities (and entropy) of chosen tokens, computed in row chunks.

The naive ``log_softmax(h @ W.T).gather(-1, ids)`` materialises the logits and
their log-softmax, each ``(b*t, v)`` floats: 1 GB apiece in float32 for 8k
tokens and a 32k vocabulary, and autograd keeps one of them alive until
backward. The functions here never hold more than one or two ``(chunk_size, v)``
buffers at once. Both are custom autograd functions that save only what already
exists (the inputs) plus a ``(b*t,)`` log-sum-exp per row (and the entropy when
asked for), and rebuild each chunk's softmax in backward.

Formulas, for one row with logits ``z`` (already divided by the temperature
``T``), ``lse = log sum_j exp(z_j)``, ``p = softmax(z)`` and chosen token ``y``::

    log_prob = z_y - lse
    entropy  = -sum_j p_j log p_j = lse - sum_j p_j z_j
    d log_prob / d z_j = onehot(y)_j - p_j
    d entropy  / d z_j = -p_j (log p_j + entropy)

(for the entropy: ``d lse/dz_j = p_j`` and ``d(sum_k p_k z_k)/dz_j = p_j + p_j
(z_j - sum_k p_k z_k)``; subtract, and note ``z_j - sum_k p_k z_k = log p_j +
entropy``). With upstream gradients ``g`` (of log_prob) and ``g_H`` (of entropy)
a chunk's logit gradient is ``grad_z = g (onehot - p) - g_H p (log p + entropy)``,
and through ``z = (h W^T + b) / T``: ``grad_h = grad_z W / T``,
``grad_W = sum_chunks grad_z^T h / T``, ``grad_b = sum_rows grad_z / T``.

Every chunk is computed in float32 (float64 inputs stay float64, so
``torch.autograd.gradcheck`` applies), whatever the input dtype; results are
float32, and gradients come back in the dtype of the input they belong to.
Logits of ``-inf`` (masked vocabulary entries) get probability 0 and add 0 to
the entropy. These are engine-level ops used by the actor and reference
workers, so they are not registered as graph ops.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

__all__ = ["TokenLogProbs", "token_logprobs_from_logits", "token_logprobs_from_hidden", "DEFAULT_CHUNK_SIZE"]

DEFAULT_CHUNK_SIZE = 1024
"""Rows per chunk: 1024 rows x 32k vocab x 4 B = 128 MB of float32 logits per chunk."""


class TokenLogProbs(NamedTuple):
    log_probs: torch.Tensor
    """``(b, t)`` float32: log-probability of each chosen token."""
    entropy: torch.Tensor | None
    """``(b, t)`` float32 entropy of each position's distribution, or None when not requested."""


# ---------------------------------------------------------------- per-chunk math (shared)

def _chunk_forward(z: torch.Tensor, ids: torch.Tensor, scratch: torch.Tensor | None):
    """Log-sum-exp, chosen-token log-prob and entropy (None without ``scratch``) of the rows of ``z``.

    ``z`` ``(c, v)`` is overwritten; ``scratch`` is a ``(c, v)`` buffer, needed for the entropy only.
    Uses ``lse = m + log S`` and ``entropy = log S - sum_j e_j (z_j - m) / S`` with
    ``m = max_j z_j``, ``e_j = exp(z_j - m)``, ``S = sum_j e_j``.
    """
    chosen = z.gather(1, ids[:, None]).squeeze(1)
    m = z.amax(dim=1, keepdim=True)
    shifted = z.sub_(m)
    if scratch is None:
        lse = m.squeeze(1) + shifted.exp_().sum(dim=1).log_()
        return lse, chosen - lse, None
    shifted.clamp_(min=torch.finfo(z.dtype).min)  # -inf -> finite, so that 0 * shifted = 0
    e = torch.exp(shifted, out=scratch)
    total = e.sum(dim=1)
    log_s = total.log()
    lse = m.squeeze(1) + log_s
    entropy = log_s - e.mul_(shifted).sum(dim=1) / total
    return lse, chosen - lse, entropy


def _chunk_grad_logits(log_p, ids, entropy, grad_lp, grad_ent, scratch) -> torch.Tensor:
    """``grad_z = g (onehot - p) - g_H p (log p + H)`` for the rows of ``log_p = z - lse`` ``(c, v)``.

    ``entropy``, ``grad_lp`` (``g``), ``grad_ent`` (``g_H``) are ``(c,)``; a gradient is None when
    that output got none. ``log_p`` and ``scratch`` (``(c, v)``, used only with ``g_H``) are
    overwritten; the result lives in one of them.
    """
    if grad_ent is None:
        grad = log_p.exp_().mul_(-grad_lp[:, None])
    else:
        log_p.clamp_(min=torch.finfo(log_p.dtype).min)
        p = torch.exp(log_p, out=scratch)
        grad = log_p.add_(entropy[:, None]).mul_(p).mul_(-grad_ent[:, None])  # p = 0 -> 0
        if grad_lp is not None:
            grad.addcmul_(p, grad_lp[:, None], value=-1.0)
    if grad_lp is not None:
        grad.scatter_add_(1, ids[:, None], grad_lp[:, None])
    return grad


def _workspace(rows: int, vocab: int, dtype: torch.dtype, device, with_entropy: bool):
    """The ``(rows, v)`` chunk buffer, and a second one when the entropy needs it."""
    buf = torch.empty(rows, vocab, dtype=dtype, device=device)
    return buf, (torch.empty_like(buf) if with_entropy else None)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half/bfloat16/float32 inputs, float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _scaled(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """``z / temperature`` in place (no pass over ``z`` when the temperature is 1)."""
    return z if temperature == 1.0 else z.div_(temperature)


def _chunks(n: int, chunk_size: int):
    for start in range(0, n, chunk_size):
        yield start, min(start + chunk_size, n)


# ---------------------------------------------------------------- from logits

class _LogitsLogProbs(torch.autograd.Function):
    """Chunked log-softmax + gather over given logits ``(n, v)``; see the module docstring."""

    @staticmethod
    def forward(ctx, logits, ids, chunk_size: int, with_entropy: bool, temperature: float):
        n, vocab = logits.shape
        cdt = _compute_dtype(logits.dtype)
        buf, scratch = _workspace(min(chunk_size, n), vocab, cdt, logits.device, with_entropy)
        lse, log_probs = (torch.empty(n, dtype=cdt, device=logits.device) for _ in range(2))
        entropy = torch.empty(n, dtype=cdt, device=logits.device) if with_entropy else None
        for s, e in _chunks(n, chunk_size):
            z = _scaled(buf[: e - s].copy_(logits[s:e]), temperature)
            lse[s:e], log_probs[s:e], ent = _chunk_forward(z, ids[s:e], None if scratch is None else scratch[: e - s])
            if with_entropy:
                entropy[s:e] = ent
        ctx.save_for_backward(logits, ids, lse, entropy)
        ctx.chunk_size, ctx.temperature = chunk_size, temperature
        ctx.set_materialize_grads(False)
        return (log_probs, entropy) if with_entropy else log_probs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_lp, grad_ent=None):
        logits, ids, lse, entropy = ctx.saved_tensors
        if grad_lp is None and grad_ent is None:
            return None, None, None, None, None
        n, vocab = logits.shape
        temp, cdt = ctx.temperature, lse.dtype
        buf, scratch = _workspace(min(ctx.chunk_size, n), vocab, cdt, logits.device, grad_ent is not None)
        grad_logits = torch.empty_like(logits)
        for s, e in _chunks(n, ctx.chunk_size):
            log_p = _scaled(buf[: e - s].copy_(logits[s:e]), temp).sub_(lse[s:e, None])
            g = _chunk_grad_logits(log_p, ids[s:e], None if entropy is None else entropy[s:e],
                                   None if grad_lp is None else grad_lp[s:e].to(cdt),
                                   None if grad_ent is None else grad_ent[s:e].to(cdt),
                                   None if scratch is None else scratch[: e - s])
            grad_logits[s:e] = _scaled(g, temp)
        return grad_logits, None, None, None, None


def token_logprobs_from_logits(logits: torch.Tensor, token_ids: torch.Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                               with_entropy: bool = False, temperature: float = 1.0) -> TokenLogProbs:
    """Log-probability of each chosen token, from logits, ``chunk_size`` rows at a time.

    ``log_prob[b, t] = z[b, t, y] - logsumexp_j z[b, t, j]`` with ``z = logits / temperature``
    and ``y = token_ids[b, t]``; ``entropy[b, t] = -sum_j p_j log p_j`` (the policy entropy
    of PPO's entropy bonus, Schulman et al. 2017, eq. 9).

    Shapes: logits ``(b, t, v)`` (any float dtype, e.g. bfloat16), token_ids ``(b, t)``
    -> log_probs ``(b, t)`` float32, entropy ``(b, t)`` float32 or None.

    Each chunk is upcast to float32 in a reused ``(chunk_size, v)`` buffer, so no full
    float32 copy of the logits or of their log-softmax exists; backward writes the
    ``(b, t, v)`` gradient (in the logits' dtype) chunk by chunk. Gradients flow to ``logits``.
    """
    _check_chunk_and_temperature(chunk_size, temperature)
    if logits.dim() != 3:
        raise ValueError(f"logits must be (b, t, v), got shape {tuple(logits.shape)}")
    b, t, v = logits.shape
    ids = _flat_ids(token_ids, logits.shape[:2], v)
    out = _LogitsLogProbs.apply(logits.reshape(b * t, v), ids, chunk_size, with_entropy, float(temperature))
    return _to_result(out, with_entropy, b, t)


# ---------------------------------------------------------------- fused lm_head

class _HiddenLogProbs(torch.autograd.Function):
    """Fused ``z = (h W^T + b) / T``, log-softmax and gather, chunk by chunk; see the module docstring."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, chunk_size: int, with_entropy: bool, temperature: float):
        n, vocab = hidden.shape[0], weight.shape[0]
        cdt = _compute_dtype(torch.promote_types(hidden.dtype, weight.dtype))
        w, b = weight.to(cdt), None if bias is None else bias.to(cdt)
        buf, scratch = _workspace(min(chunk_size, n), vocab, cdt, hidden.device, with_entropy)
        lse, log_probs = (torch.empty(n, dtype=cdt, device=hidden.device) for _ in range(2))
        entropy = torch.empty(n, dtype=cdt, device=hidden.device) if with_entropy else None
        for s, e in _chunks(n, chunk_size):
            z = _scaled(_lm_head(hidden[s:e].to(cdt), w, b, out=buf[: e - s]), temperature)
            lse[s:e], log_probs[s:e], ent = _chunk_forward(z, ids[s:e], None if scratch is None else scratch[: e - s])
            if with_entropy:
                entropy[s:e] = ent
        ctx.save_for_backward(hidden, weight, bias, ids, lse, entropy)
        ctx.chunk_size, ctx.temperature = chunk_size, temperature
        ctx.set_materialize_grads(False)
        return (log_probs, entropy) if with_entropy else log_probs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_lp, grad_ent=None):
        hidden, weight, bias, ids, lse, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if grad_lp is None and grad_ent is None:
            return None, None, None, None, None, None, None
        n, vocab, temp, cdt = hidden.shape[0], weight.shape[0], ctx.temperature, lse.dtype
        w, b = weight.to(cdt), None if bias is None else bias.to(cdt)
        buf, scratch = _workspace(min(ctx.chunk_size, n), vocab, cdt, hidden.device, grad_ent is not None)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
        grad_b = torch.zeros(vocab, dtype=cdt, device=weight.device) if need_b else None
        for s, e in _chunks(n, ctx.chunk_size):
            h = hidden[s:e].to(cdt)
            log_p = _log_softmax_rows(h, w, b, lse[s:e], temp, out=buf[: e - s])
            g = _chunk_grad_logits(log_p, ids[s:e], None if entropy is None else entropy[s:e],
                                   None if grad_lp is None else grad_lp[s:e].to(cdt),
                                   None if grad_ent is None else grad_ent[s:e].to(cdt),
                                   None if scratch is None else scratch[: e - s])
            if need_h:
                grad_h[s:e] = _scaled(torch.mm(g, w), temp)
            if need_w:
                grad_w.addmm_(g.t(), h, alpha=1.0 / temp)
            if need_b:
                grad_b.add_(g.sum(dim=0), alpha=1.0 / temp)
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def _lm_head(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, *, out: torch.Tensor) -> torch.Tensor:
    """``h W^T (+ b)`` ``(c, v)`` written into ``out``."""
    return torch.mm(h, w.t(), out=out) if b is None else torch.addmm(b, h, w.t(), out=out)


def _log_softmax_rows(h, w, b, lse, temperature: float, *, out: torch.Tensor) -> torch.Tensor:
    """``log p = (h W^T + b) / T - lse`` ``(c, v)`` written into ``out`` (one ``addmm`` when there is no bias)."""
    if b is None:
        return torch.addmm(lse[:, None], h, w.t(), beta=-1.0, alpha=1.0 / temperature, out=out)
    return _scaled(_lm_head(h, w, b, out=out), temperature).sub_(lse[:, None])


def token_logprobs_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor, *,
                               bias: torch.Tensor | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
                               with_entropy: bool = False, temperature: float = 1.0) -> TokenLogProbs:
    """Fused lm_head + log-softmax + gather: log-probs of chosen tokens straight from hidden states.

    ``z = (hidden @ weight^T + bias) / temperature``; ``log_prob = z_y - logsumexp(z)`` and
    ``entropy = -sum_j p_j log p_j`` per position, equal to
    ``log_softmax(lm_head(hidden) / T).gather(-1, token_ids)`` without ever holding the
    ``(b, t, v)`` logits: forward keeps one ``(chunk_size, v)`` float32 buffer (two with the
    entropy) and saves a per-row log-sum-exp; backward recomputes each chunk's logits, forms
    ``grad_z = g (onehot - p) - g_H p (log p + H)`` and accumulates ``grad_h`` (chunk rows),
    ``grad_W`` and ``grad_b`` (sums over chunks). Peak extra memory is O(chunk_size * v)
    rather than O(b * t * v), at the price of one more ``(b*t, h) x (h, v)`` matmul in backward.

    Shapes: hidden ``(b, t, h)``, weight ``(v, h)``, bias ``(v,)`` or None, token_ids ``(b, t)``
    -> log_probs ``(b, t)`` float32, entropy ``(b, t)`` float32 or None.
    float32 and bfloat16 inputs are computed in float32 per chunk (float64 in float64).
    """
    _check_chunk_and_temperature(chunk_size, temperature)
    if hidden.dim() != 3 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden must be (b, t, h) and weight (v, h) with the same h, got shapes "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must be (v,) = ({weight.shape[0]},), got shape {tuple(bias.shape)}")
    b, t, h = hidden.shape
    ids = _flat_ids(token_ids, hidden.shape[:2], weight.shape[0])
    out = _HiddenLogProbs.apply(hidden.reshape(b * t, h), weight, bias, ids, chunk_size, with_entropy,
                                float(temperature))
    return _to_result(out, with_entropy, b, t)


# ---------------------------------------------------------------- argument checks and result

def _flat_ids(token_ids: torch.Tensor, lead_shape: torch.Size, vocab: int) -> torch.Tensor:
    """``token_ids`` ``(b, t)`` flattened to ``(b*t,)`` int64, after checking shape, dtype and range."""
    if token_ids.shape != lead_shape:
        raise ValueError(f"token_ids of shape {tuple(token_ids.shape)} must match the (b, t) = {tuple(lead_shape)} "
                         "of the logits / hidden states")
    if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    ids = token_ids.reshape(-1).to(torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"token_ids must lie in [0, {vocab}) (the vocabulary size), "
                         f"got values in [{int(ids.min())}, {int(ids.max())}]")
    return ids


def _check_chunk_and_temperature(chunk_size: int, temperature: float) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (rows per chunk), got {chunk_size!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (it divides the logits), got {temperature}")


def _to_result(out, with_entropy: bool, b: int, t: int) -> TokenLogProbs:
    log_probs, entropy = out if with_entropy else (out, None)
    return TokenLogProbs(log_probs.reshape(b, t), None if entropy is None else entropy.reshape(b, t))
