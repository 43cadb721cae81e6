"""Rows grouped by their real token counts: token-budget micro-batches and balanced data-parallel shares.

Pure functions of a list of row lengths (a row's real tokens: its prompt tokens plus its
response up to the last valid position, :func:`~.engines.sequence.row_token_counts`), so
they are the same on every rank and easy to test exhaustively:

* :func:`token_budget_groups` — micro-batches whose token totals stay within a budget
  (first-fit decreasing: rows longest first, each into the first micro-batch it fits; a row
  longer than the budget gets a micro-batch of its own).
* :func:`split_groups` — more micro-batches from fewer (the largest split in two), for
  ranks that must run as many micro-batches as the busiest one (FSDP's collectives).
* :func:`balanced_partition` — ``parts`` equal-sized shares of the rows with nearly equal
  token totals: rows longest first, dealt one round of ``parts`` rows at a time, the
  longest row of a round to the share with the fewest tokens so far. Each round adds its
  rows in the opposite order of the shares' totals, so the spread (largest total minus
  smallest) never exceeds ``max(spread before, the round's longest row)``: it is at most
  the longest row's length.
* :func:`cheapest_equal_cut` — rows already sorted, cut into one of a few numbers of equal-count parts,
  whichever a caller's cost says (width buckets, :mod:`.engines.micro_batches`; attention groups,
  :mod:`.engines.lean_forward`).
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["token_budget_groups", "split_groups", "balanced_partition", "cheapest_equal_cut"]


def _longest_first(lengths: Sequence[int]) -> list[int]:
    """Row indices by decreasing length; equal lengths in index order (deterministic on every rank)."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def token_budget_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices per micro-batch: each micro-batch's total ``<= budget`` unless it is one longer row.

    First-fit decreasing; every row in exactly one group; the rows of a group and the groups (by their
    first row) in index order. ``lengths`` empty -> no group.
    """
    if budget < 1:
        raise ValueError(f"the token budget must be at least 1, got {budget}")
    groups: list[list[int]] = []
    totals: list[int] = []
    for row in _longest_first(lengths):
        size = lengths[row]
        slot = next((g for g, total in enumerate(totals) if total + size <= budget), None)
        if slot is None:
            groups.append([row])
            totals.append(size)
        else:
            groups[slot].append(row)
            totals[slot] += size
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def split_groups(groups: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """``groups`` split until there are ``count`` of them, or until every group holds one row.

    The group with the most rows is cut in two halves (the first of equal ones); returns fewer than
    ``count`` groups only when there are fewer rows than ``count``.
    """
    out = [list(g) for g in groups]
    while len(out) < count:
        largest = max(range(len(out)), key=lambda g: (len(out[g]), -g), default=None)
        if largest is None or len(out[largest]) < 2:
            break
        rows = out[largest]
        out[largest:largest + 1] = [rows[:len(rows) // 2], rows[len(rows) // 2:]]
    return out


def balanced_partition(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """``parts`` shares of ``len(lengths) / parts`` rows each with nearly equal token totals (module docstring).

    Needs ``len(lengths)`` divisible by ``parts``. Each share's rows in index order.
    """
    if parts < 1 or len(lengths) % parts:
        raise ValueError(f"{len(lengths)} rows cannot be cut into {parts} equal shares")
    shares: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    order = _longest_first(lengths)
    for start in range(0, len(order), parts):
        by_total = sorted(range(parts), key=lambda s: (totals[s], s))
        for share, row in zip(by_total, order[start:start + parts]):
            shares[share].append(row)
            totals[share] += lengths[row]
    return [sorted(s) for s in shares]


def cheapest_equal_cut(rows: int, counts: Sequence[int], cost) -> list[int]:
    """The bounds ``[0, ..., rows]`` of the cut of ``rows`` sorted rows into ``k`` parts of equal row counts (``k`` in
    ``counts``, ascending, at most ``rows``) whose ``cost(bounds)`` is least; ties keep fewer parts."""
    best, best_cost = [0, rows], None
    for k in counts:
        if k > rows:
            break
        bounds = [round(i * rows / k) for i in range(k + 1)]
        value = cost(bounds)
        if best_cost is None or value < best_cost:
            best, best_cost = bounds, value
    return best
