"""Token partitions: budget micro-batches hold every row once within the budget; rank shares are balanced."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.runtime.token_partition import balanced_partition, split_groups, token_budget_groups

lengths_st = st.lists(st.integers(0, 60), min_size=0, max_size=40)


def test_budget_worked_example():
    # rows 0..5 of 3, 9, 2, 7, 1, 12 tokens, budget 10, longest first, each into the first group it fits:
    # 12 alone (over budget); 9 opens a group; 7 opens one (9+7 > 10); 3 joins 7 (= 10);
    # 2 fits nowhere (9+2, 10+2 > 10) and opens one; 1 joins 9 (= 10).
    assert token_budget_groups([3, 9, 2, 7, 1, 12], 10) == [[0, 3], [1, 4], [2], [5]]


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, budget=st.integers(1, 80))
def test_budget_groups_cover_every_row_once_within_the_budget(lengths, budget):
    groups = token_budget_groups(lengths, budget)
    assert sorted(r for g in groups for r in g) == list(range(len(lengths)))
    for group in groups:
        assert group == sorted(group) and (sum(lengths[r] for r in group) <= budget or len(group) == 1)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6), count=st.integers(0, 30))
def test_split_groups_reaches_the_count_while_rows_last(sizes, count):
    groups, start = [], 0
    for size in sizes:
        groups.append(list(range(start, start + size)))
        start += size
    out = split_groups(groups, count)
    assert [r for g in out for r in g] == list(range(start))  # the same rows, in the same order
    assert len(out) == max(len(groups), min(count, start)) and all(out)


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, parts=st.integers(1, 6))
def test_balanced_partition_is_an_equal_sized_permutation_balanced_within_the_longest_row(lengths, parts):
    lengths = lengths[:len(lengths) - len(lengths) % parts]
    shares = balanced_partition(lengths, parts)
    assert sorted(r for s in shares for r in s) == list(range(len(lengths)))
    assert len(shares) == parts and len({len(s) for s in shares}) == 1
    totals = [sum(lengths[r] for r in s) for s in shares]
    assert max(totals) - min(totals) <= max(lengths, default=0)


def test_balanced_partition_beats_consecutive_slices():
    lengths = [50, 48, 45, 40, 5, 4, 3, 1]  # consecutive halves: 183 vs 13
    totals = [sum(lengths[r] for r in s) for s in balanced_partition(lengths, 2)]
    assert max(totals) - min(totals) <= 10


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="budget"):
        token_budget_groups([1], 0)
    with pytest.raises(ValueError, match="equal shares"):
        balanced_partition([1, 2, 3], 2)
