"""Partial rollouts in the HF rollout engine: a generation cut into segments and continued (engines/segments.py).

* unchanged weights: cut and continued is the uncut generation to the bit (tokens, masks, log-probs, the
  sampler's generator afterwards), whether the continuation finds its kept KV cache or recomputes it;
* changed weights: the kept tokens, log-probs and versions are untouched, the tokens after the cut carry the
  new version and their log-probs are the new weights' (checked against a slow reference without a cache).
"""
from __future__ import annotations

import pytest
import torch

from hybridflow.errors import ExecutionError
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams

from engine_testkit import tiny_model

PARAMS = SamplingParams(n=3, max_new_tokens=12, seed=5, temperature=1.3)
FIELDS = ("response_ids", "response_mask", "rollout_log_probs")


def run_segments(engine, prompts, params, first: int, then: int | None):
    """Generate with a cut after ``first`` positions, then continue ``then`` positions at a time (None: to the end)."""
    part = engine.generate(prompts, params, segment_tokens=first)
    cuts = [part["decoded_steps"].clone()]
    while not bool(part["rollout_finished"].all()):
        part = engine.generate(part, params, resume=True, segment_tokens=then)
        cuts.append(part["decoded_steps"].clone())
    return part, cuts


@pytest.mark.parametrize("params", [PARAMS, PARAMS.model_copy(update={"top_k": 5, "top_p": 0.9}),
                                    SamplingParams(greedy=True, max_new_tokens=9)], ids=["sampled", "truncated", "greedy"])
@pytest.mark.parametrize("then", [1, 3, None])
def test_cut_and_continued_with_unchanged_weights_is_the_uncut_generation(tokenizer, model, prompts, params, then):
    whole_engine, cut_engine = HFRolloutEngine(model, tokenizer=tokenizer), HFRolloutEngine(model, tokenizer=tokenizer)
    whole = whole_engine.generate(prompts, params)
    cut, cuts = run_segments(cut_engine, prompts, params, 4, then)
    assert len(cuts) > 1  # some responses were still going at the cut
    for name in FIELDS:
        assert torch.equal(whole[name], cut[name]), name
    assert torch.equal(whole["policy_version"], cut["policy_version"])
    assert list(whole["responses"]) == list(cut["responses"])
    # the generator advanced by the same draws: the next generation of both engines is the same too
    assert whole_engine.rng_state() == cut_engine.rng_state()


def test_a_recomputed_kv_cache_gives_the_same_tokens(tokenizer, model, prompts):
    """A continuation in an engine that did not make the cut (no kept cache: the prefill recomputes it) samples the
    same tokens; its log-probs differ from the cached ones only by float rounding of a differently shaped matmul."""
    params = PARAMS
    whole = HFRolloutEngine(model, tokenizer=tokenizer).generate(prompts, params)
    first = HFRolloutEngine(model, tokenizer=tokenizer)
    part = first.generate(prompts, params, segment_tokens=4)
    other = HFRolloutEngine(model, tokenizer=tokenizer)
    other.set_rng_state(first.rng_state())  # the same sampler stream, none of the first engine's caches
    out = other.generate(part, params, resume=True)
    assert torch.equal(whole["response_ids"], out["response_ids"])
    assert torch.equal(whole["response_mask"], out["response_mask"])
    assert torch.equal(whole["rollout_log_probs"][:, :4], out["rollout_log_probs"][:, :4])  # kept: untouched
    assert torch.allclose(whole["rollout_log_probs"], out["rollout_log_probs"], atol=1e-5)


@torch.no_grad()
def slow_log_probs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature: float) -> torch.Tensor:
    """Reference: each row's unpadded prompt + response through the model at once (no cache), log_softmax(z / T)
    at every response token, 0 at padding."""
    out = torch.zeros(response_ids.shape)
    for row in range(len(response_ids)):
        prompt = prompt_ids[row][prompt_mask[row].bool()]
        length = int(response_mask[row].sum())
        seq = torch.cat([prompt, response_ids[row, :length]])
        logits = model(input_ids=seq[None]).logits[0, len(prompt) - 1:len(prompt) - 1 + length].float()
        out[row, :length] = torch.log_softmax(logits / temperature, -1).gather(-1, response_ids[row, :length, None])[:, 0]
    return out


def test_continued_under_new_weights_keeps_what_was_decoded_and_switches_version_at_the_cut(tokenizer, model, prompts):
    engine = HFRolloutEngine(tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    engine.policy_version = 3
    part = engine.generate(prompts, PARAMS, segment_tokens=5)
    going = ~part["rollout_finished"]
    assert going.any() and not going.all()
    newer = tiny_model(tokenizer, seed=1)  # stands for the weights after an update
    engine.load_weights(newer.state_dict())
    engine.policy_version = 4  # the worker counts the sync
    out = engine.generate(part, PARAMS, resume=True)
    assert bool(out["rollout_finished"].all())
    for name in (*FIELDS, "policy_version"):  # the first 5 positions are the segment's, untouched
        assert torch.equal(out[name][:, :5], part[name][:, :5]), name
    mask = out["response_mask"]
    expected = torch.where(mask > 0, torch.where(torch.arange(12) < 5, 3, 4), -1)
    assert torch.equal(out["policy_version"], expected)
    assert torch.equal(out["response_mask"][~going], part["response_mask"][~going])  # finished rows: not decoded on
    args = (out["prompt_ids"], out["prompt_mask"], out["response_ids"], mask, PARAMS.temperature)
    old = slow_log_probs(tiny_model(tokenizer, seed=0), *args)
    new = slow_log_probs(newer, *args)
    before, after = (torch.arange(12) < 5).expand_as(mask) * mask, (torch.arange(12) >= 5).expand_as(mask) * mask
    assert ((out["rollout_log_probs"] - old) * before).abs().max() < 1e-5  # decoded by the old weights
    assert ((out["rollout_log_probs"] - new) * after).abs().max() < 1e-5  # and on by the new ones
    assert ((old - new) * after).abs().max() > 1e-3  # the two models do differ there


def test_segments_of_several_pieces_continue_each_piece(tokenizer, model, prompts):
    """With micro-batches the pieces are cut and continued piece by piece; every row ends, versions are stamped."""
    engine = HFRolloutEngine(model, tokenizer=tokenizer, micro_batch_size=6)
    out, cuts = run_segments(engine, prompts, PARAMS, 2, 2)
    assert len(out) == 3 * len(prompts) and bool(out["rollout_finished"].all())
    assert torch.equal(out["policy_version"] >= 0, out["response_mask"] > 0)
    assert all(torch.all(later >= earlier) for earlier, later in zip(cuts, cuts[1:]))


def test_every_generation_records_its_version(tokenizer, model, prompts):
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    engine.policy_version = 7
    out = engine.generate(prompts, SamplingParams(max_new_tokens=6, seed=0))
    assert out["policy_version"].dtype == torch.int64 and out["policy_version"].shape == (len(prompts), 6)
    assert torch.equal(out["policy_version"], torch.where(out["response_mask"] > 0, 7, -1))
    assert "decoded_steps" not in out  # no cut asked for: no partial state


def test_bad_partial_requests_are_named(tokenizer, model, prompts):
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    with pytest.raises(ExecutionError, match="segment_tokens must be at least 1"):
        engine.generate(prompts, PARAMS, segment_tokens=0)
    with pytest.raises(ExecutionError, match="lacks .*decoded_steps"):
        engine.generate(prompts, PARAMS, resume=True)
    part = engine.generate(prompts, PARAMS, segment_tokens=2)
    with pytest.raises(ExecutionError, match="max_new_tokens is 20"):
        engine.generate(part, PARAMS.model_copy(update={"max_new_tokens": 20}), resume=True)
