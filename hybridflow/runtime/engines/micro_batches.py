"""The train engine's micro-batches: fixed row counts or a token budget, and as many as the other ranks run.

A micro-batch is a list of row indices of the (mini-)batch:

* fixed size (``micro_batch_size``): consecutive slices, as before token budgets existed;
* token budget (``max_tokens_per_micro_batch``): rows grouped by real tokens
  (:func:`~hybridflow.runtime.token_partition.token_budget_groups`), so a micro-batch
  of short rows holds more of them than one of long rows;
* width buckets (neither set, ``length_buckets``, updates whose model runs its own forward; the lean
  forward computes valid positions alone and groups attention by width itself, :mod:`.lean_forward`,
  so it runs one micro-batch): the rows sorted by response
  length and cut into the number of equal-count buckets (1, 2, 4 or 8) that computes the fewest
  token positions, each bucket run at its own width (:func:`width_bucket_groups`). A batch padded to
  its longest response spends most of its forward and backward on padding when lengths spread
  (geometric lengths averaging half the limit: about half of the positions); the same gradient
  (a sum over the rows) costs ``sum(rows_b x width_b)`` positions instead of ``rows x width``.

Under FSDP every rank must run the same number of forwards (and backwards): a rank
with fewer micro-batches than the busiest one splits its largest ones, and where it has
too few rows for that, runs *stand-ins*: its first row with an all-zero response mask,
which adds nothing to the losses, the token counts or the gradients, and whose outputs
are dropped.
"""
from __future__ import annotations

import torch

from ..token_partition import cheapest_equal_cut, token_budget_groups
from .lean_forward import lean_forward_applies
from .shared_prompt import min_saved_positions, prompt_groups
from .sequence import response_attention, row_token_counts

__all__ = ["micro_batch_groups", "take_rows", "stand_in", "restore_row_order", "width_bucket_groups", "BUCKET_COUNTS",
           "update_buckets"]

BUCKET_COUNTS = (1, 2, 4, 8)
"""Bucket counts :func:`width_bucket_groups` chooses from."""


def micro_batch_groups(tensors: dict[str, torch.Tensor], *, micro_batch_size: int | None,
                       max_tokens: int | None) -> list[list[int]]:
    """Row indices of each micro-batch of ``tensors`` (fields ``(b, ...)``; see the module docstring).

    ``max_tokens`` (if given) wins over ``micro_batch_size``; one host sync for the row lengths.
    """
    size = len(tensors["response_mask"])
    if max_tokens is not None:
        lengths = row_token_counts(tensors["prompt_mask"], tensors["response_mask"]).tolist()
        return token_budget_groups(lengths, max_tokens)
    step = micro_batch_size or max(size, 1)
    return [list(range(start, min(start + step, size))) for start in range(0, size, step)]


def width_bucket_groups(prompt_mask: torch.Tensor, response_mask: torch.Tensor, *, forward_cost: float,
                        prompt_groups: torch.Tensor | None = None) -> list[list[int]]:
    """Rows sorted by response width and cut into the bucket count of :data:`BUCKET_COUNTS` that costs least.

    A row's width is its response up to the last valid position; a bucket runs at its longest
    row's width. Cost of ``k`` buckets, in token positions: ``sum_b rows_b x width_b`` (responses) +
    ``sum_b prompts_b x P`` (``prompts_b``: the distinct prompts of bucket ``b`` when ``prompt_groups``
    gives each row's prompt, as the shared-prompt forward runs each once; else its rows) +
    ``(k - 1) x forward_cost`` (what one more forward and backward costs beyond its positions).
    Ties keep fewer buckets. Returns the buckets' row indices, shortest rows first (one bucket of
    all rows in their order when one is cheapest).
    """
    rows = response_mask.shape[0]
    if rows < 2:
        return [list(range(rows))] if rows else []
    widths = response_attention(response_mask).sum(-1)
    order = torch.sort(widths, stable=True).indices
    sorted_widths = widths[order].tolist()
    group_of = (prompt_groups[order] if prompt_groups is not None else order).tolist()
    prompt_len = prompt_mask.shape[-1]

    def cost(bounds: list[int]) -> float:
        return (len(bounds) - 2) * forward_cost + sum(
            (hi - lo) * sorted_widths[hi - 1] + len(set(group_of[lo:hi])) * prompt_len
            for lo, hi in zip(bounds, bounds[1:]))

    bounds = cheapest_equal_cut(rows, BUCKET_COUNTS, cost)
    if len(bounds) == 2:
        return [list(range(rows))]
    return [order[lo:hi].tolist() for lo, hi in zip(bounds, bounds[1:])]


def update_buckets(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> list[list[int]]:
    """An update's width buckets for ``module``: :func:`width_bucket_groups` with one more forward and backward
    costed at twice the shared-prompt forward's break-even positions at its width (the second backbone call that
    sharing costs, measured in :mod:`hybridflow.capabilities`).

    One bucket where the lean forward runs (:func:`.lean_forward.lean_forward_applies`): it computes the valid
    positions alone and its attention in groups of rows of like widths, so more micro-batches would save nothing
    they cost (each reads every weight again and adds into every gradient buffer)."""
    backbone = getattr(module, "base_model", None)
    if backbone is not None and backbone is not module and lean_forward_applies(backbone):
        rows = tensors["response_mask"].shape[0]
        return [list(range(rows))] if rows else []
    hidden = getattr(getattr(module, "config", None), "hidden_size", None)
    groups = prompt_groups(tensors["prompt_ids"], tensors["prompt_mask"])
    return width_bucket_groups(tensors["prompt_mask"], tensors["response_mask"],
                               forward_cost=2 * min_saved_positions(hidden),
                               prompt_groups=groups[1] if groups is not None else None)


def take_rows(tensors: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
    """The rows ``rows`` of every field: a slice (a view) when they are consecutive, else a gather."""
    if rows and rows == list(range(rows[0], rows[0] + len(rows))):
        return {k: v[rows[0]:rows[0] + len(rows)] for k, v in tensors.items()}
    index = torch.tensor(rows, dtype=torch.long, device=tensors["response_mask"].device)
    return {k: v.index_select(0, index) for k, v in tensors.items()}


def stand_in(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A one-row micro-batch that contributes nothing: the first row with an all-zero ``response_mask``."""
    row = {k: v[:1] for k, v in tensors.items()}
    row["response_mask"] = torch.zeros_like(row["response_mask"])
    return row


def restore_row_order(parts: list[torch.Tensor], groups: list[list[int]]) -> torch.Tensor:
    """The micro-batches' outputs ``parts[g]`` (rows ``groups[g]``) as one tensor in the rows' original order."""
    out = torch.cat(parts)
    order = [row for group in groups for row in group]
    if order == list(range(len(order))):
        return out
    restored = torch.empty_like(out)
    restored[torch.tensor(order, dtype=torch.long, device=out.device)] = out
    return restored
