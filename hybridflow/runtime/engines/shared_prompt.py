"""The train engine's forward with each distinct prompt run once: a group's responses share its prompt's keys/values.

In GRPO-style batches every prompt comes ``n`` times (one row per sampled
response). A causal model's states at the prompt positions depend on the prompt
alone, so the ``n`` copies compute the same numbers: :func:`shared_response_hidden`
runs the distinct prompts once through the backbone (with a KV cache), repeats the
cache and the last prompt state to every row of the group (``index_select``,
differentiable: the gradients of the copies add up), then runs the response tokens
of all rows on top of it. With 5 prompt and 3 fed response positions in groups of 8,
the backbone's work falls from ``64 x 8`` to ``8 x 5 + 64 x 3`` token positions.

The result equals :func:`~.sequence.response_hidden` on the joined rows up to float
summation order (``tests/runtime/engines/test_shared_prompt.py`` compares values and
gradients). The backbone calls are :func:`~.lean_forward.lean_hidden`'s where that applies
(Llama-family backbones), else the model's own forward with a ``DynamicCache``. It applies only
where it is exact: a model transformers caches (or the lean path drives), and no dropout active in
training mode (the copies would share one dropout mask), and where it saves at least
:func:`min_saved_positions` prompt positions (:data:`MIN_SAVED_POSITIONS` at width 256, fewer
for wider models, more for narrower ones), or where the decode's tape holds the response positions'
products (:mod:`.decode_tape`: then the prompts run in a call of their own, shared or not). Otherwise it
returns None and the caller runs the joined rows.
"""
from __future__ import annotations

import torch

from ...capabilities import SHARED_PROMPT_MIN_SAVED as MIN_SAVED_POSITIONS
from ...capabilities import SHARED_PROMPT_REFERENCE_WIDTH as REFERENCE_WIDTH
from ...capabilities import shared_prompt_threshold
from .sequence import position_ids_from_mask, response_attention

__all__ = ["MIN_SAVED_POSITIONS", "REFERENCE_WIDTH", "dropout_active", "min_saved_positions", "prompt_groups",
           "shared_response_hidden"]

def min_saved_positions(hidden: int | None) -> int:
    """The prompt positions sharing must save in a model of width ``hidden``: ``ceil(64 * 256 / hidden)``.

    A saved position saves work that grows with the width, while the second call's cost is mostly
    fixed (dispatch, the cache's copies), so the break-even falls as the width grows. Measured on the
    tiny model (hidden 64, threshold 256; GRPO, 8 prompts x 8, 1 CPU thread, CPU ms per step):
    skipping zero-advantage rows leaves 2-4 groups (70-140 positions saved): 20.9-22.5 shared vs
    18.4-18.6 joined; all 8 groups (280 saved): 23.5 shared vs 26.0 joined. None (width unknown): 64.
    """
    return shared_prompt_threshold(MIN_SAVED_POSITIONS, hidden)


_DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop",
                   "hidden_dropout_prob", "attention_probs_dropout_prob")


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first, inverse)`` of the distinct prompt rows, or None when every row is distinct.

    ``first`` ``(u,)``: one row index per distinct prompt; ``inverse`` ``(b,)``: the distinct
    prompt of each row, so ``prompt_ids[first][inverse] == prompt_ids``. One host sync (``u``).
    """
    b = prompt_ids.shape[0]
    if b < 2:
        return None
    rows = torch.cat([prompt_ids.long() * prompt_mask.long(), prompt_mask.long()], dim=-1)
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    u = int(inverse.max()) + 1
    if u == b:
        return None
    first = torch.full((u,), b, dtype=torch.long, device=inverse.device)
    first.scatter_reduce_(0, inverse, torch.arange(b, device=inverse.device), reduce="amin")
    return first, inverse


def dropout_active(backbone: torch.nn.Module) -> bool:
    """Whether a forward of ``backbone`` in its current mode drops out (a dropout module or config rate above 0, in
    training mode): rows that run together would then not compute what each would alone."""
    if not backbone.training:
        return False
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in backbone.modules()):
        return True
    config = getattr(backbone, "config", None)
    return any(isinstance(getattr(config, f, None), (int, float)) and getattr(config, f) > 0 for f in _DROPOUT_FIELDS)


def shared_response_hidden(backbone: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                           response_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor | None:
    """The states before each response token ``(b, R, h)``, each distinct prompt run once; None where not applicable.

    Same layout and meaning as :func:`~.sequence.response_hidden` on
    :func:`~.sequence.join_prompt_response`'s inputs (see the module docstring for when it applies).
    """
    if response_ids.shape[-1] < 1 or dropout_active(backbone):
        return None
    from .decode_tape import replay_rows
    from .lean_forward import lean_forward_applies, lean_shared_hidden

    groups = prompt_groups(prompt_ids, prompt_mask)
    # the decode's products for the response positions (decode_tape; a dict lookup where none is kept): the
    # prompts' call is then worth making whatever it shares, the response positions' products being the decode's
    replay = replay_rows(backbone, prompt_ids, prompt_mask, response_ids, response_mask) if (
        torch.is_grad_enabled() and response_ids.shape[-1] > 1) else None
    if replay is not None and lean_forward_applies(backbone):
        every = torch.arange(prompt_ids.shape[0], device=prompt_ids.device)
        return lean_shared_hidden(backbone, prompt_ids, prompt_mask, response_ids, response_mask,
                                  (every, every) if groups is None else groups, replay)
    hidden = getattr(getattr(backbone, "config", None), "hidden_size", None)
    if groups is None or (prompt_ids.shape[0] - len(groups[0])) * prompt_ids.shape[-1] < min_saved_positions(hidden):
        return None
    if lean_forward_applies(backbone):  # the same states without the framework's per-call work
        return lean_shared_hidden(backbone, prompt_ids, prompt_mask, response_ids, response_mask, groups)
    from .decode import cache_keyword, new_cache

    first, inverse = groups
    cache = new_cache(backbone)
    if response_ids.shape[-1] > 1 and not hasattr(cache, "reorder_cache"):
        return None
    keyword = cache_keyword(backbone)
    unique_mask = prompt_mask[first].long()
    out = backbone(input_ids=prompt_ids[first].long(), attention_mask=unique_mask,
                   position_ids=position_ids_from_mask(unique_mask), use_cache=True, **{keyword: cache})
    prompt_last = _last_hidden(out)[:, -1:].index_select(0, inverse)
    if response_ids.shape[-1] == 1:
        return prompt_last
    cache.reorder_cache(inverse)
    attention = torch.cat([prompt_mask.long(), response_attention(response_mask)[:, :-1]], dim=-1)
    positions = position_ids_from_mask(attention)[:, prompt_ids.shape[-1]:]
    out = backbone(input_ids=response_ids[:, :-1].long(), attention_mask=attention, position_ids=positions,
                   use_cache=True, **{keyword: cache})
    return torch.cat([prompt_last, _last_hidden(out)], dim=1)


def _last_hidden(out) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
