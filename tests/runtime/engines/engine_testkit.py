"""Helpers of the engine tests: tiny models and prompt batches made in code (no downloads)."""
from __future__ import annotations

from hybridflow.data.tiny import make_tiny_model
from hybridflow.batch import Batch

PROMPTS = ["1+2=", "13+4=", "9=", "100+200=", "7+7=", "5+0=", "22+3=", "8="]


def tiny_model(tokenizer, seed: int = 0, **kwargs):
    """A fresh random tiny Qwen2 causal LM (hidden 64: fast) matching ``tokenizer``."""
    kwargs.setdefault("hidden", 64)
    return make_tiny_model(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, seed=seed,
                           **kwargs)


def prompt_batch(tokenizer, prompts=PROMPTS) -> Batch:
    """Left-padded prompts with ground truths and data sources as columns."""
    enc = tokenizer(list(prompts), padding=True, return_tensors="pt")
    truths = [str(eval(p[:-1])) for p in prompts]  # "1+2=" -> "3"
    return Batch({"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]},
                 {"ground_truth": truths, "data_source": ["arith"] * len(prompts)})
