"""The train engine's forward for Llama-family models without transformers' per-call framework work.

On small models a training step's forward and backward cost is mostly per-op and Python work,
not arithmetic: a transformers backbone call builds its causal mask (``create_causal_mask``),
runs output-capturing and deprecation decorators, a ``DynamicCache`` and the attention
interface's dispatch for every layer. :func:`lean_hidden` is one backbone call (optionally on top
of cached keys/values) computed on the model's own parameters, with gradients, by the operations
:mod:`.lean_decode` drives; :func:`~.sequence.response_hidden` (joined rows) and
:func:`~.shared_prompt.shared_response_hidden` (each distinct prompt once, :func:`lean_shared_hidden`)
use it where it applies:

- the model's ``embed_tokens`` (:func:`embedding`; its ``padding_idx`` keeps the padding row's gradient 0),
- per layer: RMSNorm inlined, ``q/k/v_proj`` side by side into one output (:func:`joined_linear`: one
  matmul on their joined weights when they are small, each writing its columns when large; each
  projection's gradient is its block of the joint one, and no joined copy is kept for the backward),
  the Llama rotary embedding on q and k together, scaled dot-product attention under one bool
  mask built once per call, ``o_proj``, residual, RMSNorm, the gated MLP with ``gate/up_proj``
  as one matmul, residual; then the final norm.

The attention mask is the model's: a query attends to the valid keys up to itself (a padding
position after a response's end too, so its state is the model's as well); a query with no valid
key up to it (a left-padded prompt's padding, whose state no other position reads) attends to
every key up to itself, so that its state stays finite. So the states and every gradient are the
model's up to float summation order. With gradients on (an update, whose losses read no padding
state) the projections, MLPs and norms of a call run on its valid positions alone, packed
(``valid_only``), attention in groups of rows of like widths, each on a zero-padded copy of its
rows' q/k/v at its own width (:class:`_AttentionGroups`): on GRPO batches, where responses end
at different lengths, that skips most of the padding's share of the work, the valid states and gradients
unchanged (``tests/runtime/engines/test_lean_forward.py`` compares states and gradients with the
transformers forward). So an update needs no width buckets of micro-batches (:mod:`.micro_batches`):
on the ~8M bench model (AVX2, one thread, 6 GRPO batches of 8 x 8 rows, responses averaging 32 of 64
tokens, two rounds) the updates took 8.56-8.87 CPU s in one micro-batch with grouped attention, 9.04-9.30 in
two buckets, and before the grouping 9.50-9.73 in two buckets (then the fastest count).

It applies where :func:`~.lean_support.supports_lean_backbone` holds (the architectures and
settings the lean decode drives, no hooks), outside autocast (the model's own forward decides the casts
there), with no dropout active, and without gradient checkpointing; elsewhere
:func:`lean_forward_applies` is False and the callers run the model's forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hybridflow.errors import ExecutionError

from .decode_tape import COUNTS, DecodeTape
from .grad_slots import gradient_slot, weight_gradient
from .lean_decode import JOIN_LIMIT, dense, linear_into, side_by_side, rms_norm, rotary_tables, rotate
from .lean_support import supports_lean_backbone
from .sequence import position_ids_from_mask, response_attention
from ..token_partition import cheapest_equal_cut

__all__ = ["embedding", "joined_linear", "lean_forward_applies", "lean_hidden", "lean_shared_hidden"]


def lean_forward_applies(backbone: torch.nn.Module) -> bool:
    """Whether :func:`lean_hidden` computes ``backbone``'s states exactly (see the module docstring)."""
    from .shared_prompt import dropout_active

    embed = getattr(backbone, "embed_tokens", None)
    if embed is None or torch.is_autocast_enabled(embed.weight.device.type):
        return False
    if getattr(backbone, "gradient_checkpointing", False) or dropout_active(backbone):
        return False
    return supports_lean_backbone(backbone)


def lean_shared_hidden(backbone: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       response_ids: torch.Tensor, response_mask: torch.Tensor,
                       groups: tuple[torch.Tensor, torch.Tensor],
                       replay: tuple[DecodeTape, torch.Tensor] | None = None) -> torch.Tensor:
    """:func:`~.shared_prompt.shared_response_hidden`'s states ``(b, R, h)`` by :func:`lean_hidden`.

    Shapes: prompt_ids, prompt_mask ``(b, P)`` left-padded; response_ids, response_mask ``(b, R)``;
    ``groups``: ``(first, inverse)`` of :func:`~.shared_prompt.prompt_groups`. The distinct prompts
    run once; their keys/values are repeated to the rows of each group (``index_select``: the
    copies' gradients add up), and the fed response tokens of every row attend to them. ``replay``: the
    decode's tape and each row's row in it (:func:`~.decode_tape.replay_rows`, with gradients): the response
    positions take its products, and a row's position fed its last response token is left out (its state,
    which no response token's log-prob reads, is 0).
    """
    first, inverse = groups
    unique_mask = prompt_mask[first].long()
    hidden, cache = lean_hidden(backbone, prompt_ids[first].long(), unique_mask, position_ids_from_mask(unique_mask))
    prompt_last = hidden[:, -1:].index_select(0, inverse)
    if response_ids.shape[-1] == 1:
        return prompt_last
    cache = [(k.index_select(0, inverse), v.index_select(0, inverse)) for k, v in cache]
    if replay is None:
        fed = response_attention(response_mask)[:, :-1]
    else:  # the positions whose state predicts a response token: a row's last one is left out (decode_tape)
        lengths = (response_mask > 0).sum(-1, keepdim=True)
        fed = (torch.arange(response_ids.shape[-1] - 1, device=lengths.device) < lengths - 1).long()
    mask = torch.cat([prompt_mask.long(), fed], dim=-1)
    positions = position_ids_from_mask(mask)[:, prompt_ids.shape[-1]:]
    hidden, _ = lean_hidden(backbone, response_ids[:, :-1].long(), mask, positions, cache,
                            valid_only=torch.is_grad_enabled(), replay=replay)
    return torch.cat([prompt_last, hidden], dim=1)


def lean_hidden(backbone: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None, *, valid_only: bool = False,
                replay: tuple[DecodeTape, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A backbone call: ``ids`` ``(b, Q)`` at ``positions`` ``(b, Q)`` after ``cache`` (``K`` positions a layer, or None).

    ``mask`` ``(b, K + Q)``: 1 at valid keys (the cached ones first). Returns the final-normed
    states ``(b, Q, h)`` and each layer's keys and values ``(b, kv_heads, K + Q, head_dim)``.
    ``valid_only``: the projections, MLPs and norms run on the valid positions alone (packed, one
    host sync), which attention reads through a zero-padded copy of q/k/v; the states at padding
    positions are then 0, and their keys and values 0 (no valid query attends to them). For an
    update, whose losses read no padding state: the same valid states and gradients, less work.
    ``replay`` (with ``valid_only``): ``(tape, rows)`` of :func:`~.decode_tape.replay_rows`, whose rows hold
    position ``j`` of each input row at step ``j``: the four products of every layer are taken from it.
    """
    b, q_len = ids.shape
    packed = mask[:, -q_len:].reshape(-1).nonzero().squeeze(-1) if valid_only else None  # (M,) the valid positions
    h = embedding(backbone.embed_tokens, ids if packed is None else ids.reshape(-1).index_select(0, packed))
    attention = backbone.layers[0].self_attn
    d, scaling = attention.head_dim, attention.scaling
    heads, kv_heads = attention.config.num_attention_heads, attention.config.num_key_value_heads
    rotated = heads + kv_heads
    cast = h.dtype != torch.float32
    cos, sin = rotary_tables(*backbone.rotary_emb(h, positions))
    valid = mask.bool()
    past = valid.shape[-1] - q_len
    causal = torch.ones((q_len, past + q_len), dtype=torch.bool, device=ids.device).tril(past)
    allowed = causal & valid[:, None, :]  # (b, Q, K + Q): the valid keys up to each query, as the model's mask
    allowed = (allowed | (causal & ~allowed.any(-1, keepdim=True)))[:, None]  # no valid key at all: every key up to it
    if replay is not None:
        tape, tape_rows = replay
        flat = tape.slots(tape_rows[packed // q_len], packed % q_len)  # each packed position's row in the tape
        if bool((flat < 0).any()):  # a position the decode did not compute (replay_rows rules this out)
            raise ExecutionError("lean_hidden: the decode's tape lacks a position this forward reads; "
                                 "a bug in hybridflow (decode_tape), please report it")
        tape.served += 1
        COUNTS["replayed"] += 1
    layout = None
    if packed is not None:  # attention in groups of rows of like widths, rotary on the packed positions
        layout = _AttentionGroups(mask[:, -q_len:].bool(), packed, allowed, past)
        cos, sin = (t[0, 0, :, None] for t in rotary_tables(*backbone.rotary_emb(h, positions.reshape(1, -1)[:, packed])))
    out_cache = []
    for index, layer in enumerate(backbone.layers):
        # gate/up is read from the tape by the SwiGLU's backward (_SwiGLUDown): the update keeps no copy of it
        taken = {} if replay is None else {name: tape.layers[index][name].index_select(0, flat)
                                           for name in ("qkv", "o", "down")}
        attn = layer.self_attn
        normed = rms_norm(h, *_norm(layer.input_layernorm), cast)
        qkv = joined_linear(normed, attn.q_proj, attn.k_proj, attn.v_proj, given=taken.get("qkv"))
        # split, not slices: a split's backward joins the parts' gradients, where each slice's would zero a full-size one
        if layout is not None:  # (M, heads + 2 kv_heads, d): rotary here, attention in the groups' layout
            qk, v = qkv.view(qkv.shape[0], rotated + kv_heads, d).split([rotated, kv_heads], dim=1)
            out = layout.attend(rotate(qk, cos, sin), v, None if cache is None else cache[index], heads, scaling)
        else:
            qk, v = qkv.view(b, q_len, -1, d).transpose(1, 2).split([rotated, kv_heads], dim=1)
            q, k = rotate(qk, cos, sin).split([heads, kv_heads], dim=1)
            if cache is not None:
                k, v = torch.cat([cache[index][0], k], dim=2), torch.cat([cache[index][1], v], dim=2)
            out_cache.append((k, v))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scaling, enable_gqa=heads != kv_heads)
            out = out.transpose(1, 2).reshape(b, q_len, -1)
        h = h + joined_linear(out, attn.o_proj, given=taken.get("o"))
        h = h + _mlp(layer.mlp, rms_norm(h, *_norm(layer.post_attention_layernorm), cast), taken.get("down"),
                     None if replay is None else (tape.layers[index]["gate_up"], flat))
    h = rms_norm(h, *_norm(backbone.norm), cast)
    if packed is not None:
        h = h.new_zeros(b * q_len, h.shape[-1]).index_copy(0, packed, h).view(b, q_len, -1)
    return h, out_cache


def _norm(module: torch.nn.Module) -> tuple[torch.Tensor, float]:
    return module.weight, float(module.variance_epsilon)


GROUP_COST = 1024
"""What one more attention group costs in :class:`_AttentionGroups`' choice, in key positions (one query position
attending to one key, in every layer, forward and backward): its ~30 more ops a layer (views, the cache rows,
the attention call and their backward) at ~5 us each, against ~1.1 us a key position on the ~8M bench model."""


class _AttentionGroups:
    """A packed call's attention run in groups of rows of like widths, each at its own width.

    ``valid`` ``(b, Q)``: the call's valid query positions; ``packed`` ``(M,)``: their flat indices (row-major);
    ``allowed`` ``(b, 1, Q, K + Q)``: the call's mask; ``past``: ``K``. A row's width is its last valid position
    plus one; the rows are sorted by width and cut into the count of equal-row groups (1, 2, 4 or 8) whose
    attention costs least, ``sum_g rows_g x width_g x (K + width_g) + groups x GROUP_COST`` key positions. A batch
    of spread lengths in one group computes attention for every row at the longest one's width; in groups, each
    row's at its group's (about half the work on the bench's GRPO batches). Each valid query attends to the keys
    it attends to in one group: the same states and gradients up to float summation order.

    :meth:`attend` scatters the packed q/k/v into the groups' zero-padded layouts one after another (one copy
    each), runs attention per group, and gathers the valid positions' outputs back in packed order.
    """

    def __init__(self, valid: torch.Tensor, packed: torch.Tensor, allowed: torch.Tensor, past: int):
        b, q_len = valid.shape
        columns = torch.arange(1, q_len + 1, device=valid.device)
        widths = (valid * columns).amax(-1)  # last valid column + 1, 0 for none
        order = torch.sort(widths, stable=True).indices
        sorted_widths = widths[order].tolist()
        best = cheapest_equal_cut(b, (1, 2, 4, 8), lambda bounds: (len(bounds) - 1) * GROUP_COST + sum(
            (hi - lo) * sorted_widths[hi - 1] * (past + sorted_widths[hi - 1]) for lo, hi in zip(bounds, bounds[1:])))
        # each group: its rows, width, first row in the joined layout, and its part of the mask
        self.groups, start = [], 0
        where = torch.full((b, q_len), -1, dtype=torch.long, device=valid.device)  # flat -> row of the joined layout
        for lo, hi in zip(best, best[1:]):
            width = sorted_widths[hi - 1] if hi > lo else 0
            if width == 0:
                continue  # rows with no valid query: nothing to compute
            rows = order[lo:hi]
            grid = start + torch.arange((hi - lo) * width, device=valid.device).view(hi - lo, width)
            where[rows, :width] = grid
            self.groups.append((rows, width, start, allowed.index_select(0, rows)[..., :width, :past + width]))
            start += (hi - lo) * width
        self.total = start
        self.dest = where.view(-1).index_select(0, packed)  # each packed position's row in the joined layout

    def attend(self, qk: torch.Tensor, v: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None, heads: int,
               scaling: float) -> torch.Tensor:
        """Packed rotated ``qk`` ``(M, heads + kv_heads, d)`` and ``v`` ``(M, kv_heads, d)`` (``cache``: keys and
        values ``(b, kv_heads, K, d)`` before them) -> the attention outputs ``(M, heads * d)``."""
        d, kv_heads = qk.shape[-1], v.shape[1]
        if not self.groups:  # no valid query position
            return qk.new_zeros(qk.shape[0], heads * d)
        joined_qk = qk.new_zeros(self.total, *qk.shape[1:]).index_copy_(0, self.dest, qk)
        joined_v = v.new_zeros(self.total, *v.shape[1:]).index_copy_(0, self.dest, v)
        outs = []
        # split, not slices: the backward joins the parts' gradients, where each slice's would zero a full-size one
        sizes = [rows.shape[0] * width for rows, width, _, _ in self.groups]
        for (rows, width, _, allowed), part_qk, part_v in zip(self.groups, joined_qk.split(sizes),
                                                               joined_v.split(sizes)):
            q, k = part_qk.view(-1, width, heads + kv_heads, d).transpose(1, 2).split([heads, kv_heads], dim=1)
            values = part_v.view(-1, width, kv_heads, d).transpose(1, 2)
            if cache is not None:
                k = torch.cat([cache[0].index_select(0, rows), k], dim=2)
                values = torch.cat([cache[1].index_select(0, rows), values], dim=2)
            out = F.scaled_dot_product_attention(q, k, values, attn_mask=allowed, scale=scaling,
                                                 enable_gqa=heads != kv_heads)
            outs.append(out.transpose(1, 2).reshape(-1, heads * d))
        return torch.cat(outs).index_select(0, self.dest)


def joined_linear(x: torch.Tensor, *layers: torch.nn.Linear, given: torch.Tensor | None = None) -> torch.Tensor:
    """``layers``' outputs side by side (``cat([layer(x) for layer in layers], -1)``) by one matmul on their joined
    weights; with gradients, :class:`_JoinedLinear`. ``given``: those outputs, already computed (a decode's tape):
    no product is computed, the backward's are."""
    if not torch.is_grad_enabled() or not (x.requires_grad or any(layer.weight.requires_grad for layer in layers)):
        return side_by_side(*layers)(x) if given is None else given
    biases = tuple(layer.bias for layer in layers)
    return _JoinedLinear.apply(x, len(layers), given, *(layer.weight for layer in layers), *biases)


def embedding(module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``module(ids)``: with gradients on a plain ``nn.Embedding`` (no ``max_norm``, ``scale_grad_by_freq`` or
    ``sparse``), through :class:`_Embedding`, whose backward adds into the weight's gradient buffer where
    :func:`~.grad_slots.gradients_into` names one; any other module is called as it is."""
    weight = getattr(module, "weight", None)
    if (type(module) is not torch.nn.Embedding or not torch.is_grad_enabled() or not weight.requires_grad
            or module.max_norm is not None or module.scale_grad_by_freq or module.sparse):
        return module(ids)
    return _Embedding.apply(ids, weight, module.padding_idx)


class _Embedding(torch.autograd.Function):
    """``F.embedding(ids, weight, padding_idx)``. Its backward, inside :func:`~.grad_slots.gradients_into`, sums
    the gradient of each distinct looked-up row (``index_add_`` in index order, as the dense backward adds them:
    its rows to the bit) and adds those rows into the weight's buffer, the padding row left alone; autograd gets
    nothing. So no dense ``(vocab, hidden)`` gradient is made, nor held until the embedding's other use
    (:mod:`.grad_slots`), and the buffer receives each use's rows as one add, like the projections' gradients:
    the same numbers to the bit on an update's first micro-batch. Outside it, autograd's own dense gradient."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None):
        ctx.save_for_backward(ids, weight)
        ctx.padding_idx = padding_idx
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ids, weight = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return None, None, None
        padding = -1 if ctx.padding_idx is None else ctx.padding_idx
        slot = gradient_slot(weight)
        if slot is None:
            return None, torch.ops.aten.embedding_backward(grad, ids, weight.shape[0], padding, False, False), None
        flat_ids, rows = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
        if ctx.padding_idx is not None:
            kept = flat_ids != padding
            flat_ids, rows = flat_ids[kept], rows[kept]
        # this use's gradient of each distinct row first (the dense backward's rows), then one add into the buffer
        distinct, which = torch.unique(flat_ids, return_inverse=True)
        sums = rows.new_zeros(distinct.shape[0], rows.shape[-1]).index_add_(0, which, rows)
        slot.index_add_(0, distinct, sums.to(slot.dtype))
        return None, None, None


class _JoinedLinear(torch.autograd.Function):
    """Several linear layers' outputs side by side, keeping no joined copy of their weights for the backward.

    A differentiable ``torch.cat`` of the weights would keep the joined copy alive from the forward to the
    backward, one per layer (a second copy of the projections' weights on a large model: ~270 MB on the ~100M
    bench model). Layers holding at most :data:`~.lean_decode.JOIN_LIMIT` weights together (the per-call
    cost of several small matmuls is what joining saves) run as one matmul on their weights joined for the
    forward and again for the backward's input gradient: the numbers of a differentiable ``torch.cat``, bit
    for bit, where the joined weight holds fewer than :data:`~.lean_decode.PACK_MIN` elements (from there
    both products are oneDNN's, :func:`~.lean_decode.dense`: equal up to float summation order). Larger ones join nothing: each writes its columns of the output
    (:func:`~.lean_decode.linear_into`), each weight's gradient is the product of its own columns (as the
    separate layer's backward computes it, bit for bit), and the input's gradient a sum of one product per
    layer (equal up to float summation order).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, count: int, given: torch.Tensor | None, *params):
        weights, biases = params[:count], params[count:]
        ctx.save_for_backward(x, *weights)
        ctx.has_bias = tuple(b is not None for b in biases)
        ctx.joined = sum(w.numel() for w in weights) <= JOIN_LIMIT
        if given is not None:
            return given
        if not ctx.joined:
            return linear_into(x, weights, biases)
        bias = None if not any(ctx.has_bias) else torch.cat(
            [b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)])
        return dense(x, _joined(weights), bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, *weights = ctx.saved_tensors
        rows = [w.shape[0] for w in weights]
        flat_grad, flat_x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        wanted = ctx.needs_input_grad[3:3 + len(rows)]
        grad_x = None
        if ctx.joined:
            if ctx.needs_input_grad[0]:
                grad_x = dense(grad, _joined(weights).t())
            # the joint weight gradient as autograd's mm backward computes it for a transposed weight: g^T x
            weight_grads = (flat_grad.t() @ flat_x).split(rows) if any(wanted) else (None,) * len(rows)
        else:
            blocks = flat_grad.split(rows, dim=-1)  # each layer's columns (views)
            if ctx.needs_input_grad[0]:
                grad_x = blocks[0] @ weights[0]
                for block, weight in zip(blocks[1:], weights[1:]):
                    grad_x.addmm_(block, weight)
                grad_x = grad_x.view(*grad.shape[:-1], grad_x.shape[-1])
            weight_grads = tuple(block.t() @ flat_x if needed else None for block, needed in zip(blocks, wanted))
        weight_grads = tuple(weight_gradient(w, g) for w, g in zip(weights, weight_grads))  # into the buffers
        bias_grads = flat_grad.sum(0).split(rows) if any(ctx.has_bias) else (None,) * len(rows)
        return (grad_x, None, None, *weight_grads, *(g if has else None for g, has in zip(bias_grads, ctx.has_bias)))


def _joined(weights) -> torch.Tensor:
    """The weights one above the other (no copy of a single one)."""
    return weights[0] if len(weights) == 1 else torch.cat(weights)


def _mlp(module: torch.nn.Module, x: torch.Tensor, given_down: torch.Tensor | None = None,
         both_rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The gated MLP ``down(act(gate(x)) * up(x))`` with gate and up as one matmul (a non-gated MLP: the module).

    A decode's tape (with gradients, a SiLU-gated MLP): ``given_down``, the down product's output;
    ``both_rows``, ``(source, index)``: the ``[gate, up]`` outputs are ``source[index]``, which only the backward
    reads (:class:`_SwiGLUDown`); the forward passes a stand-in of their shape that holds no memory."""
    if not all(isinstance(getattr(module, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
        return module(x)
    silu = type(getattr(module, "act_fn", None)).__name__ == "SiLUActivation"
    deferred = both_rows is not None and silu and torch.is_grad_enabled()
    stand_in = both_rows[0].new_zeros(()).expand(*x.shape[:-1], both_rows[0].shape[-1]) if deferred else None
    both = joined_linear(x, module.gate_proj, module.up_proj, given=stand_in)
    down = module.down_proj
    if silu and module.gate_proj.out_features == module.up_proj.out_features and torch.is_grad_enabled() and (
            both.requires_grad or down.weight.requires_grad):
        return _SwiGLUDown.apply(both, down.weight, down.bias, given_down, *(both_rows if deferred else (None, None)))
    if deferred:  # nothing needs a gradient here: the given output, whose inputs are the stand-in's
        return given_down
    gate, up = both.split(module.gate_proj.out_features, dim=-1)
    act = F.silu if silu else module.act_fn
    return F.linear(act(gate) * up, down.weight, down.bias)


class _SwiGLUDown(torch.autograd.Function):
    """``down(silu(gate) * up)`` from the joined ``[gate, up]`` projections, keeping them and ``silu(gate)`` for
    the backward.

    Autograd would keep the product ``silu(gate) * up`` as well (one more ``(tokens, intermediate)`` tensor a
    layer: ~48 MB on the ~100M bench model's update), and join the gradients of ``gate`` and ``up`` by a copy;
    here the backward computes the product again (one element-wise op, where the copy it saves is two such
    tensors) and writes the two gradients into the halves of one tensor. Each step is the operation autograd's
    backward runs (``silu_backward``, the products, the linear's two matmuls), so the numbers are autograd's
    to the bit (tests/runtime/engines/test_lean_forward.py) while the down weight holds fewer than
    :data:`~.lean_decode.PACK_MIN` elements; from there its forward product and the product's gradient are
    oneDNN's (:func:`~.lean_decode.dense`), equal up to float summation order. Recomputing ``silu(gate)`` too saved another such
    tensor but cost the ~8M bench model's update 1.5% (measured, three alternating runs).

    With a decode's tape (``given``: the output; ``source[index]``: the ``[gate, up]`` rows, ``both`` a stand-in)
    the forward computes nothing and keeps only the tape and the index: the backward reads the rows and computes
    ``silu(gate)`` (two ``(tokens, intermediate)`` tensors a layer fewer kept from the forward to the backward).
    """

    @staticmethod
    def forward(ctx, both: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                given: torch.Tensor | None = None, source: torch.Tensor | None = None, index: torch.Tensor | None = None):
        ctx.has_bias = bias is not None
        ctx.deferred = source is not None
        if ctx.deferred:
            ctx.save_for_backward(source, index, weight)
            return given
        gate, up = both.chunk(2, dim=-1)
        activated = F.silu(gate)
        ctx.save_for_backward(both, activated, weight)
        return dense(activated * up, weight, bias) if given is None else given

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.deferred:
            source, index, weight = ctx.saved_tensors
            both = source.index_select(0, index).view(*grad.shape[:-1], source.shape[-1])
            activated = F.silu(both[..., :both.shape[-1] // 2])
        else:
            both, activated, weight = ctx.saved_tensors
        gate, up = both.chunk(2, dim=-1)
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_weight = None
        if ctx.needs_input_grad[1]:
            product = activated * up
            grad_weight = weight_gradient(weight, flat_grad.t() @ product.reshape(-1, product.shape[-1]))
        grad_bias = flat_grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_both = None
        if ctx.needs_input_grad[0]:
            grad_product = dense(flat_grad, weight.t()).view(*grad.shape[:-1], weight.shape[-1])
            grad_both = torch.empty_like(both)
            grad_gate, grad_up = grad_both.chunk(2, dim=-1)
            torch.mul(grad_product, activated, out=grad_up)
            # grad_product is this backward's own tensor, needed no more: the product with up goes into it
            torch.ops.aten.silu_backward(grad_product.mul_(up), gate, grad_input=grad_gate)
        return grad_both, grad_weight, grad_bias, None, None, None
