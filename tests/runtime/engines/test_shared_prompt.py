"""Each distinct prompt run once in the train engine's forward: the same states, gradients and update as the joined rows."""
from __future__ import annotations

import copy

import pytest
import torch
from engine_testkit import grouped_batch

from hybridflow.data.tiny import make_tiny_model
from hybridflow.runtime.engines import lm_logprobs
from hybridflow.runtime.engines.critic import ValueModel
from hybridflow.runtime.engines.grad_slots import gradients_into
from hybridflow.runtime.engines.sequence import join_prompt_response, response_hidden
from hybridflow.runtime.engines.shared_prompt import (MIN_SAVED_POSITIONS, REFERENCE_WIDTH, min_saved_positions,
                                                     prompt_groups, shared_response_hidden)
from hybridflow.runtime.engines.train import TrainEngine, TrainEngineConfig

WIDTH = REFERENCE_WIDTH
"""The models' hidden size: the one at which sharing needs MIN_SAVED_POSITIONS (64) saved positions."""


def test_min_saved_positions_scales_inversely_with_the_width():
    # ceil(64 * 256 / hidden): 64 -> 256 (the tiny model), 256 -> 64, 4096 -> 4, 100 -> ceil(163.84) = 164
    assert [min_saved_positions(h) for h in (64, 256, 4096, 100)] == [256, 64, 4, 164]
    assert min_saved_positions(None) == MIN_SAVED_POSITIONS


def test_a_narrow_model_shares_only_where_it_saves_more_positions():
    # hidden 64: 256 positions. 3 groups of 8 with P = 6 save 21 x 6 = 126 (joined); 8 groups save 56 x 6 = 336
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=64, layers=2, heads=4, kv_heads=2).eval()
    for groups, used in ((3, False), (8, True)):
        batch = _group_batch(groups=groups)
        fields = [batch[k] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")]
        assert (shared_response_hidden(model.base_model, *fields) is not None) == used, groups


def _group_batch(width: int = 5, groups: int = 3, n: int = 8, seed: int = 1) -> dict:
    """``groups`` left-padded prompts (of different padding) x ``n`` responses of lengths 1..width, with advantages and
    old log-probs."""
    batch = grouped_batch(width, groups, n, seed)
    g, response_mask = batch.pop("generator"), batch["response_mask"]
    b = response_mask.shape[0]
    return {**batch, "advantages": torch.randn(b, 1, generator=g).expand(b, width) * response_mask,
            "old_log_probs": -torch.rand(b, width, generator=g) * response_mask}


def test_prompt_groups_finds_repeats_and_tells_paddings_apart():
    ids = torch.tensor([[0, 5, 6], [1, 2, 3], [0, 5, 6], [1, 2, 3], [9, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1]])
    first, inverse = prompt_groups(ids, mask)
    assert torch.equal(ids[first][inverse] * mask, ids * mask)
    assert len(first) == 2 and inverse[0] == inverse[2] == inverse[4] and inverse[1] == inverse[3]
    assert prompt_groups(ids[:2], mask[:2]) is None  # nothing repeats
    mask[2, 0] = 1  # same ids, another padding: another prompt
    first, inverse = prompt_groups(ids, mask)
    assert len(first) == 3 and inverse[0] != inverse[2]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("width", [1, 5])
def test_states_and_gradients_equal_the_joined_rows(arch, width):
    torch.manual_seed(0)
    model = make_tiny_model(arch, vocab_size=24, hidden=WIDTH, layers=2, heads=4, kv_heads=2).train()
    batch = _group_batch(width)
    fields = [batch[k] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")]
    valid = batch["response_mask"].bool()
    results = []
    for shared in (False, True):
        model.zero_grad()
        if shared:
            hidden = shared_response_hidden(model.base_model, *fields)
        else:
            hidden = response_hidden(model.base_model, join_prompt_response(*fields), fields[0].shape[-1])
        assert hidden.shape == (len(valid), width, WIDTH)
        (hidden[valid] * torch.linspace(-1, 1, WIDTH)).sum().backward()
        results.append((hidden[valid].detach(), {k: p.grad.clone() for k, p in model.named_parameters()
                                                 if p.grad is not None}))
    (joined, joined_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, joined, rtol=1e-5, atol=1e-5)
    assert joined_grads.keys() == shared_grads.keys() and len(joined_grads) > 0
    for name, grad in joined_grads.items():
        scale = float(grad.abs().max())  # float error of a sum over the width grows with its terms
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-4 * scale), (name, scale)


def test_not_used_with_active_dropout_or_distinct_prompts():
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=WIDTH, layers=2, heads=4, kv_heads=2)
    batch = _group_batch()
    fields = [batch[k] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")]
    model.config.attention_dropout = 0.1
    assert shared_response_hidden(model.base_model.train(), *fields) is None  # copies would share a dropout mask
    assert shared_response_hidden(model.base_model.eval(), *fields) is not None  # eval: no dropout
    model.config.attention_dropout = 0.0
    distinct = [f[::8] for f in fields]
    assert shared_response_hidden(model.base_model.train(), *distinct) is None
    one_group = [f[:8] for f in fields]  # saves 7 x 6 prompt positions: not worth a second backbone call
    assert (8 - 1) * 6 < min_saved_positions(WIDTH) == MIN_SAVED_POSITIONS
    assert shared_response_hidden(model.base_model, *one_group) is None


def test_update_log_probs_and_values_equal_the_joined_rows(monkeypatch):
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=WIDTH, layers=2, heads=4, kv_heads=2)
    terms = [("ppo_clip", 1.0, {"clip_low": 0.2, "clip_high": 0.2})]
    batch = _group_batch()
    results, used = {}, []

    def recording(*args, **kwargs):
        hidden = shared_response_hidden(*args, **kwargs)
        used.append(hidden is not None)
        return hidden

    for shared in (True, False):
        monkeypatch.setattr(lm_logprobs, "shared_response_hidden", recording if shared else (lambda *a, **k: None))
        # micro-batches of 16 rows: two groups shared, then one group of 8 joined (too few positions saved)
        engine = TrainEngine(copy.deepcopy(model), TrainEngineConfig(lr=1e-2, shuffle=False, micro_batch_size=16))
        grads = {}  # each step's gradients as the optimizer gets them (after the step, AdamW's lr-sized moves of
        # gradients that are ~0 up to rounding differ by up to the lr)
        engine.optimizer.register_step_pre_hook(lambda opt, args, kwargs, grads=grads, module=engine.module: grads.update(
            {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}))
        log_probs = engine.compute_log_probs(batch)
        metrics = engine.update(batch, terms)
        results[shared] = (log_probs, metrics, grads)
    assert used == [True, False, True, False]  # compute_log_probs, then update: each micro-batch
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-6)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert abs(results[True][1][key] - results[False][1][key]) < 1e-5, key
    assert results[True][2].keys() == results[False][2].keys() and len(results[False][2]) > 10
    for name, value in results[False][2].items():
        torch.testing.assert_close(results[True][2][name], value, rtol=1e-5, atol=1e-6)
    critic = ValueModel.from_causal_lm(model)
    fields = [batch[k] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")]
    values = critic.response_values(*fields)
    joined = critic.value_head(response_hidden(critic.backbone, join_prompt_response(*fields), 6)).squeeze(-1)
    valid = batch["response_mask"].bool()
    torch.testing.assert_close(values[valid], joined.float()[valid], rtol=1e-5, atol=1e-5)


def test_weight_gradients_go_into_the_buffers_as_computed_with_the_numbers_autograd_sums():
    # each weight is used twice (responses, then prompts); autograd holds the responses' gradient until the prompts'
    # backward adds theirs, then adds the sum to .grad once. Inside gradients_into the lean backward adds each into
    # the weight's buffer as it computes it (two adds): 0 + a + b is a + b to the bit. The embedding too: each use's
    # rows summed as autograd's dense backward sums them, then added into the buffer's rows
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=WIDTH, layers=2, heads=4, kv_heads=2).train()
    fields = [_group_batch()[k] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")]
    projections = {name for name, _ in model.named_parameters() if "proj.weight" in name}
    direct_names = projections | {"model.embed_tokens.weight"}
    results = []
    for direct in (False, True):
        grads = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
        for name, p in model.named_parameters():
            p.grad = grads[name]
        versions = {name: g._version for name, g in grads.items()}
        hidden = shared_response_hidden(model.base_model, *fields)
        assert hidden is not None
        with gradients_into({id(p): grads[name] for name, p in model.named_parameters()} if direct else {}):
            (hidden * torch.linspace(-1, 1, WIDTH)).sum().backward()
        assert all(p.grad is grads[name] for name, p in model.named_parameters())
        adds = {name: g._version - versions[name] for name, g in grads.items()}
        results.append((grads, adds))
    (summed, autograd_adds), (direct, direct_adds) = results
    assert len(projections) == 14 and all(autograd_adds[name] == 1 for name in projections)
    assert autograd_adds["model.embed_tokens.weight"] == 1
    assert {n: direct_adds[n] for n in direct_names} == dict.fromkeys(direct_names, 2)  # both uses, each when computed
    others = {name: adds for name, adds in autograd_adds.items() if name not in direct_names}
    assert {name: direct_adds[name] for name in others} == others  # biases, norms: autograd's one add
    for name, grad in summed.items():
        assert torch.equal(direct[name], grad), name
