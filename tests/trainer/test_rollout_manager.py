"""RolloutManager: text in, text out, on the rollout engine the trainers use."""
from __future__ import annotations

from hybridflow import RolloutManager
from hybridflow.data import load_causal_lm, load_tokenizer, make_prompt_batch
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams

PROMPTS = ["2+3=", "14+5=", "7+7="]


def test_greedy_texts_match_the_engine(tiny_model_dir):
    manager = RolloutManager.from_pretrained(tiny_model_dir, max_new_tokens=5, greedy=True)
    texts = manager.generate(PROMPTS)
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir), tokenizer=tokenizer)
    rows = [{"prompt": p, "ground_truth": "", "data_source": "x"} for p in PROMPTS]
    expected = engine.generate(make_prompt_batch(rows, tokenizer), SamplingParams(max_new_tokens=5, greedy=True))
    assert texts == list(expected["responses"]) and len(texts) == 3 and all(isinstance(t, str) for t in texts)


def test_n_samples_per_prompt_and_seeded_reproducibility(tiny_model_dir):
    first = RolloutManager.from_pretrained(tiny_model_dir, max_new_tokens=4, seed=7)
    second = RolloutManager.from_pretrained(tiny_model_dir, max_new_tokens=4, seed=7)
    texts = first.generate(PROMPTS, n=3)
    assert [len(group) for group in texts] == [3, 3, 3]
    assert second.generate(PROMPTS, n=3) == texts
    assert first.generate(PROMPTS, n=3) != texts  # the generator continues: fresh samples on the next call


def test_wraps_a_model_in_memory_and_chat_prompts(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    tokenizer = load_tokenizer(tiny_model_dir)
    manager = RolloutManager(model, tokenizer, SamplingParams(max_new_tokens=3, greedy=True))
    chat = [[{"role": "user", "content": p}] for p in PROMPTS]
    assert manager.generate(chat) == manager.generate(PROMPTS, apply_chat_template=True)
    assert manager.engine.model is model  # no copy: later weight changes are what it samples from
