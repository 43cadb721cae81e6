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


def grouped_batch(width: int, groups: int = 3, n: int = 4, seed: int = 1, pads: tuple[int, ...] = (0, 2, 1)) -> dict:
    """``groups`` prompts of 6 tokens, prompt ``i`` left-padded by ``pads[i]`` (0 for the rest), each with ``n``
    responses of lengths 1..width (row 0 the longest): the fields of a grouped (GRPO-style) batch."""
    import torch

    g = torch.Generator().manual_seed(seed)
    p = 6
    mask = torch.ones(groups, p, dtype=torch.long)
    for row, pad in enumerate(pads[:groups]):
        mask[row, :pad] = 0
    ids = torch.randint(4, 20, (groups, p), generator=g) * mask
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    b = groups * n
    lengths = torch.randint(1, width + 1, (b,), generator=g)
    lengths[0] = width
    response_mask = (torch.arange(width)[None] < lengths[:, None]).float()
    return {"prompt_ids": ids, "prompt_mask": mask,
            "response_ids": torch.randint(4, 20, (b, width), generator=g) * response_mask.long(),
            "response_mask": response_mask, "generator": g}

