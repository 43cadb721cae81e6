"""decode_groups / HFRolloutEngine.generate_stream: the same tokens as one decode, handed back group by group as groups end."""
from __future__ import annotations

import pytest
import torch

from hybridflow.batch import Batch
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams
from hybridflow.runtime.engines.decode import decode
from hybridflow.runtime.engines.stream_decode import decode_groups


def _join(pieces):
    rows = torch.cat([r for r, _ in pieces])
    order = torch.argsort(rows)
    return rows, order


@pytest.mark.parametrize("path", ["lean", "hf"])
@pytest.mark.parametrize("n", [1, 3])
def test_pieces_put_back_in_row_order_are_the_one_decode_bit_for_bit(model, prompts, path, n):
    params = SamplingParams(max_new_tokens=24, n=n, seed=0)
    eos, pad = (1,), 0
    ids, mask = prompts["prompt_ids"], prompts["prompt_mask"]
    whole = decode(model, ids, mask, params, eos_token_ids=eos, pad_token_id=pad,
                   generator=torch.Generator().manual_seed(3), path=path)
    generator = torch.Generator().manual_seed(3)
    pieces = list(decode_groups(model, ids, mask, params, eos_token_ids=eos, pad_token_id=pad, generator=generator,
                                path=path))
    rows, order = _join(pieces)
    assert torch.equal(rows[order], torch.arange(len(ids) * n))  # every row exactly once
    for field in range(3):
        joined = torch.cat([p[1][field] for p in pieces])[order]
        assert torch.equal(joined, whole[field])
    # each piece is whole groups, and the groups of a piece all ended no later than the next piece's
    lengths = whole.response_mask.sum(-1).view(-1, n).max(-1).values
    ends = [lengths[r.view(-1, n)[:, 0] // n] for r, _ in pieces]
    for r, _ in pieces:
        assert torch.equal(r.view(-1, n), r.view(-1, n)[:, :1] + torch.arange(n))
    for earlier, later in zip(ends, ends[1:]):
        assert earlier.max() <= later.min()
    # the generator is left where one decode leaves it
    reference = torch.Generator().manual_seed(3)
    decode(model, ids, mask, params, eos_token_ids=eos, pad_token_id=pad, generator=reference, path=path)
    assert torch.equal(generator.get_state(), reference.get_state())


def test_responses_of_varied_lengths_come_in_several_pieces(model, prompts):
    params = SamplingParams(max_new_tokens=32, n=2, seed=0)
    pieces = list(decode_groups(model, prompts["prompt_ids"], prompts["prompt_mask"], params, eos_token_ids=(1,),
                                pad_token_id=0, generator=torch.Generator().manual_seed(0)))
    lengths = torch.cat([p.response_mask.sum(-1) for _, p in pieces])
    assert lengths.min() < lengths.max()  # the seed gives varied lengths ...
    assert len(pieces) > 1  # ... so the short groups left before the long ones ended


def test_engine_stream_is_generate_with_its_text_and_groups(tokenizer, model, prompts):
    params = SamplingParams(max_new_tokens=20, n=2, seed=5)
    whole = HFRolloutEngine(model, tokenizer=tokenizer, micro_batch_size=6).generate(prompts, params)
    engine = HFRolloutEngine(model, tokenizer=tokenizer, micro_batch_size=6)  # micro-batches of 3 prompts, in turn
    pieces = list(engine.generate_stream(prompts, params))
    rows = torch.cat([r for r, _ in pieces])
    joined = Batch.concat([p for _, p in pieces])[torch.argsort(rows)]
    for name in whole.tensors.keys():
        assert torch.equal(joined[name], whole[name]), name
    assert list(joined["responses"]) == list(whole["responses"])
