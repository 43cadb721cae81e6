"""RewardModel: a causal-LM folder loads as sequence classification (new head, warned) and scores."""
from __future__ import annotations

import math

import pytest
import torch
from engine_testkit import prompt_batch

from hybridflow.data.tiny import save_tiny
from hybridflow.runtime.engines import HFRolloutEngine, RewardModel, SamplingParams


def test_causal_lm_folder_scores_with_a_new_head(tokenizer, model, tmp_path):
    path = save_tiny(tmp_path / "lm", model, tokenizer)
    with pytest.warns(UserWarning, match="newly initialised weights: \\['score.weight'\\]"):
        rm = RewardModel.from_pretrained(path)
    batch = HFRolloutEngine(model, tokenizer=tokenizer).generate(prompt_batch(tokenizer),
                                                                  SamplingParams(max_new_tokens=6, seed=2))
    out = rm.score(batch)
    assert out.scores.shape == (len(batch),) and out.scores.dtype == torch.float32
    assert torch.isfinite(out.scores).all() and out.extras == {}
    # Reference: each unpadded prompt + valid response through the model on its own, score at the last token.
    with torch.no_grad():
        for row in range(len(batch)):
            prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
            n = int(batch["response_mask"][row].sum())
            ids = torch.tensor([prompt + batch["response_ids"][row, :n].tolist()])
            hidden = rm.model.base_model(input_ids=ids).last_hidden_state[0, -1]
            assert math.isclose(out.scores[row].item(), rm.model.score(hidden).item(), abs_tol=1e-5)
    # micro-batching changes nothing
    assert torch.allclose(RewardModel(rm.model, micro_batch_size=3).score(batch).scores, out.scores, atol=1e-6)
