"""A lean one-token forward for Llama-family decoders: preallocated KV buffers, no per-token framework work.

On tiny models the per-token cost of a transformers forward is mostly Python:
building the causal mask, growing the ``DynamicCache`` by concatenation, the
rotary table, output records and decorators (the issue that asked for this path
measured ~6 of 16 ms of a rollout as arithmetic). :class:`LeanStepper` runs the
same arithmetic on the model's own weights and submodules with none of that:

- the prompts go through the same layer code once (the prefill, causal attention
  over each row's valid tokens), whose keys/values are written, repeated ``n``
  times, into one preallocated buffer per layer of shape ``(B, kv_heads, P + R, head_dim)``;
- the rotary ``cos/sin`` of every position a row will reach are computed once,
  by the model's own rotary module (element-wise, so the same numbers as one
  position at a time);
- the attention mask is one preallocated bool buffer ``(B, P + R)``; step ``t``
  writes column ``P + t`` and attends to the first ``P + t + 1`` columns;
- each layer: the model's ``input_layernorm`` (RMSNorm, the same operations inlined;
  no float32 casts when the model runs in float32), ``q/k/v_proj`` side by side into one output
  (:func:`side_by_side`: one matmul on their concatenated weights when they are small, else each
  writing its columns, with no copy), the Llama rotary embedding on q and k together, a write into
  the buffers, scaled dot-product attention over them (grouped-query heads shared,
  ``scale = head_dim^-0.5`` as the module has it; a step's on the CPU by two batched matmuls,
  :meth:`LeanStepper._attend`, its mask made additive once a step for all layers), ``o_proj``, residual,
  ``post_attention_layernorm``, the gated MLP with ``gate/up_proj`` side by side (or as two
  products, :func:`_mlp`), residual;
  then the model's final ``norm`` and ``lm_head``. Each product whose weight holds at least
  :data:`PACK_MIN` elements runs on a copy oneDNN reordered into its blocked layout (:func:`product`;
  faster than MKL at every row count measured here, most at the few rows of a decode's last steps).
  The concatenated and reordered weights are built when a stepper is made (once per decode call), so
  every call decodes with the weights the model has then; the others are read in place.

Rows that have ended (EOS, or finished before the call) are dropped from the batch
(:class:`LeanStepper` ``step``): once at least a sixteenth of the rows it still computes have
ended, it keeps only the rows still going (their KV buffers, mask and rotary rows copied
together) and scatters their logits back into a ``(B, V)`` buffer in the original row order,
where ended rows keep their last logits (finite; decode masks their tokens to padding). The
sampler still draws for all ``B`` rows in one call on the same generator, so every row
receives the random numbers it received before (``torch.multinomial`` draws one
exponential per entry of the ``(B, V)`` table, whatever the entries are). It never computes
fewer than :data:`ROW_BLOCK` rows nor a number of rows that is not a multiple of it (ended ones
fill up), and leaves a batch of a size :func:`_row_invariant` rejects as it is: the matmuls then
give each row its numbers to the bit whatever the other rows (see :data:`ROW_BLOCK`). It is done
on the CPU only, where that was measured: on a GPU, whose BLAS picks kernels by shape, a
one-token step's time hardly depends on the rows (it is bound by reading the weights).

So the numbers are the model's up to float summation order (the reference test
compares tokens and log-probs with the transformers loop). Models it does not
cover (other architectures, sliding-window layers, logit scaling, forward hooks) make :func:`lean_stepper` return None and the caller uses the
transformers loop.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from .decode_tape import DecodeTape, new_tape
from .lean_support import LEAN_MODEL_TYPES, supports_lean, supports_lean_backbone
from .sequence import position_ids_from_mask

__all__ = ["JOIN_LIMIT", "LEAN_MODEL_TYPES", "PACK_MIN", "ROW_BLOCK", "LeanStepper", "dense", "lean_stepper",
           "joined_weights", "linear_into", "product", "rms_norm", "rotary_tables", "rotate", "side_by_side", "supports_lean",
           "supports_lean_backbone"]

ROW_BLOCK = 4
"""A compacted step computes a multiple of this many rows. Measured on this project's CPU (torch 2.13,
MKL, AVX-512), ``F.linear`` of ``m`` rows gives each row the numbers it gets in any other such matmul,
to the bit, when ``m`` is a multiple of 4 or at least 12 (1 to 8 threads); with 1-3 rows, and with 2
or 8 threads also 5-7 and 9-11, another kernel differs in the last bits. (oneDNN on a reordered weight,
:func:`product`, gave each row its numbers at every ``m`` from 2 to 64 measured, 1 to 8 threads; one row
differed at 3072 inputs.) tests/runtime/engines/
test_lean_decode.py checks compaction on against off to the bit, at one thread: on an AVX2 CPU (AMD EPYC, Zen 2) at
two threads a compacted sampled decode's log-probs differed from the uncompacted ones in the last bits."""

_INVARIANT_ROWS = 12
"""From this many rows, any number of rows is row-invariant (:data:`ROW_BLOCK`)."""

COMPACT_FRACTION = 0.0625
"""Compact when at least this share of the rows a step computes have ended: each compaction copies the
remaining rows' KV buffers once (in place, into the buffers' first rows), so the copies cost a bounded multiple
of one buffer per call. Measured on the ~8M bench model's decode (8 x 8 rows, 64 new tokens, responses averaging
31; AVX2 CPU, one thread, three alternating rounds): a quarter computed 2273 rows a call over its steps, a
sixteenth 2069 and was ~2.5% faster a call; below that the rows fed hardly fell (2069 at 1%)."""

JOIN_LIMIT = 1 << 20
"""Linear layers run side by side (q/k/v, gate/up) whose weights hold at most this many elements together are
joined into one copy per decode call, one matmul a step (:func:`side_by_side`); larger ones write their columns
of one output each (:func:`linear_into`: the same dot products) without copying the weights: on the ~100M
bench model the copies were 272 MB a decode call. Measured on this project's CPU, one thread: on the ~8M model's
q/k/v (256 -> 512, 64 rows) the joined copy is 10% faster a call than three matmuls, on the ~100M model's
gate/up (768 -> 6144, 16 rows) the slices are 3% faster than the copy and its matmul. Where oneDNN reorders
weights (:data:`PACK_MIN`), a gated MLP's gate and up too large to join run as two products on reordered
copies instead (:func:`_mlp`; a copy of those weights per decode call again, ~20 MB more peak RSS on the ~100M
bench model's run, for a step 5-6% shorter)."""

PACK_MIN = 1 << 17
"""A decode product whose weight holds at least this many elements runs on a copy of the weight that oneDNN
reordered once per decode call into its own blocked layout (:func:`product`); smaller ones (the ~8M model's
``o_proj`` and ``lm_head``) stay with ``F.linear``. Measured on this project's CPU (AMD EPYC, AVX-512, one
thread, torch 2.13): against ``F.linear`` (MKL), the reordered weight is 8-16% faster a call at 64 rows
(q/k/v 256 -> 512, gate/up 256 -> 2048, down 1024 -> 256) and 35-45% faster at 4-8 rows, where a decode spends
its last steps; on 256 -> 256 it is even at 64 rows and slower at 8, on 256 -> 25 slower at any rows."""

class LeanStepper:
    """Prefill and one-token forward of a decode loop on preallocated buffers (see the module docstring).

    Args:
        model: a causal LM for which :func:`supports_lean` holds.
        prompt_ids, prompt_mask: ``(b, P)`` left-padded prompts.
        n: decoded rows per prompt (``B = b * n`` rows in ``repeat_interleave`` order).
        steps: the most tokens each row will be fed after the prompt (``max_new_tokens - 1``).
        compact: drop ended rows from the batch (module docstring; CPU only); False computes every row at every step.
        tape: where each step's products are written (:mod:`.decode_tape`), or None.

    :attr:`logits` ``(B, V)``: the prefill's logits at each row's last prompt position.
    :attr:`row_steps`: rows fed through the layers so far, summed over steps (the prefill not counted).
    """

    def __init__(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, steps: int,
                 compact: bool = True, tape: DecodeTape | None = None):
        backbone = model.model
        self.layers = backbone.layers
        self.embed = backbone.embed_tokens.weight
        attention = self.layers[0].self_attn
        self.head_dim, self.scaling = attention.head_dim, attention.scaling
        config = attention.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.gqa = self.heads != self.kv_heads
        # the weights are read (and the small joined ones concatenated) here, once per decode call: a call
        # made after an optimizer step sees the new weights
        rows = prompt_ids.shape[0] * n
        self.plan = [(_norm(layer.input_layernorm),
                      side_by_side(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, rows=rows),
                      product(layer.self_attn.o_proj, rows), _norm(layer.post_attention_layernorm),
                      _mlp(layer.mlp, rows))
                     for layer in self.layers]
        self.final_norm, self.lm_head = _norm(backbone.norm), product(model.lm_head, rows)
        weight = self.embed
        self.cast = weight.dtype != torch.float32  # RMSNorm computes in float32: no casts when the model runs in it
        self.norm = partial(rms_norm, cast=True) if self.cast else fused_rms_norm
        # a step's attention by two batched matmuls (:meth:`_attend`) where that was measured: float32 on the CPU
        self.small_attention = weight.device.type == "cpu" and not self.cast

        mask = prompt_mask.bool()
        b, p = mask.shape
        rows = torch.arange(b, device=mask.device).repeat_interleave(n)
        self.prompt_len, total = p, p + steps
        self.valid = torch.zeros((b * n, total), dtype=torch.bool, device=mask.device)
        self.valid[:, :p] = mask[rows]
        shape = (b * n, self.kv_heads, total, self.head_dim)
        self.keys = [weight.new_empty(shape) for _ in self.layers]
        self.values = [weight.new_empty(shape) for _ in self.layers]
        prompt_positions = position_ids_from_mask(mask)
        later = prompt_positions[:, -1:] + 1 + torch.arange(max(steps, 1), device=mask.device)
        # one call for the prompt's positions and the decoded ones (element-wise: the same numbers)
        cos, sin = rotary_tables(*backbone.rotary_emb(self.embed[:1, None].expand(b, -1, -1),
                                                       torch.cat([prompt_positions, later], dim=-1)))
        prompt_cos, prompt_sin = cos[:, :, :p], sin[:, :, :p]
        self.cos, self.sin = cos[rows, :, p:], sin[rows, :, p:]
        # Prefill: a query attends to the valid keys up to itself; a padding query (nothing valid
        # before it) to every key up to itself, so that its state stays finite. No later query
        # attends to a padding key, so what padding positions hold changes nothing.
        causal = torch.ones((p, p), dtype=torch.bool, device=mask.device).tril()
        allowed = causal & (mask[:, None, :] | ~mask[:, :, None])
        self.logits = self._forward(prompt_ids.long(), allowed[:, None], prompt_cos, prompt_sin, 0, p, rows)[rows]
        self.compact = compact and weight.device.type == "cpu" and _row_invariant(b * n)
        self.tape = tape
        self.row_steps = 0
        self.rows: torch.Tensor | None = None  # original row of each buffer row once compacted; None: all, in order
        self.out = self.logits  # (B, V): the logits last returned, every row's (written in place once compacted)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                 stop: int, rows: torch.Tensor | None) -> torch.Tensor:
        """Positions ``start:stop`` of every row through the layers -> the last position's logits ``(b, V)``.

        ``rows`` (prefill): the buffer rows each input row's keys/values are copied to; None: row for row.
        """
        h = F.embedding(ids, self.embed)
        b, q_len, d = h.shape[0], h.shape[1], self.head_dim
        heads, rotated = self.heads, self.heads + self.kv_heads
        norm = self.norm
        tape, put = self.tape if rows is None else None, None
        first = None if tape is None else tape.begin(start - self.prompt_len, self.rows, b)  # a step: its tape rows
        for index, ((norm1, qkv_proj, o_proj, norm2, mlp), kb, vb) in enumerate(zip(self.plan, self.keys, self.values)):
            if tape is not None:
                put = partial(tape.write, index, first)
            qkv = qkv_proj(norm(h, *norm1))
            if put is not None:
                put("qkv", qkv, 0)
            # (b, heads + 2 kv_heads, q_len, d); one query position: a view alone
            qkv = qkv.view(b, -1, 1, d) if q_len == 1 else qkv.view(b, q_len, -1, d).transpose(1, 2)
            qk = rotate(qkv[:, :rotated], cos, sin)  # q and k in one go: the same element-wise arithmetic
            q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, rotated:]
            if rows is None:
                kb[:, :, start:stop] = k
                vb[:, :, start:stop] = v
                keys, values = kb[:, :, :stop], vb[:, :, :stop]
            else:
                kb[:, :, start:stop] = k[rows]
                vb[:, :, start:stop] = v[rows]
                keys, values = k, v
            if rows is None and self.small_attention:  # one query position a row, on the CPU
                out = self._attend(q, keys, values, mask)
            else:
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling,
                                                     enable_gqa=self.gqa)
            attended = o_proj(out.view(b, 1, -1) if q_len == 1 else out.transpose(1, 2).reshape(b, q_len, -1))
            if put is not None:
                put("o", attended, 0)
            h = h + attended
            h = h + mlp(norm(h, *norm2), put)
        return self.lm_head(norm(h[:, -1], *self.final_norm))

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """A step's attention ``softmax(q k^T * scale + bias) v`` as two batched matmuls: q ``(b, heads, 1, d)``,
        keys and values ``(b, kv_heads, S, d)``, ``bias`` ``(b, 1, 1, S)`` (0 or -inf) -> ``(b, heads, 1, d)``.

        The queries of the heads sharing a key/value head go together (``(group, d) @ (d, S)`` per row and kv head),
        as ``enable_gqa`` pairs them. Each row's numbers come from its own matrices of the batch, so they do not
        depend on the other rows (the compaction test compares to the bit). Measured on this project's AVX2 CPU
        (one thread, the ~8M bench model's shapes: 8 heads, 4 kv heads, d = 32): 10-44% faster than
        ``F.scaled_dot_product_attention``'s CPU flash kernel with a boolean mask at 28-64 rows and 12-40 keys,
        even at 12 rows and 70 keys; 2-3.5% of a decode call (8 x 8 rows, 64 new tokens)."""
        b = q.shape[0]
        scores = torch.matmul(q.view(b, self.kv_heads, self.heads // self.kv_heads, self.head_dim),
                              keys.transpose(-1, -2))
        probs = torch.add(bias, scores, alpha=self.scaling).softmax(-1)
        return torch.matmul(probs, values).view(b, self.heads, 1, self.head_dim)

    def step(self, t: int, token: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
        """Feed ``token`` ``(B,)`` as step ``t``'s input (``alive``: rows attended from now on) -> logits ``(B, V)``.

        Rows ended before this step may be dropped first (module docstring); their logits then stay those of
        their last computed step. Once rows were dropped, the returned tensor is one buffer, rewritten by the next step.
        """
        if self.compact:
            self._drop_ended(alive, t)
        if self.rows is not None:
            token, alive = token[self.rows], alive[self.rows]
        slot = self.prompt_len + t
        self.valid[:, slot] = alive
        self.row_steps += token.shape[0]
        # the mask as the additive one attention makes of it, once a step for every layer
        bias = self.embed.new_zeros(self.valid.shape[0], 1, 1, slot + 1).masked_fill_(
            ~self.valid[:, None, None, :slot + 1], float("-inf"))
        logits = self._forward(token[:, None], bias, self.cos[:, :, t:t + 1],
                               self.sin[:, :, t:t + 1], slot, slot + 1, None)
        if self.rows is None:
            self.out = logits
            return logits
        return self.out.index_copy_(0, self.rows, logits)

    def _drop_ended(self, alive: torch.Tensor, t: int) -> None:
        """Keep only the buffer rows still going (filled up to a multiple of :data:`ROW_BLOCK` with ended ones)
        once enough have ended to pay the copy."""
        computed = self.valid.shape[0]
        going = alive if self.rows is None else alive[self.rows]
        still = int(going.sum())
        kept = max(ROW_BLOCK, -(-still // ROW_BLOCK) * ROW_BLOCK)
        if kept >= computed or computed - still < COMPACT_FRACTION * computed:
            return
        # going rows first, in their order, then ended ones up to ``kept`` (a stable sort)
        keep = torch.argsort((~going).to(torch.int8), stable=True)[:kept]
        if self.rows is None:
            self.out = self.out.clone()  # every row's last logits (ended rows' stay finite for the sampler)
            self.rows = keep
        else:
            self.rows = self.rows[keep]
        filled = self.prompt_len + t  # the columns written so far; later ones are written before they are read
        for buffers in (self.keys, self.values):
            for i, kb in enumerate(buffers):
                # in place: the gather completes before its rows are written; the first rows of the buffer
                # (memory already mapped, where a new one's first writes would fault its pages in)
                kb[:kept, :, :filled] = kb[keep, :, :filled]
                buffers[i] = kb[:kept]
        self.valid, self.cos, self.sin = self.valid[keep], self.cos[keep], self.sin[keep]


def _row_invariant(rows: int) -> bool:
    """Whether a matmul of ``rows`` rows gives each row the numbers of a compacted one (:data:`ROW_BLOCK`)."""
    return rows % ROW_BLOCK == 0 or rows >= _INVARIANT_ROWS


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, cast: bool = True) -> torch.Tensor:
    """Llama's RMSNorm, the same operations in the same order: ``w * (x / sqrt(mean(x^2) + eps))``, in float32.

    ``cast=False`` (a float32 model): the two casts, which change nothing there, are left out.
    """
    xf = x.to(torch.float32) if cast else x
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (xf.to(x.dtype) if cast else xf)


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`rms_norm` of a float32 model as one call, ``F.rms_norm``: the same operations in the same order
    inside (equal to the bit at the bench models' widths, measured), dispatched once instead of six times."""
    return F.rms_norm(x, weight.shape, weight, eps)


def rotary_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(b, s, d)`` tables -> ``(b, 1, s, d)`` ones for :func:`rotate`, ``sin`` with its first half negated."""
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.unsqueeze(1), signed.unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``.

    ``cat(-x2, x1) * cat(s1, s2)`` is ``cat(x2, x1) * cat(-s1, s2)`` to the bit (a product's sign
    is the product of the signs), and ``cat(x2, x1)`` is ``x.roll(d / 2)``: one op instead of four.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def product(layer: torch.nn.Linear | tuple[torch.Tensor, torch.Tensor | None], rows: int | None = None):
    """``x -> F.linear(x, weight, bias)`` for a decode (no gradient), on a oneDNN-reordered copy of the weight when
    it holds at least :data:`PACK_MIN` elements and oneDNN runs it (a float32 weight on the CPU), else ``F.linear``
    on the weight itself. ``layer``: a ``Linear`` or its ``(weight, bias)``; ``rows``: the rows a call will have
    most (oneDNN's layout hint). The copy is made here, so the product computes with the weight as it is now."""
    weight, bias = (layer.weight, layer.bias) if isinstance(layer, torch.nn.Linear) else layer
    weight, bias = weight.detach(), None if bias is None else bias.detach()
    if weight.numel() >= PACK_MIN and _reorders(weight) and (bias is None or bias.dtype == weight.dtype):
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return lambda x: F.linear(x, weight, bias)


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` as a plain product (for the update's own backward functions): through oneDNN
    when the weight holds at least :data:`PACK_MIN` elements and oneDNN runs it (``weight`` may be a transposed
    view: ``dense(g, w.t())`` is ``g @ w``), else ``F.linear``. Measured on this project's CPU at the ~8M bench
    model's update shapes (~2,000 rows, one thread): 9-12% faster than MKL for ``x w^T`` and ``g w``; a weight's
    gradient ``g^T x`` is left to MKL, which was as fast or faster there."""
    if weight.numel() >= PACK_MIN and _reorders(weight) and x.dtype == weight.dtype and (
            bias is None or bias.dtype == weight.dtype):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _reorders(weight: torch.Tensor) -> bool:
    """Whether this torch build runs a float32 CPU product on a oneDNN-reordered copy of ``weight``."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and all(hasattr(torch.ops.mkldnn, op) for op in ("_reorder_linear_weight", "_linear_pointwise")))


def joined_weights(*layers: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One ``(weight, bias)`` for ``layers`` side by side (no gradient): one matmul gives each layer's outputs.

    Each output element is still one row of one layer's weight times the input, so the joined
    matmul gives the separate ones' numbers (the reference tests compare bit for bit).
    """
    weight = torch.cat([layer.weight.detach() for layer in layers])
    if all(layer.bias is None for layer in layers):
        return weight, None
    return weight, torch.cat([layer.bias.detach() if layer.bias is not None else weight.new_zeros(layer.out_features)
                              for layer in layers])


def linear_into(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> torch.Tensor:
    """``cat([F.linear(x, w, b) for w, b in zip(weights, biases)], -1)`` with no copy of the weights or the outputs.

    Each layer's matmul writes its block of columns of one ``(..., sum of out_features)`` output in place
    (BLAS writes a column block of a row-major matrix through its leading dimension). Each output element
    is the same dot product as in the joined matmul: at the bench models' widths (256 and 768 in, 128 and
    more out) this CPU's BLAS gives the joined matmul's numbers to the bit; a matmul a few columns wide
    may take another kernel and differ in the last bits (measured at 16 in, 8 out). No gradient.
    """
    flat = x.reshape(-1, x.shape[-1])
    out = flat.new_empty(flat.shape[0], sum(w.shape[0] for w in weights))
    column = 0
    for weight, bias in zip(weights, biases):
        block = out[:, column:column + weight.shape[0]]
        if bias is None:
            torch.mm(flat, weight.t(), out=block)
        else:
            torch.addmm(bias, flat, weight.t(), out=block)
        column += weight.shape[0]
    return out.view(*x.shape[:-1], column)


def side_by_side(*layers: torch.nn.Linear, rows: int | None = None):
    """``x -> cat([layer(x) for layer in layers], -1)`` without gradient: one :func:`product` on
    :func:`joined_weights` when the layers hold at most :data:`JOIN_LIMIT` weights together, else
    :func:`linear_into` (no copy). ``rows``: as for :func:`product`."""
    if sum(layer.weight.numel() for layer in layers) <= JOIN_LIMIT:
        return product(joined_weights(*layers), rows)
    weights = [layer.weight.detach() for layer in layers]
    biases = [None if layer.bias is None else layer.bias.detach() for layer in layers]
    return lambda x: linear_into(x, weights, biases)


def _norm(module: torch.nn.Module) -> tuple[torch.Tensor, float]:
    return module.weight, float(module.variance_epsilon)


def _mlp(module: torch.nn.Module, rows: int | None = None):
    """The gated MLP ``down(act(gate(x)) * up(x))`` on the module's weights (SiLU inlined; gate and up as one
    matmul, or, when oneDNN reorders weights too large to join, as two products on reordered copies: faster
    than :func:`linear_into` on MKL, ~2x on the ~100M bench model's decode products), or the module itself.

    The callable takes ``(x, put=None)``; ``put(name, out, start)`` receives the ``"gate_up"`` output (or its
    ``gate`` and ``up`` column blocks from ``start``) and the ``"down"`` one (a decode's tape, :mod:`.decode_tape`)."""
    gate, up, down = (getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
    if not all(isinstance(layer, torch.nn.Linear) for layer in (gate, up, down)):
        return lambda x, put=None: module(x)
    act = F.silu if type(getattr(module, "act_fn", None)).__name__ == "SiLUActivation" else module.act_fn
    down_product, width = product(down, rows), gate.out_features
    if gate.weight.numel() + up.weight.numel() > JOIN_LIMIT and gate.weight.numel() >= PACK_MIN and _reorders(
            gate.weight):
        gate_product, up_product = product(gate, rows), product(up, rows)

        def two_products(x: torch.Tensor, put=None) -> torch.Tensor:
            gated, upped = gate_product(x), up_product(x)
            out = down_product(act(gated) * upped)
            if put is not None:
                put("gate_up", gated, 0), put("gate_up", upped, width), put("down", out, 0)
            return out

        return two_products
    gate_up = side_by_side(gate, up, rows=rows)

    def mlp(x: torch.Tensor, put=None) -> torch.Tensor:
        both = gate_up(x)
        out = down_product(act(both[..., :width]) * both[..., width:])
        if put is not None:
            put("gate_up", both, 0), put("down", out, 0)
        return out

    return mlp


def lean_stepper(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int,
                 steps: int, compact: bool = True, record: bool = False) -> LeanStepper | None:
    """A :class:`LeanStepper` (prefill done) when the model is one this path drives, else None.

    ``record``: write each step's products into a :class:`~.decode_tape.DecodeTape` where one applies
    (:func:`~.decode_tape.new_tape`), which the caller seals when the decode is done."""
    if not supports_lean(model):
        return None
    tape = new_tape(model, prompt_ids.shape[0] * n, steps) if record else None
    return LeanStepper(model, prompt_ids, prompt_mask, n, steps, compact, tape)
