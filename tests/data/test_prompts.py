"""Prompt tokenisation: left padding, masks, length limits, chat messages, the prompt Batch."""
from __future__ import annotations

import pytest
import torch

from hybridflow.data import make_prompt_batch, make_tiny_tokenizer, tokenize_prompts
from hybridflow.data.tasks import arithmetic
from hybridflow.errors import DataError


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer("arithmetic")


def test_left_padding_by_hand(tok):
    ids, mask = tokenize_prompts(tok, ["1+2=", "12+34="])
    # "1+2="   -> <bos> 1 + 2 =     = [1, 8, 17, 9, 21], padded on the left by two <pad> (0)
    # "12+34=" -> <bos> 1 2 + 3 4 = = [1, 8, 9, 17, 10, 11, 21]
    assert ids.tolist() == [[0, 0, 1, 8, 17, 9, 21], [1, 8, 9, 17, 10, 11, 21]]
    assert mask.tolist() == [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]]
    assert ids.dtype == mask.dtype == torch.int64


def test_length_limit_raises_or_keeps_the_end(tok):
    with pytest.raises(DataError, match="prompt 1 is 7 tokens, longer than max_prompt_length=5"):
        tokenize_prompts(tok, ["1+2=", "12+34="], max_prompt_length=5)
    ids, mask = tokenize_prompts(tok, ["1+2=", "12+34="], max_prompt_length=5, truncate=True)
    # "12+34=" is [1, 8, 9, 17, 10, 11, 21]; its last five tokens are [9, 17, 10, 11, 21]
    assert ids.tolist() == [[1, 8, 17, 9, 21], [9, 17, 10, 11, 21]]
    assert mask.tolist() == [[1] * 5, [1] * 5]


def test_chat_messages_and_apply_chat_template(tok):
    messages = [{"role": "user", "content": "3+4="}]
    ids, _ = tokenize_prompts(tok, [messages])
    # <bos> <user> 3 + 4 = <eos> <assistant>: the template writes <bos>, so none is added twice
    assert ids.tolist() == [[1, 5, 10, 17, 11, 21, 2, 6]]
    assert torch.equal(tokenize_prompts(tok, ["3+4="], apply_chat_template=True)[0], ids)
    plain = make_tiny_tokenizer("arithmetic")
    plain.chat_template = None
    with pytest.raises(DataError, match="no chat template"):
        tokenize_prompts(plain, [messages])


def test_make_prompt_batch_holds_tensors_and_columns(tok):
    rows = arithmetic.make_arithmetic_rows()[:3] + [{"prompt": "9+9=", "ground_truth": "18", "data_source": "x"}]
    batch = make_prompt_batch(rows, tok, meta={"step": 0})
    assert len(batch) == 4 and batch.meta == {"step": 0}
    assert batch["prompt_ids"].shape == batch["prompt_mask"].shape == (4, 5)
    assert batch["prompt"].tolist() == ["0+0=", "0+1=", "0+2=", "9+9="]
    assert batch["ground_truth"].tolist() == ["0", "1", "2", "18"]
    assert batch["data_source"].tolist() == ["arithmetic"] * 3 + ["x"]
    assert batch["extra_info"][0] == {"a": 0, "b": 0, "op": "+"} and batch["extra_info"][3] == {}
    with pytest.raises(DataError, match="row 0 has no column 'ground_truth'"):
        make_prompt_batch([{"prompt": "1", "data_source": "x"}], tok)


def test_a_cache_tokenises_each_prompt_once_and_changes_nothing(tok):
    class Counting:
        """The tokenizer, counting its encode calls."""

        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def __call__(self, text, **kw):
            self.calls += 1
            return self.inner(text, **kw)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    counting, cache = Counting(tok), {}
    messages = [{"role": "user", "content": "3+4="}]
    prompts = ["1+2=", "12+34=", messages, "1+2="]
    first = tokenize_prompts(counting, prompts, cache=cache)
    assert counting.calls == 3  # "1+2=" twice in the batch: encoded once
    again = tokenize_prompts(counting, list(reversed(prompts)), cache=cache)
    assert counting.calls == 3
    uncached = tokenize_prompts(tok, list(reversed(prompts)))
    assert all(torch.equal(a, b) for a, b in zip(again, uncached))
    assert all(torch.equal(a, b) for a, b in zip(first, tokenize_prompts(tok, prompts)))
    # the chat-template switch is part of the key: the same text encodes differently with it
    templated = tokenize_prompts(counting, ["3+4="], apply_chat_template=True, cache=cache)[0]
    assert counting.calls == 4 and torch.equal(templated, tokenize_prompts(tok, [messages])[0])
