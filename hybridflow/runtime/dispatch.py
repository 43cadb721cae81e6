"""Data-parallel dispatch: a node's batch split over the ranks of a pool, and the ranks' results merged.

Pure functions of batches (no Ray here), one splitter and one merger per
worker method (tables keyed by method: a new method adds a row, not a branch):

* :func:`split_for_ranks` pads the batch to a multiple of the rank count by
  repeating its last row (:meth:`Batch.pad_to_divisor`) and cuts it into equal
  consecutive slices, so every rank runs the same number of mini- and
  micro-batches (FSDP's collectives need that). For ``update`` the padding
  rows get an all-zero ``response_mask``: they add nothing to the loss, to the
  global token and sequence counts, or to the gradient.
* with ``balance_tokens`` (a role whose engine packs sequences or budgets tokens,
  :func:`balances_tokens`), the rows of ``logprob`` / ``values`` / ``update`` are
  dealt instead so that the ranks' real-token totals are balanced
  (:func:`~.token_partition.balanced_partition`: equal row counts, totals within
  the longest row's length); the split keeps each rank's row indices.
* :data:`MERGERS` put the ranks' results back in batch order and drop the
  padding: rows for ``logprob`` / ``values`` / ``score``; for ``generate``, the
  ``n`` responses of each padding prompt, with each rank's ``group_index``
  (which counts its own prompts from 0) shifted by the prompts before its
  slice, so groups are numbered as if one engine had generated the whole
  batch; for ``update``, the metrics (:func:`merge_update_metrics`).

Only model work is split: group statistics (GRPO, RLOO) are computed on the
controller over the whole merged batch.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..batch import Batch
from .engines import RewardOutput
from .engines.sequence import row_token_counts
from .token_partition import balanced_partition

__all__ = ["Split", "split_for_ranks", "balances_tokens", "BALANCED_METHODS", "MERGERS", "merge_results",
           "merge_update_metrics"]

BALANCED_METHODS = ("logprob", "values", "update")
"""Worker methods whose rows may be dealt to ranks by token balance (their results are per row, or metrics)."""


class Split:
    """A batch cut for ``ranks`` ranks: ``parts[r]`` for rank r, ``pad`` rows of padding at the end.

    ``rows[r]``: the padded batch's row indices of rank r when they were dealt by token balance; None
    for consecutive slices.
    """

    def __init__(self, parts: list[Batch], pad: int, sizes: list[int], had_groups: bool,
                 rows: list[list[int]] | None = None):
        self.parts, self.pad, self.sizes, self.had_groups, self.rows = parts, pad, sizes, had_groups, rows


def balances_tokens(spec: Any) -> bool:
    """Whether a role's batches are dealt by token balance: its train engine (``RoleSpec.train``) packs
    sequences or forms micro-batches by a token budget, so a rank's work follows its real tokens."""
    train = getattr(spec, "train", None)
    return bool(train is not None and (train.pack_sequences or train.max_tokens_per_micro_batch is not None))


def split_for_ranks(method: str, batch: Batch, ranks: int, *, balance_tokens: bool = False) -> Split:
    """Equal slices of ``batch`` (padded to a multiple of ``ranks``), or token-balanced equal-sized shares
    with ``balance_tokens``; see the module docstring."""
    padded, pad = batch.pad_to_divisor(ranks)
    if pad and method == "update" and "response_mask" in padded:
        mask = padded["response_mask"].clone()
        mask[len(batch):] = 0
        padded = padded.with_fields(response_mask=mask)
    had_groups = "group_index" in batch
    if (balance_tokens and ranks > 1 and method in BALANCED_METHODS
            and {"prompt_mask", "response_mask"} <= set(padded.keys())):
        lengths = row_token_counts(padded["prompt_mask"], padded["response_mask"]).tolist()
        shares = balanced_partition(lengths, ranks)
        parts = [padded[share] for share in shares]
        return Split(parts, pad, [len(p) for p in parts], had_groups, rows=shares)
    parts = padded.chunk(ranks)
    return Split(parts, pad, [len(p) for p in parts], had_groups)


def _drop_tail(rows: int, pad: int) -> slice:
    return slice(0, rows - pad)


def _merge_generate(split: Split, results: Sequence[Batch]) -> Batch:
    if not split.had_groups:
        offset, shifted = 0, []
        for size, part in zip(split.sizes, results):
            shifted.append(part.with_fields(group_index=part["group_index"] + offset))
            offset += size
        results = shifted
    merged = Batch.concat(list(results))
    per_prompt = len(merged) // max(sum(split.sizes), 1)
    return merged[_drop_tail(len(merged), split.pad * per_prompt)]


def _merge_rows(split: Split, results: Sequence[torch.Tensor]) -> torch.Tensor:
    merged = torch.cat(list(results))
    if split.rows is not None:  # dealt by token balance: back to the padded batch's order
        order = torch.tensor([row for share in split.rows for row in share], dtype=torch.long)
        restored = torch.empty_like(merged)
        restored[order.to(merged.device)] = merged
        merged = restored
    return merged[_drop_tail(len(merged), split.pad)]


def _merge_scores(split: Split, results: Sequence[RewardOutput]) -> RewardOutput:
    scores = _merge_rows(split, [r.scores for r in results])
    names = dict.fromkeys(name for r in results for name in r.extras)
    extras = {name: [v for r in results for v in r.extras.get(name, [None] * len(r.scores))][:len(scores)]
              for name in names}
    return RewardOutput(scores, extras)


SUMMED = ("loss",)
"""Update metrics whose name ends with one of these are summed over ranks: each rank's loss is its share
of the global loss (losses use the global token/sequence counts)."""


def merge_update_metrics(results: Sequence[dict[str, float]]) -> dict[str, float]:
    """Losses summed over ranks; ``nan_skipped`` the largest; every other metric the mean."""
    merged: dict[str, float] = {}
    for key in dict.fromkeys(k for r in results for k in r):
        values = [r[key] for r in results if key in r]
        if key.endswith(SUMMED):
            merged[key] = float(sum(values))
        elif key.endswith("nan_skipped"):
            merged[key] = float(max(values))
        else:
            merged[key] = float(sum(values) / len(values))
    return merged


MERGERS: dict[str, Callable[[Split, Sequence[Any]], Any]] = {
    "generate": _merge_generate,
    "logprob": _merge_rows,
    "values": _merge_rows,
    "score": _merge_scores,
    "update": lambda split, results: merge_update_metrics(results),
}
"""Worker method -> merges the ranks' results (in rank order) into the result of the whole batch."""


def merge_results(method: str, split: Split, results: Sequence[Any]) -> Any:
    return MERGERS[method](split, results)
