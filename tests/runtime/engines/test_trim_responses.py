"""Response columns past the longest response are cut before the train engine's forward: nothing changes."""
from __future__ import annotations

import copy

import torch

from hybridflow.data.tiny import make_tiny_model
from hybridflow.runtime.engines.sequence import trim_response_width
from hybridflow.runtime.engines.train import TrainEngine, TrainEngineConfig


def _batch(width: int, full: int = 12) -> dict:
    """The same rows at response width ``width`` (the first ``width`` of ``full`` columns)."""
    batch = _full_batch(full)
    return {k: (v if k.startswith("prompt_") else v[:, :width].contiguous()) for k, v in batch.items()}


def _full_batch(width: int) -> dict:
    g = torch.Generator().manual_seed(0)
    b, p, used = 6, 5, 4
    lengths = torch.tensor([4, 1, 3, 2, 4, 3])
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    ids = torch.randint(4, 20, (b, width), generator=g) * mask.long()
    adv = torch.randn(b, 1, generator=g).expand(b, width) * mask
    old = -torch.rand(b, width, generator=g) * mask
    assert mask[:, used:].sum() == 0
    return {"prompt_ids": torch.randint(4, 20, (b, p), generator=g), "prompt_mask": torch.ones(b, p, dtype=torch.long),
            "response_ids": ids, "response_mask": mask, "advantages": adv, "old_log_probs": old}


def test_trim_keeps_prompts_and_cuts_padding_columns():
    batch = _batch(9)
    batch["prompt_ids"] = batch["prompt_ids"][:, :1].expand(6, 9)  # a prompt as wide as R is never cut
    cut, width = trim_response_width(batch)
    assert width == 9 and cut["response_ids"].shape == (6, 4) and cut["prompt_ids"].shape == (6, 9)
    assert torch.equal(cut["response_mask"], batch["response_mask"][:, :4])


def test_update_and_log_probs_equal_with_and_without_padding_columns():
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=32, layers=2, heads=4, kv_heads=2)
    terms = [("ppo_clip", 1.0, {"clip_low": 0.2, "clip_high": 0.2})]
    results = {}
    for width in (4, 12):  # 4: no padding column; 12: eight of them
        engine = TrainEngine(copy.deepcopy(model), TrainEngineConfig(lr=1e-2, shuffle=False))
        batch = _batch(width)
        log_probs = engine.compute_log_probs(batch)
        assert log_probs.shape == (6, width) and (log_probs[:, 4:] == 0).all()
        metrics = engine.update(batch, terms)
        results[width] = (log_probs[:, :4], metrics, engine.module.state_dict())
    torch.testing.assert_close(results[12][0], results[4][0], rtol=1e-5, atol=1e-6)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert abs(results[12][1][key] - results[4][1][key]) < 1e-5, key
    for name, value in results[4][2].items():
        torch.testing.assert_close(results[12][2][name], value, rtol=1e-5, atol=1e-6)
