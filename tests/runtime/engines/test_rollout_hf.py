"""HFRolloutEngine: KV-cached decoding against a slow reference, groups, EOS handling, weight sync."""
from __future__ import annotations

import copy

import pytest
import torch

from hybridflow.errors import ExecutionError
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams

from engine_testkit import PROMPTS, prompt_batch, tiny_model


@torch.no_grad()
def slow_greedy(model, ids: list[int], max_new: int, eos: int, pad: int = 0) -> list[int]:
    """Argmax decoding of one unpadded prompt, re-running the whole sequence each step (no KV cache).

    It stops after the first EOS or pad token (a sampled pad ends a response too).
    """
    seq, out = list(ids), []
    for _ in range(max_new):
        token = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
        out.append(token)
        seq.append(token)
        if token in (eos, pad):
            break
    return out


def valid_tokens(batch, row: int) -> list[int]:
    n = int(batch["response_mask"][row].sum())
    return batch["response_ids"][row, :n].tolist()


def test_greedy_matches_slow_reference_and_is_deterministic(tokenizer, model, prompts):
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=10)
    first = engine.generate(prompts, params)
    again = engine.generate(prompts, params)
    assert torch.equal(first["response_ids"], again["response_ids"])
    for row, text in enumerate(PROMPTS):
        ids = tokenizer(text)["input_ids"]  # unpadded: padding and the cache must not change the argmax path
        assert valid_tokens(first, row) == slow_greedy(model, ids, 10, tokenizer.eos_token_id, tokenizer.pad_token_id)


def test_output_fields_shapes_and_dtypes(tokenizer, model, prompts):
    out = HFRolloutEngine(model, tokenizer=tokenizer).generate(prompts, SamplingParams(max_new_tokens=6, seed=0))
    b = len(PROMPTS)
    assert out["response_ids"].shape == (b, 6) and out["response_ids"].dtype == torch.int64
    assert out["response_mask"].dtype == torch.float32 and out["rollout_log_probs"].dtype == torch.float32
    assert out["group_index"].tolist() == list(range(b))
    assert list(out["ground_truth"]) == list(prompts["ground_truth"])
    assert (out["rollout_log_probs"] <= 0).all()


def test_n_samples_per_prompt_form_aligned_groups(tokenizer, model, prompts):
    out = HFRolloutEngine(model, tokenizer=tokenizer).generate(prompts, SamplingParams(n=3, max_new_tokens=4, seed=1))
    assert len(out) == 3 * len(PROMPTS)
    assert out["group_index"].tolist() == [i for i in range(len(PROMPTS)) for _ in range(3)]
    for row, group in enumerate(out["group_index"].tolist()):
        assert torch.equal(out["prompt_ids"][row], prompts["prompt_ids"][group])
        assert out["ground_truth"][row] == prompts["ground_truth"][group]
    # samples within a group differ somewhere (temperature 1 over a random model)
    assert not all(torch.equal(out["response_ids"][3 * g], out["response_ids"][3 * g + 1]) for g in range(len(PROMPTS)))


def test_stop_at_eos_masks_the_rest(tokenizer, model):
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    batch = prompt_batch(tokenizer, PROMPTS * 8)
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    out = engine.generate(batch, SamplingParams(max_new_tokens=16, temperature=2.0, seed=3))
    ids, mask, logp = out["response_ids"], out["response_mask"], out["rollout_log_probs"]
    stopped = 0
    for row in range(len(out)):
        hits = ((ids[row] == eos) | (ids[row] == pad)).nonzero().flatten().tolist()
        end = hits[0] + 1 if hits else ids.shape[1]  # one past the first EOS (or sampled pad)
        at_eos = bool(hits) and int(ids[row, hits[0]]) == eos
        stopped += at_eos
        assert mask[row].tolist() == [1.0] * end + [0.0] * (ids.shape[1] - end)
        assert (ids[row, end:] == pad).all() and (logp[row, end:] == 0).all()
        assert out["responses"][row] == tokenizer.decode(ids[row, :end - 1 if at_eos else end].tolist())
    assert 0 < stopped < len(out)  # both kinds of rows occurred, so both branches were checked
    no_stop = engine.generate(batch, SamplingParams(max_new_tokens=16, temperature=2.0, seed=3, stop_at_eos=False))
    assert (no_stop["response_mask"] == 1).all()


class _Favour:
    """A forward hook that adds ``bonus`` to one token's logit at decoding step ``at`` (0 = the prefill)."""

    def __init__(self, token: int, at: int, bonus: float = 50.0):
        self.token, self.at, self.bonus, self.calls = token, at, bonus, 0

    def __call__(self, module, args, output):
        if self.calls == self.at:
            output.logits[..., -1, self.token] += self.bonus
        self.calls += 1
        return output


def test_a_sampled_pad_ends_the_response_as_unfinished(tokenizer, model):
    # The model is pushed to sample <pad> as its second token: the response must end there,
    # pad kept and masked in (its log-prob is real and will be trained), and the rule reward
    # must see a response that did not end with EOS (unfinished_score), not "d<pad>..." text.
    from hybridflow.runtime.engines.rule_reward import RuleRewardSource

    pad = tokenizer.pad_token_id
    batch = prompt_batch(tokenizer, PROMPTS)
    handle = model.register_forward_hook(_Favour(pad, at=1))
    try:
        out = HFRolloutEngine(model, tokenizer=tokenizer).generate(batch, SamplingParams(max_new_tokens=6, seed=0))
    finally:
        handle.remove()
    ids, mask, logp = out["response_ids"], out["response_mask"], out["rollout_log_probs"]
    first_stop = ((ids == tokenizer.eos_token_id) | (ids == pad)).float().argmax(-1)
    ended_by_pad = (ids[:, 1] == pad) & (ids[:, 0] != tokenizer.eos_token_id) & (ids[:, 0] != pad)
    assert ended_by_pad.all(), ids  # the bonus made every row sample pad at step 1
    assert (first_stop == 1).all()
    assert torch.equal(mask, torch.tensor([[1.0, 1.0] + [0.0] * 4] * len(out)))
    assert (logp[:, 1] > -1e-3).all() and (logp[:, 2:] == 0).all()  # pad was near-certain, then nothing
    scorer = RuleRewardSource(lambda source, text, truth, info=None: 1.0, tokenizer=tokenizer,
                              eos_token_ids=[tokenizer.eos_token_id], unfinished_score=-1.0)
    assert scorer.score(out).scores.tolist() == [-1.0] * len(out)


def test_top_k_1_sampling_equals_greedy(tokenizer, model, prompts):
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    greedy = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=8))
    top1 = engine.generate(prompts, SamplingParams(top_k=1, temperature=1.7, max_new_tokens=8, seed=5))
    assert torch.equal(greedy["response_ids"], top1["response_ids"])


def test_seed_makes_runs_reproducible(tokenizer, model, prompts):
    params = SamplingParams(max_new_tokens=8, seed=11)
    a, b = HFRolloutEngine(model), HFRolloutEngine(model)
    first_a, first_b = a.generate(prompts, params), b.generate(prompts, params)
    assert torch.equal(first_a["response_ids"], first_b["response_ids"])
    second_a = a.generate(prompts, params)  # the generator continues: fresh samples
    assert not torch.equal(first_a["response_ids"], second_a["response_ids"])


def test_micro_batches_give_the_same_greedy_result(tokenizer, model, prompts):
    params = SamplingParams(greedy=True, max_new_tokens=8)
    whole = HFRolloutEngine(model).generate(prompts, params)
    pieces = HFRolloutEngine(model, micro_batch_size=3).generate(prompts, params)
    assert torch.equal(whole["response_ids"], pieces["response_ids"])
    assert torch.allclose(whole["rollout_log_probs"], pieces["rollout_log_probs"], atol=1e-5)
    # with groups: pieces hold whole groups (6 // 2 = 3 prompts), the rows line up with the repeated batch
    grouped = HFRolloutEngine(model, micro_batch_size=6).generate(prompts, params.model_copy(update={"n": 2}))
    assert torch.equal(grouped["response_ids"][::2], whole["response_ids"])
    assert torch.equal(grouped["response_ids"][1::2], whole["response_ids"])
    assert grouped["group_index"].tolist() == [i // 2 for i in range(2 * len(PROMPTS))]


def test_load_weights_updates_a_separate_copy(tokenizer, model, prompts):
    params = SamplingParams(greedy=True, max_new_tokens=8)
    trained = tiny_model(tokenizer, seed=1)  # stands for the train engine's updated weights
    engine = HFRolloutEngine(copy.deepcopy(model))
    before = engine.generate(prompts, params)["response_ids"]
    copied = engine.load_weights(trained.named_parameters())
    assert copied == len(list(trained.named_parameters()))
    after = engine.generate(prompts, params)["response_ids"]
    assert torch.equal(after, HFRolloutEngine(trained).generate(prompts, params)["response_ids"])
    assert not torch.equal(before, after)


def test_load_weights_with_a_shared_module_copies_nothing(model):
    engine = HFRolloutEngine(model)
    assert engine.load_weights(model.state_dict()) == 0


def test_load_weights_rejects_unknown_names_and_shapes(model):
    engine = HFRolloutEngine(model)
    with pytest.raises(ExecutionError, match="no parameter 'nope'"):
        engine.load_weights({"nope": torch.zeros(1)})
    name, tensor = next(iter(model.state_dict().items()))
    with pytest.raises(ExecutionError, match="shape"):
        engine.load_weights([(name, torch.zeros(tensor.shape[0] + 1))])
