"""Prompt + response as one model input, and the hidden states aligned with response tokens.

Layout (``P`` prompt positions, left-padded; ``R`` response positions, right-padded)::

    position      0 ..... P-1 | P ...... P+R-1
    token         pad pad p p |  y_0 ... y_{R-1}
    predicts            y_0 ..... y_{R-1}  (the hidden state at P-1+t predicts y_t)

So the states aligned with the response are positions ``P-1 .. P+R-2``: the
state *before* each response token, from which its log-probability and the
critic's value ``V(s_t)`` are read. The last response token is never fed in
(nothing after it is needed). Position ids count valid tokens only,
``cumsum(mask) - 1``, so a left-padded prompt gets the same positions as the
unpadded one, as during generation.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["ModelInputs", "position_ids_from_mask", "response_attention", "join_prompt_response", "response_hidden",
           "row_token_counts"]


class ModelInputs(NamedTuple):
    input_ids: torch.Tensor
    """``(b, P + R - 1)`` int64."""
    attention_mask: torch.Tensor
    """``(b, P + R - 1)`` int64, 1 at real tokens."""
    position_ids: torch.Tensor
    """``(b, P + R - 1)`` int64, ``cumsum(mask) - 1`` clamped at 0."""


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(mask) - 1`` clamped at 0: ``(b, t)`` -> ``(b, t)`` int64."""
    return (mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def response_attention(response_mask: torch.Tensor) -> torch.Tensor:
    """Attention mask of the response part: 1 up to the last position where ``response_mask`` > 0.

    ``(b, R)`` float -> ``(b, R)`` int64. Positions inside the response that the loss
    masks out (if any) still belong to the context of later tokens.
    """
    valid = (response_mask > 0).long()
    return valid.flip(-1).cummax(dim=-1).values.flip(-1)


def row_token_counts(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens of each row: its prompt tokens plus its response up to the last valid position.

    ``(b, P)``, ``(b, R)`` -> ``(b,)`` int64: the length a row has with no padding, what token budgets
    and balanced partitions count (a response with no valid position counts 0).
    """
    return (prompt_mask != 0).sum(-1) + response_attention(response_mask).sum(-1)


def join_prompt_response(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                         response_mask: torch.Tensor) -> ModelInputs:
    """Concatenate prompt and response (minus its last token) into model inputs.

    Shapes: prompt_ids, prompt_mask ``(b, P)``; response_ids, response_mask ``(b, R)``
    -> three ``(b, P + R - 1)`` int64 tensors.
    """
    if response_ids.shape[-1] < 1:
        raise ValueError("the response must have at least one position (R >= 1)")
    input_ids = torch.cat([prompt_ids, response_ids[:, :-1]], dim=-1).long()
    mask = torch.cat([prompt_mask.long(), response_attention(response_mask)[:, :-1]], dim=-1)
    return ModelInputs(input_ids, mask, position_ids_from_mask(mask))


def response_hidden(backbone: torch.nn.Module, inputs: ModelInputs, prompt_len: int) -> torch.Tensor:
    """Last-layer hidden states of the states before each response token.

    Runs ``backbone`` (a transformers base model: ``LlamaModel``, ``Qwen2Model``, ...)
    without a KV cache, by :func:`~.lean_forward.lean_hidden` where it applies (with gradients on,
    its states at padding positions are then 0). Shapes: -> ``(b, R, h)`` = hidden positions ``P-1 .. P+R-2``.
    """
    from .lean_forward import lean_forward_applies, lean_hidden

    if lean_forward_applies(backbone):  # the same states without the framework's per-call work
        hidden, _ = lean_hidden(backbone, inputs.input_ids, inputs.attention_mask, inputs.position_ids,
                                valid_only=torch.is_grad_enabled())
        return hidden[:, prompt_len - 1:]
    out = backbone(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                   position_ids=inputs.position_ids, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden[:, prompt_len - 1:]


def trim_response_width(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """Cut the response columns after the last one any row uses: ``(b, R)`` fields -> ``(b, R')``, and ``R``.

    Responses are right-padded to the generation limit ``R``; when every response of a batch ended
    earlier, the columns past the longest one hold padding only. Cutting them changes no number the
    losses or log-probs read, up to float summation order: a position attends only to positions
    before it (causal), and the losses mask padding out (their token and sequence counts come from
    ``response_mask``, which loses only zeros). Fields cut: those whose first two dimensions are
    ``response_mask``'s, other than the ``prompt_*`` ones. One host sync (the width).
    """
    mask = tensors["response_mask"]
    width = mask.shape[-1]
    used = (mask != 0).any(0).nonzero()
    keep = int(used.max()) + 1 if len(used) else 1
    if keep >= width:
        return tensors, width
    cut = {name: (value[:, :keep] if not name.startswith("prompt_") and value.dim() >= 2 and value.shape[:2] == mask.shape
                  else value) for name, value in tensors.items()}
    return cut, width
