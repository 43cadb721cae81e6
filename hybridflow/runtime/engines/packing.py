"""Sequence packing: the rows of a micro-batch as one row of real tokens, with no padding.

The padded forward (:func:`~.sequence.join_prompt_response`) runs ``b`` rows of
``P + R - 1`` positions, most of them padding when lengths vary. The packed
forward concatenates, row after row, only the tokens that matter: each row's
real prompt tokens and its response up to the last valid position (minus the
last token, which is never fed)::

    padded   row 0:  pad pad p p p | y y y pad       row 1:  p p p p p | y pad pad pad
    packed   p p p y y y  p p p p p                   (one row of N real tokens)
    position 0 1 2 3 4 5  0 1 2 3 4                   (reset per sequence)

Position ids count each sequence's own tokens from 0, as ``cumsum(mask) - 1`` does in
the padded layout, so every token gets the position it has there. Attention keeps the
sequences apart: transformers (verified for 5.25, ``sdpa`` and ``eager``, Qwen2 and
Llama; ``tests/runtime/engines/test_packing.py`` checks it) reads sequence boundaries
from position ids that reset when no 2-D attention mask and no cache are given, and
builds the block-diagonal causal mask from them; with ``flash_attention_2`` the
boundaries go in as ``cu_seq_lens`` (the varlen kernel, no mask at all): a packed
forward switches to it on CUDA under bf16 autocast where ``flash_attn`` is installed
(:func:`flash_attention_usable`), for that forward only. A row whose
response has no valid position contributes no token (its outputs are padding).

The state before response token ``t`` of row ``i`` is packed position
``start_i + p_i - 1 + t`` (``p_i`` real prompt tokens), for ``t < r_i`` (``r_i``: the
response's length up to its last valid position); :class:`PackedRows` keeps these
indices so results go back to the ``(b, R)`` layout with zeros at padding.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, NamedTuple

import torch

from hybridflow.errors import OpError

from .sequence import position_ids_from_mask, response_attention

__all__ = ["PackedRows", "pack_rows", "packed_forward_kwargs", "packed_hidden", "packed_logits", "unpack",
           "attention_implementation", "flash_attention_usable", "FLASH_IMPLEMENTATIONS"]

FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3")
"""Attention implementations that take the sequence boundaries as ``cu_seq_lens`` (varlen kernels)."""


class PackedRows(NamedTuple):
    """A micro-batch packed into one row (see the module docstring); ``N`` real tokens, ``M`` response states."""

    input_ids: torch.Tensor
    """``(1, N)`` int64: each row's real prompt tokens then its fed response tokens."""
    position_ids: torch.Tensor
    """``(1, N)`` int64: 0, 1, ... within each sequence."""
    state_index: torch.Tensor
    """``(M,)`` int64: the packed position of the state before each valid response token."""
    rows: torch.Tensor
    """``(M,)`` int64: the row of each of those states."""
    cols: torch.Tensor
    """``(M,)`` int64: the response position of each of those states."""
    seq_lens: torch.Tensor
    """``(s,)`` int64: the lengths of the packed sequences (rows without a valid response left out)."""
    shape: tuple[int, int]
    """``(b, R)``: the response layout the states go back to."""


def pack_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
              response_mask: torch.Tensor) -> PackedRows:
    """Pack prompt + response rows into one row of real tokens.

    Shapes: prompt_ids, prompt_mask ``(b, P)``; response_ids, response_mask ``(b, R)`` -> :class:`PackedRows`.
    A row with a valid response position needs at least one prompt token (the state before its first
    response token); OpError otherwise.
    """
    if response_ids.shape[-1] < 1:
        raise OpError("packing needs a response of at least one position (R >= 1)")
    context = response_attention(response_mask)  # (b, R): 1 up to each row's last valid position
    resp_len = context.sum(-1)  # r_i
    live = resp_len > 0
    prompt_keep = (prompt_mask != 0) & live[:, None]
    prompt_len = prompt_keep.sum(-1)  # p_i (0 for rows without a response)
    if bool((live & (prompt_len == 0)).any()):
        raise OpError("packing found a row with a response but no prompt token; every row needs at least one "
                      "real prompt token (prompt_mask) before its response")
    keep = torch.cat([prompt_keep, context[:, 1:] != 0], dim=-1)  # y_t is fed when y_{t+1} needs it
    joined = torch.cat([prompt_ids, response_ids[:, :-1]], dim=-1).long()
    seq_len = keep.sum(-1)
    starts = seq_len.cumsum(0) - seq_len
    rows, cols = (context != 0).nonzero(as_tuple=True)
    state_index = starts[rows] + prompt_len[rows] - 1 + cols
    return PackedRows(input_ids=joined[keep][None], position_ids=position_ids_from_mask(keep)[keep][None],
                      state_index=state_index, rows=rows, cols=cols, seq_lens=seq_len[live],
                      shape=(response_ids.shape[0], response_ids.shape[1]))


def packed_forward_kwargs(packed: PackedRows, attn_implementation: str | None) -> dict[str, Any]:
    """Keyword arguments of a transformers forward over ``packed``: ids, positions, no mask, no cache.

    For the flash-attention implementations, the sequence boundaries as ``cu_seq_lens_q/k`` and
    ``max_length_q/k`` (transformers then calls the varlen kernel without reading them from the
    positions in every layer); other implementations build the block-diagonal mask from the positions.
    """
    kwargs: dict[str, Any] = dict(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                                  use_cache=False)
    if attn_implementation in FLASH_IMPLEMENTATIONS:
        lens = packed.seq_lens.to(torch.int32)
        cu = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
        longest = int(lens.max()) if len(lens) else 0
        kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    return kwargs


def packed_hidden(backbone: torch.nn.Module, packed: PackedRows) -> torch.Tensor:
    """Last-layer hidden states of the states before each valid response token: ``(M, h)``.

    ``backbone``: a transformers base model (``Qwen2Model``, ``LlamaModel``, ...).
    """
    out = _run_packed(backbone, packed)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden[0].index_select(0, packed.state_index)


def packed_logits(model: torch.nn.Module, packed: PackedRows) -> torch.Tensor:
    """The causal LM's logits at the states before each valid response token: ``(M, V)``."""
    return _run_packed(model, packed).logits[0].index_select(0, packed.state_index)


def _run_packed(model: torch.nn.Module, packed: PackedRows):
    """``model``'s forward over ``packed``, with flash-attention varlen where :func:`flash_attention_usable`."""
    with _flash_attention_if_usable(model, packed.input_ids.device) as implementation:
        return model(**packed_forward_kwargs(_never_empty(packed), implementation))


def flash_attention_usable(device: torch.device) -> bool:
    """Whether a packed forward on ``device`` runs flash-attention: CUDA under half-precision autocast (the
    kernels take bf16/fp16 only; the train engine's bf16 precision) with the ``flash_attn`` package installed."""
    import importlib.util

    return (device.type == "cuda" and torch.is_autocast_enabled(device.type)
            and torch.get_autocast_dtype(device.type) in (torch.bfloat16, torch.float16)
            and importlib.util.find_spec("flash_attn") is not None)


@contextlib.contextmanager
def _flash_attention_if_usable(model: torch.nn.Module, device: torch.device) -> Iterator[str | None]:
    """Run ``flash_attention_2`` inside the block where usable, and give the implementation that runs.

    Set on the model's config for the block only: a rollout engine sharing the module (which may decode in
    float32) keeps its own implementation.
    """
    config = getattr(model, "config", None)
    current = attention_implementation(model)
    if config is None or current in FLASH_IMPLEMENTATIONS or not flash_attention_usable(device):
        yield current
        return
    config._attn_implementation = "flash_attention_2"
    try:
        yield "flash_attention_2"
    finally:
        config._attn_implementation = current


def attention_implementation(model: torch.nn.Module) -> str | None:
    """The transformers attention implementation ``model`` runs (``config._attn_implementation``), or None."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def _never_empty(packed: PackedRows) -> PackedRows:
    """``packed``, or one stand-in token (id 0, position 0) when it holds none: the forward still runs, so a
    sharded model's collectives match the other ranks' (no state is read from it: ``state_index`` is empty)."""
    if packed.input_ids.shape[-1]:
        return packed
    one = packed.input_ids.new_zeros((1, 1))
    return packed._replace(input_ids=one, position_ids=one, seq_lens=one.new_ones(1))


def unpack(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """``(M, ...)`` values of the response states -> ``(b, R, ...)`` with zeros at padding (differentiable)."""
    out = values.new_zeros(packed.shape + tuple(values.shape[1:]))
    return out.index_put((packed.rows, packed.cols), values)

