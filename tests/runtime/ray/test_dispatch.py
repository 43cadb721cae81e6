"""Data-parallel dispatch: splitting a batch over ranks and merging the results gives the whole-batch result."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.batch import Batch
from hybridflow.runtime.engines import RewardOutput
from hybridflow.runtime.dispatch import balances_tokens, merge_results, merge_update_metrics, split_for_ranks
from hybridflow.runtime.engines.sequence import row_token_counts


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


def _ragged(rows: int, seed: int) -> Batch:
    """Left-padded prompts and right-padded responses of random lengths; ``x`` numbers the rows."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 6, (rows,), generator=gen)
    response = torch.randint(0, 9, (rows,), generator=gen)
    prompt_mask = (torch.arange(6)[None] >= 6 - prompt[:, None]).long()
    response_mask = (torch.arange(9)[None] < response[:, None]).float()
    return Batch({"prompt_mask": prompt_mask, "response_mask": response_mask,
                  "x": torch.arange(rows, dtype=torch.float32)[:, None]})


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 17), ranks=st.integers(1, 5), seed=st.integers(0, 10_000),
       method=st.sampled_from(["logprob", "values", "update"]))
def test_token_balanced_split_is_a_balanced_permutation_and_merges_in_order(rows, ranks, seed, method):
    batch = _ragged(rows, seed)
    split = split_for_ranks(method, batch, ranks, balance_tokens=True)
    padded_rows = rows + split.pad
    assert len({len(p) for p in split.parts}) == 1 and split.pad == -rows % ranks  # equal shares: same micro-batches
    if ranks > 1:
        assert sorted(r for share in split.rows for r in share) == list(range(padded_rows))  # a permutation
    tokens = [int(row_token_counts(p["prompt_mask"], p["response_mask"]).sum()) for p in split.parts]
    longest = int(row_token_counts(*(torch.cat([p[k] for p in split.parts]) for k in ("prompt_mask", "response_mask"))).max())
    assert max(tokens) - min(tokens) <= longest  # balanced within the longest row
    if method != "update":  # results come back in the batch's order, padding dropped
        merged = merge_results(method, split, [p["x"] * 2 for p in split.parts])
        assert torch.equal(merged, batch["x"] * 2)


def test_token_balance_applies_to_roles_that_pack_or_budget_tokens():
    from hybridflow.runtime.engines import TrainEngineConfig
    from hybridflow.runtime.roles import RoleSpec

    assert not balances_tokens(RoleSpec()) and not balances_tokens(RoleSpec(train=TrainEngineConfig()))
    assert balances_tokens(RoleSpec(train=TrainEngineConfig(pack_sequences=True)))
    assert balances_tokens(RoleSpec(train=TrainEngineConfig(max_tokens_per_micro_batch=64)))
    batch = _ragged(8, seed=1)
    assert split_for_ranks("logprob", batch, 2).rows is None  # consecutive slices, as before
    assert split_for_ranks("generate", batch, 2, balance_tokens=True).rows is None  # generation is not dealt
