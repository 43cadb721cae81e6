"""Sequence packing: the packed forward gives the padded forward's log-probs, entropy, values and gradients.

Tiny Qwen2 and Llama models in float32; prompts left-padded and responses right-padded to
varied lengths (one response empty, one with a masked hole inside it, as a tool turn leaves).
Packed vs padded must agree to 1e-5 at every valid response position, and so must every
parameter's gradient of a loss over those positions.
"""
from __future__ import annotations

import copy

import pytest
import torch
from engine_testkit import tiny_model

from hybridflow.errors import OpError
from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig, ValueModel
from hybridflow.runtime.engines.lm_logprobs import response_log_probs
from hybridflow.runtime.engines.packing import flash_attention_usable, pack_rows, packed_forward_kwargs

PROMPT_LENS = (3, 6, 1, 4, 5)
RESPONSE_LENS = (4, 1, 7, 0, 3)
TOLERANCE = 1e-5


def ragged_batch(vocab: int, *, seed: int = 0, width_p: int = 6, width_r: int = 8) -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses of PROMPT_LENS / RESPONSE_LENS tokens (pad id 0)."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(PROMPT_LENS)
    prompt_ids = torch.zeros(rows, width_p, dtype=torch.long)
    prompt_mask = torch.zeros(rows, width_p, dtype=torch.long)
    response_ids = torch.zeros(rows, width_r, dtype=torch.long)
    response_mask = torch.zeros(rows, width_r)
    for row, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        prompt_ids[row, width_p - p:] = torch.randint(3, vocab, (p,), generator=gen)
        prompt_mask[row, width_p - p:] = 1
        response_ids[row, :r] = torch.randint(3, vocab, (r,), generator=gen)
        response_mask[row, :r] = 1.0
    response_mask[2, 3] = 0.0  # a hole: context for later tokens, no loss
    weights = torch.randn(rows, width_r, generator=gen)
    return dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                response_mask=response_mask, weights=weights)


def _sequence_fields(batch):
    return batch["prompt_ids"], batch["prompt_mask"], batch["response_ids"], batch["response_mask"]


def _grads(module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def test_pack_rows_worked_example():
    # row 0: prompt [5 6] (left-padded), response [7 8 9] -> fed 5 6 7 8, states before y_t at 1 2 3 (+0)
    # row 1: prompt [4], response [3] then padding -> fed 4, state before y_0 at packed position 4
    prompt_ids = torch.tensor([[0, 5, 6], [0, 0, 4]])
    prompt_mask = torch.tensor([[0, 1, 1], [0, 0, 1]])
    response_ids = torch.tensor([[7, 8, 9], [3, 0, 0]])
    response_mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    packed = pack_rows(prompt_ids, prompt_mask, response_ids, response_mask)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 4]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0]]
    assert packed.state_index.tolist() == [1, 2, 3, 4]
    assert packed.rows.tolist() == [0, 0, 0, 1] and packed.cols.tolist() == [0, 1, 2, 0]
    assert packed.seq_lens.tolist() == [4, 1]
    flash = packed_forward_kwargs(packed, "flash_attention_2")
    assert flash["cu_seq_lens_q"].tolist() == [0, 4, 5] and flash["max_length_q"] == 4
    assert "cu_seq_lens_q" not in packed_forward_kwargs(packed, "sdpa")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not flash_attention_usable(torch.device("cpu"))  # CPU: sdpa with the block-diagonal mask


def test_a_response_without_a_prompt_token_is_refused():
    with pytest.raises(OpError, match="no prompt token"):
        pack_rows(torch.tensor([[0, 0]]), torch.tensor([[0, 0]]), torch.tensor([[4, 5]]), torch.tensor([[1.0, 1.0]]))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_log_probs_entropy_and_gradients_equal_the_padded(tokenizer, arch):
    model = tiny_model(tokenizer, arch=arch)
    batch = ragged_batch(len(tokenizer))
    mask = batch["response_mask"]
    results = {}
    for packed in (False, True):
        module = copy.deepcopy(model)
        out = response_log_probs(module, *_sequence_fields(batch), with_entropy=True, temperature=0.9, packed=packed)
        ((out.log_probs + 0.1 * out.entropy) * batch["weights"] * mask).sum().backward()
        results[packed] = out, _grads(module)
    (padded, padded_grads), (packed, packed_grads) = results[False], results[True]
    valid = mask.bool()
    assert (padded.log_probs - packed.log_probs)[valid].abs().max() <= TOLERANCE
    assert (padded.entropy - packed.entropy)[valid].abs().max() <= TOLERANCE
    assert padded_grads.keys() == packed_grads.keys() and len(packed_grads) == len(list(model.parameters()))
    for name, grad in padded_grads.items():
        assert (grad - packed_grads[name]).abs().max() <= TOLERANCE, name


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_values_and_gradients_equal_the_padded(tokenizer, arch):
    critic = ValueModel.from_causal_lm(tiny_model(tokenizer, arch=arch))
    batch = ragged_batch(len(tokenizer), seed=1)
    results = {}
    for packed in (False, True):
        module = copy.deepcopy(critic)
        values = module.response_values(*_sequence_fields(batch), packed=packed)
        (values * batch["weights"] * batch["response_mask"]).sum().backward()
        results[packed] = values, _grads(module)
    valid = batch["response_mask"].bool()
    assert (results[False][0] - results[True][0])[valid].abs().max() <= TOLERANCE
    for name, grad in results[False][1].items():
        assert (grad - results[True][1][name]).abs().max() <= TOLERANCE, name
    engine = TrainEngine(copy.deepcopy(critic), TrainEngineConfig(pack_sequences=True, micro_batch_size=2),
                         metric_prefix="critic")
    values = engine.compute_values({k: v for k, v in batch.items() if k != "weights"})
    assert (values - results[False][0])[valid].abs().max() <= TOLERANCE


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_packed_update_equals_the_padded_one(tokenizer, arch):
    """One PPO step (two micro-batches) of a packed engine: the padded engine's losses, gradient norm and weights."""
    model = tiny_model(tokenizer, arch=arch)
    batch = ragged_batch(len(tokenizer), seed=2)
    fields = {k: v for k, v in batch.items() if k != "weights"}
    with torch.no_grad():
        old = response_log_probs(model, *_sequence_fields(batch)).log_probs
    fields.update(old_log_probs=old - 0.05, advantages=batch["weights"])
    terms = [("ppo_clip", 1.0, {}), ("entropy_bonus", 0.01, {})]
    outcome = {}
    for packed in (False, True):
        # eps=1, lr=1: Adam's first step is g / (|g| + 1), within |dg| of the other run's: the weights show the
        # gradients' difference (with eps=1e-8 a near-zero gradient's rounding would move a weight by ~lr)
        config = TrainEngineConfig(lr=1.0, eps=1.0, weight_decay=0.0, max_grad_norm=None, micro_batch_size=3,
                                   pack_sequences=packed, precision="fp32")
        engine = TrainEngine(copy.deepcopy(model), config)
        assert torch.allclose(engine.compute_log_probs(fields)[batch["response_mask"].bool()],
                              old[batch["response_mask"].bool()], atol=TOLERANCE)
        outcome[packed] = engine.update(fields, terms), engine.module.state_dict()
    (padded, padded_weights), (packed, packed_weights) = outcome[False], outcome[True]
    for key in ("actor/pg_loss", "actor/entropy_loss", "actor/grad_norm", "actor/entropy"):
        assert packed[key] == pytest.approx(padded[key], rel=TOLERANCE, abs=TOLERANCE), key
    start = model.state_dict()
    assert max((padded_weights[k] - start[k]).abs().max() for k in start) > 1e-2  # the step moved the weights
    for name, weight in padded_weights.items():
        assert (weight - packed_weights[name]).abs().max() <= TOLERANCE, name
