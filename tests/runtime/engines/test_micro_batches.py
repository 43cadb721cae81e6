"""Token-budget micro-batches: the same optimizer step and the same log-probs as fixed-size micro-batches."""
from __future__ import annotations

import copy

import pytest
import torch
from engine_testkit import tiny_model
from test_packing import ragged_batch

from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig
from hybridflow.runtime.engines.micro_batches import micro_batch_groups, restore_row_order, stand_in, width_bucket_groups
from hybridflow.runtime.engines.sequence import row_token_counts

TERMS = [("ppo_clip", 1.0, {}), ("kl_loss", 0.1, {"kl_type": "low_var_kl"}), ("entropy_bonus", 0.01, {})]


def _batch(tokenizer):
    batch = ragged_batch(len(tokenizer), seed=3)
    gen = torch.Generator().manual_seed(4)
    noise = 0.05 * torch.rand(batch["response_mask"].shape, generator=gen)
    return {**{k: v for k, v in batch.items() if k != "weights"}, "advantages": batch.pop("weights"),
            "old_log_probs": -2.0 - noise, "ref_log_probs": -2.0 + noise}


def test_row_token_counts_are_prompt_plus_response_up_to_its_last_valid_token(tokenizer):
    batch = _batch(tokenizer)
    # PROMPT_LENS (3, 6, 1, 4, 5) + RESPONSE_LENS (4, 1, 7, 0, 3); row 2's masked hole still counts
    assert row_token_counts(batch["prompt_mask"], batch["response_mask"]).tolist() == [7, 7, 8, 4, 8]
    groups = micro_batch_groups(batch, micro_batch_size=None, max_tokens=15)
    assert groups == [[0, 2], [1, 4], [3]]  # 8+7, 8+7 (first-fit decreasing), 4
    assert micro_batch_groups(batch, micro_batch_size=2, max_tokens=None) == [[0, 1], [2, 3], [4]]


def test_outputs_come_back_in_row_order_and_stand_ins_add_no_token():
    parts = [torch.tensor([[0.0], [2.0]]), torch.tensor([[1.0], [3.0]])]
    assert restore_row_order(parts, [[0, 2], [1, 3]]).flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    row = stand_in({"response_mask": torch.ones(3, 2), "prompt_ids": torch.arange(6).view(3, 2)})
    assert row["response_mask"].eq(0).all() and row["prompt_ids"].tolist() == [[0, 1]]


@pytest.mark.parametrize("packed", [False, True])
def test_a_token_budget_step_equals_a_fixed_micro_batch_step(tokenizer, packed):
    model = tiny_model(tokenizer, arch="llama")
    batch = _batch(tokenizer)
    results = {}
    for name, budget in (("fixed", dict(micro_batch_size=2)), ("budget", dict(max_tokens_per_micro_batch=15))):
        # eps=1, lr=1: Adam's first step g / (|g| + 1) shows the gradients' difference (see test_packing)
        config = TrainEngineConfig(lr=1.0, eps=1.0, weight_decay=0.0, max_grad_norm=None, precision="fp32",
                                   pack_sequences=packed, **budget)
        engine = TrainEngine(copy.deepcopy(model), config)
        log_probs = engine.compute_log_probs(batch)
        results[name] = log_probs, engine.update(batch, TERMS), engine.module.state_dict()
    valid = batch["response_mask"].bool()
    assert (results["fixed"][0] - results["budget"][0])[valid].abs().max() <= 1e-6
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm", "actor/entropy"):
        assert results["budget"][1][key] == pytest.approx(results["fixed"][1][key], rel=1e-5, abs=1e-6), key
    start = model.state_dict()
    assert max((results["fixed"][2][k] - start[k]).abs().max() for k in start) > 1e-2
    for key, weight in results["fixed"][2].items():
        assert (weight - results["budget"][2][key]).abs().max() <= 1e-5, key


class _BusierPeers(TrainEngine):
    """A rank whose data-parallel peers run ``extra`` more micro-batches (what FSDPTrainEngine's all-reduce reports)."""

    extra = 6

    def _agree_micro_batch_count(self, count: int) -> int:
        return count + self.extra


def test_a_rank_with_fewer_micro_batches_splits_them_and_runs_stand_ins_without_changing_the_step(tokenizer):
    # 5 rows in 3 budget groups must become 9 micro-batches: split into 5 single rows, then 4 zero-mask stand-ins
    model = tiny_model(tokenizer)
    batch = _batch(tokenizer)
    results = {}
    for cls in (TrainEngine, _BusierPeers):
        config = TrainEngineConfig(lr=1.0, eps=1.0, weight_decay=0.0, max_grad_norm=None, precision="fp32",
                                   max_tokens_per_micro_batch=15, pack_sequences=True)
        engine = cls(copy.deepcopy(model), config)
        micro, groups = engine.micro_batches(batch)
        assert len(micro) == 3 + (cls.extra if cls is _BusierPeers else 0)
        results[cls] = engine.compute_log_probs(batch), engine.update(batch, TERMS), engine.module.state_dict()
    (lp, metrics, weights), (lp2, metrics2, weights2) = results[TrainEngine], results[_BusierPeers]
    assert (lp - lp2)[batch["response_mask"].bool()].abs().max() <= 1e-6
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/pg_clipfrac"):
        assert metrics2[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-6), key
    for key, weight in weights.items():
        assert (weight - weights2[key]).abs().max() <= 1e-5, key


def _widths_mask(widths: list[int], limit: int = 8) -> torch.Tensor:
    """A ``(b, limit)`` response mask whose row ``i`` is valid on its first ``widths[i]`` positions."""
    return (torch.arange(limit)[None] < torch.tensor(widths)[:, None]).float()


def test_width_buckets_pick_the_cheapest_count_by_hand():
    # widths 1 x 6 and 8 x 2 (rows shuffled), P = 2, one more micro-batch costs 10 positions:
    # k=1: 8*8 + 8*2 = 80; k=2: 4*1 + 4*8 + 16 + 10 = 62; k=4: 2+2+16+16 + 16 + 30 = 82; k=8: 22 + 16 + 70 = 108
    widths = [8, 1, 1, 1, 8, 1, 1, 1]
    prompt_mask = torch.ones(8, 2)
    groups = width_bucket_groups(prompt_mask, _widths_mask(widths), forward_cost=10)
    assert groups == [[1, 2, 3, 5], [6, 7, 0, 4]]  # stable sort by width, then equal-count cuts
    # one more micro-batch at 30 positions: k=2 costs 82 > 80, so one bucket of all rows in their order
    assert width_bucket_groups(prompt_mask, _widths_mask(widths), forward_cost=30) == [list(range(8))]
    # a long prompt shared by each group of 4 (the shared-prompt forward runs it once per group): k=1 runs
    # 2 prompts of 40, k=2 mixes both groups into each bucket (4 prompts): 64 + 80 = 144 < 36 + 160 + 10 = 206
    groups_of_rows = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    long_prompt = torch.ones(8, 40)
    assert width_bucket_groups(long_prompt, _widths_mask(widths), forward_cost=10,
                               prompt_groups=groups_of_rows) == [list(range(8))]
    assert width_bucket_groups(prompt_mask, _widths_mask([]), forward_cost=10) == []
    assert width_bucket_groups(torch.ones(1, 2), _widths_mask([3]), forward_cost=10) == [[0]]


@pytest.mark.parametrize("skip", [True, False])
def test_width_buckets_give_the_one_micro_batch_step(tokenizer, skip):
    """Spread lengths: the update runs several buckets, each at its own width, and takes the same step.

    Buckets apply where the model's own forward runs (here: a forward hook keeps the lean forward off); the lean
    forward computes valid positions alone and groups attention by width itself, so it runs one bucket."""
    model = tiny_model(tokenizer, arch="qwen2")
    lean_engine = TrainEngine(copy.deepcopy(model), TrainEngineConfig(precision="fp32"))
    model.model.layers[0].register_forward_hook(lambda module, args, out: None)  # the model's forward: exact only
    gen = torch.Generator().manual_seed(5)
    rows, limit = 64, 48
    # 48 short responses and 16 long ones, shuffled: one bucket computes 64 x 48 response positions,
    # two compute about 32 x 4 + 32 x 48 plus the tiny model's cost of one more forward (512 at hidden 64)
    widths = (torch.randint(1, 5, (48,), generator=gen).tolist() + torch.randint(30, 49, (16,), generator=gen).tolist())
    widths = [widths[i] for i in torch.randperm(rows, generator=gen).tolist()]
    prompt_ids = torch.randint(4, len(tokenizer), (rows, 3), generator=gen)
    batch = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones(rows, 3, dtype=torch.long),
             "response_ids": torch.randint(4, len(tokenizer), (rows, limit), generator=gen),
             "response_mask": _widths_mask(widths, limit),
             "advantages": torch.randn(rows, limit, generator=gen) * (torch.arange(rows) % 3 != 0)[:, None],
             "old_log_probs": -2.0 - 0.05 * torch.rand(rows, limit, generator=gen)}
    results = {}
    assert len(lean_engine.micro_batches(batch, buckets=True)[1]) == 1
    for buckets in (False, True):
        config = TrainEngineConfig(lr=1.0, eps=1.0, weight_decay=0.0, max_grad_norm=None, precision="fp32",
                                   length_buckets=buckets, skip_vanishing_rows=skip)
        engine = TrainEngine(copy.deepcopy(model), config)
        parts, groups = engine.micro_batches(batch, buckets=True)
        results[buckets] = engine.update(batch, [("ppo_clip", 1.0, {})]), engine.module.state_dict(), parts, groups
    one, bucketed = results[False], results[True]
    assert len(one[3]) == 1 and len(bucketed[3]) > 1
    assert sorted(row for group in bucketed[3] for row in group) == list(range(rows))
    padded = sum(len(g) * max(widths[i] for i in g) for g in bucketed[3])
    assert padded < rows * max(widths)  # fewer response positions computed
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert bucketed[0][key] == pytest.approx(one[0][key], rel=1e-5, abs=1e-6), key
    start = model.state_dict()
    assert max((one[1][k] - start[k]).abs().max() for k in start) > 1e-3  # eps=1, lr=1: the step is about g
    for key, weight in one[1].items():
        assert (weight - bucketed[1][key]).abs().max() <= 1e-6, key
