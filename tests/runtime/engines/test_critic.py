"""ValueModel: values aligned with response tokens; critic updates through the TrainEngine."""
from __future__ import annotations

import math

import pytest
import torch
from engine_testkit import prompt_batch

from hybridflow.data.tiny import save_tiny
from hybridflow.errors import OpError
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams, TrainEngine, TrainEngineConfig, ValueModel


def critic_batch(tokenizer, model):
    batch = HFRolloutEngine(model, tokenizer=tokenizer).generate(prompt_batch(tokenizer),
                                                                  SamplingParams(max_new_tokens=6, seed=0))
    return batch


@torch.no_grad()
def test_values_are_the_state_before_each_response_token(tokenizer, model):
    batch = critic_batch(tokenizer, model)
    critic = ValueModel.from_causal_lm(model).eval()
    values = critic.response_values(batch["prompt_ids"], batch["prompt_mask"], batch["response_ids"],
                                    batch["response_mask"])
    assert values.shape == batch["response_ids"].shape and values.dtype == torch.float32
    for row in range(len(batch)):
        prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()  # unpadded
        response = batch["response_ids"][row].tolist()
        for t in range(int(batch["response_mask"][row].sum())):
            # V(s_t): the value at the last position of prompt + y_<t, computed on its own.
            ids = torch.tensor([prompt + response[:t]])
            ref = critic(ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None])[0, -1]
            assert math.isclose(values[row, t].item(), ref.item(), abs_tol=1e-5), (row, t)


def test_from_pretrained_keeps_the_backbone_weights(tokenizer, model, tmp_path):
    save_tiny(tmp_path / "lm", model, tokenizer)
    critic = ValueModel.from_pretrained(tmp_path / "lm")
    own = critic.backbone.state_dict()
    for name, tensor in model.base_model.state_dict().items():
        assert torch.equal(own[name], tensor), name
    assert critic.value_head.out_features == 1


def test_critic_update_reduces_the_value_loss(tokenizer, model):
    batch = critic_batch(tokenizer, model)
    returns = torch.linspace(-1, 1, batch["response_mask"].numel()).view_as(batch["response_mask"])
    engine = TrainEngine(ValueModel.from_causal_lm(model),
                         TrainEngineConfig(lr=3e-3, micro_batch_size=4, max_grad_norm=None), metric_prefix="critic")
    batch = batch.with_fields(values=engine.compute_values(batch), returns=returns)
    terms = [("value_clip", 1.0, {"clip_range": 10.0})]
    losses = [engine.update(batch, terms)["critic/vf_loss"] for _ in range(15)]
    metrics = engine.update(batch, terms)
    assert losses[-1] < 0.5 * losses[0]
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/lr"} <= set(metrics)
    assert "critic/entropy" not in metrics
    with pytest.raises(OpError, match="compute_values"):
        engine.compute_log_probs(batch)
    with pytest.raises(OpError, match="log_probs"):
        engine.update(batch.with_fields(old_log_probs=returns, advantages=returns), [("ppo_clip", 1.0, {})])
