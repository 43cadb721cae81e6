"""Data-parallel dispatch: splitting a batch over ranks and merging the results gives the whole-batch result."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.batch import Batch
from hybridflow.runtime.engines import RewardOutput
from hybridflow.runtime.dispatch import merge_results, merge_update_metrics, split_for_ranks


def _prompts(rows: int) -> Batch:
    return Batch({"prompt_ids": torch.arange(rows * 3).reshape(rows, 3)}, {"ground_truth": [str(i) for i in range(rows)]})


def _generate(part: Batch, n: int) -> Batch:
    """What a rollout engine returns: n responses per prompt, group_index counting its own prompts."""
    out = part.repeat_interleave(n)
    return out.with_fields(response_ids=out["prompt_ids"] * 10 + torch.arange(len(out))[:, None] % n)


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 13), ranks=st.integers(1, 5), n=st.integers(1, 4))
def test_generate_split_and_merge_equals_one_engine(rows, ranks, n):
    batch = _prompts(rows)
    split = split_for_ranks("generate", batch, ranks)
    assert len({len(p) for p in split.parts}) == 1 and split.pad == -rows % ranks  # equal slices, pad < ranks
    merged = merge_results("generate", split, [_generate(p, n) for p in split.parts])
    whole = _generate(batch, n)
    assert torch.equal(merged["group_index"], whole["group_index"])  # groups numbered over the whole batch
    assert torch.equal(merged["prompt_ids"], whole["prompt_ids"])
    assert list(merged["ground_truth"]) == list(whole["ground_truth"])


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 13), ranks=st.integers(1, 5))
def test_row_results_come_back_in_order_without_padding(rows, ranks):
    batch = Batch({"x": torch.arange(rows, dtype=torch.float32)[:, None].repeat(1, 2)})
    split = split_for_ranks("logprob", batch, ranks)
    assert torch.equal(merge_results("logprob", split, [p["x"] * 2 for p in split.parts]), batch["x"] * 2)
    scores = merge_results("score", split, [RewardOutput(p["x"][:, 0], {"acc": p["x"][:, 0].tolist()}) for p in split.parts])
    assert torch.equal(scores.scores, batch["x"][:, 0]) and scores.extras["acc"] == batch["x"][:, 0].tolist()


def test_update_padding_rows_are_masked_out():
    mask = torch.ones(5, 3)
    split = split_for_ranks("update", Batch({"response_mask": mask}), 4)
    # 5 rows -> 8: three copies of the last row, each with an all-zero mask (no loss, no tokens, no gradient)
    padded = torch.cat([p["response_mask"] for p in split.parts])
    assert split.pad == 3 and padded[:5].eq(1).all() and padded[5:].eq(0).all()
    assert mask.eq(1).all()  # the caller's batch is left alone


def test_update_metrics_sum_losses_and_average_the_rest():
    ranks = [{"actor/pg_loss": 0.25, "actor/loss": 0.5, "actor/grad_norm": 2.0, "actor/nan_skipped": 0.0},
             {"actor/pg_loss": 0.75, "actor/loss": 1.0, "actor/grad_norm": 2.0, "actor/nan_skipped": 1.0}]
    # each rank's loss is its share of the global loss; the gradient norm is the same on every rank
    assert merge_update_metrics(ranks) == pytest.approx({"actor/pg_loss": 1.0, "actor/loss": 1.5, "actor/grad_norm": 2.0,
                                                         "actor/nan_skipped": 1.0})
