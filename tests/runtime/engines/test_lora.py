"""LoRA through peft: only adapters train and sync, the base model is the same module with adapters disabled,
adapters round-trip through a peft folder and merge into a plain transformers model."""
from __future__ import annotations

import copy

import pytest
import torch
from engine_testkit import prompt_batch, tiny_model

pytest.importorskip("peft", reason="LoRA needs peft (pip install hybridflow[lora])")

from hybridflow.errors import ConfigError, OpError  # noqa: E402
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams, TrainEngine, TrainEngineConfig  # noqa: E402
from hybridflow.runtime.engines.base_view import BaseModelView  # noqa: E402
from hybridflow.runtime.engines.lora import (LoraSettings, adapter_config, adapter_names, adapters_disabled,  # noqa: E402
                                             load_adapter_state,
                                             base_state, merged_model, peft_adapter_files)
from hybridflow.runtime.weight_sync import stream_into  # noqa: E402

PG = [("ppo_clip", 1.0, {})]
LORA = LoraSettings(rank=4, alpha=8.0)


def _batch(tokenizer, model, seed=0):
    params = SamplingParams(n=2, max_new_tokens=6, seed=seed)
    batch = HFRolloutEngine(model, tokenizer=tokenizer).generate(prompt_batch(tokenizer), params)
    adv = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(seed))
    return batch.with_fields(old_log_probs=batch["rollout_log_probs"], advantages=adv)


def _lora_engine(model, lr=1e-2, settings=LORA):
    return TrainEngine(model, TrainEngineConfig(lr=lr, precision="fp32", lora=settings))


def test_only_the_adapters_train(tokenizer, model):
    base = {k: v.clone() for k, v in model.state_dict().items()}
    engine = _lora_engine(model)
    trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    optimized = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    assert trainable == adapter_names(engine.module) and trainable
    assert all(".lora_" in n for n in trainable)
    assert optimized == {id(p) for n, p in engine.module.named_parameters() if n in trainable}
    # adapters start as the base model (B = 0): the same log-probs
    batch = _batch(tokenizer, engine.module)
    mask = batch["response_mask"]
    assert torch.allclose(engine.compute_log_probs(batch) * mask, batch["rollout_log_probs"] * mask, atol=1e-5)
    engine.update(batch, PG)
    for name, tensor in base_state(engine.module).items():
        assert torch.equal(tensor, base[name]), name  # the base weights did not move
    moved = [n for n in trainable if "lora_B" in n and engine.module.state_dict()[n].abs().sum() > 0]
    assert moved, "an update moves the adapters"


def test_state_and_sync_hold_the_adapters_only(tokenizer, model):
    engine = _lora_engine(model)
    full = sum(t.numel() for t in base_state(engine.module).values())
    state = engine.state_dict()["model"]
    assert set(state) == adapter_names(engine.module)
    synced = dict(engine.named_weights())
    assert set(synced) == set(state)
    assert sum(t.numel() for t in synced.values()) < full / 5


def test_hf_rollout_copy_takes_the_adapters_in_place(tokenizer, model):
    engine = _lora_engine(model)
    rollout = HFRolloutEngine(copy.deepcopy(engine.module), tokenizer=tokenizer)  # a rollout model of its own
    engine.update(_batch(tokenizer, engine.module), PG)
    stats = stream_into(rollout, engine.named_weights())
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter_state_of(engine).values())
    assert stats.bytes == adapter_bytes and stats.tensors == len(adapter_names(engine.module))
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    prompts = prompt_batch(tokenizer)
    out = rollout.generate(prompts, greedy)
    assert torch.equal(out["response_ids"], HFRolloutEngine(engine.module, tokenizer=tokenizer).generate(prompts, greedy)["response_ids"])
    lp = engine.compute_log_probs(out)
    assert ((lp - out["rollout_log_probs"]) * out["response_mask"]).abs().max() < 1e-5


def adapter_state_of(engine):
    return engine.state_dict()["model"]


def test_reference_view_is_the_base_model_from_the_same_module(tokenizer, model):
    reference = TrainEngine(copy.deepcopy(model), TrainEngineConfig(lr=0.0, precision="fp32"))
    engine = _lora_engine(model, lr=5e-2)
    batch = _batch(tokenizer, engine.module)
    for _ in range(2):
        engine.update(batch, PG)
    view = BaseModelView(engine, role="ref")
    expected = reference.compute_log_probs(batch)
    assert torch.allclose(view.compute_log_probs(batch), expected, atol=1e-5)
    assert not torch.allclose(engine.compute_log_probs(batch), expected, atol=1e-3)  # the adapters are back on after
    assert view.module is engine.module and list(view.named_weights()) == []
    with pytest.raises(OpError, match="cannot be updated"):
        view.update(batch, PG)


def test_merged_adapters_give_the_same_logits_as_a_plain_model(tokenizer, model, tmp_path):
    engine = _lora_engine(model, lr=5e-2)
    engine.update(_batch(tokenizer, engine.module), PG)
    ids = prompt_batch(tokenizer)["prompt_ids"]
    with torch.no_grad():
        lora_logits = engine.module(input_ids=ids).logits
        with adapters_disabled(engine.module):
            base_logits = engine.module(input_ids=ids).logits
    assert not torch.allclose(lora_logits, base_logits, atol=1e-4)
    peft_adapter_files(adapter_config(engine.module), engine.state_dict()["model"], tmp_path / "adapter")
    from peft import PeftModel

    reloaded = PeftModel.from_pretrained(tiny_model(tokenizer), str(tmp_path / "adapter"))
    merged = merged_model(copy.deepcopy(engine.module))
    assert not any(".lora_" in n or "base_layer" in n for n in merged.state_dict())
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, lora_logits, atol=1e-5)
        assert torch.allclose(merged(input_ids=ids).logits, lora_logits, atol=1e-5)


def test_unknown_target_modules_are_a_config_error(model):
    with pytest.raises(ConfigError, match="lora_target_modules"):
        _lora_engine(model, settings=LoraSettings(rank=4, target_modules=("qproj",)))
    with pytest.raises(ValueError, match="all-linear"):
        LoraSettings(rank=4, target_modules=())


def test_without_peft_lora_is_a_config_error_naming_the_extra(model, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError, as where it is not installed
    with pytest.raises(ConfigError, match=r"pip install hybridflow\[lora\]"):
        _lora_engine(model)
    TrainEngine(model, TrainEngineConfig())  # a full fine-tune never imports peft


def test_packed_rows_run_through_the_adapters_too(tokenizer, model):
    padded = _lora_engine(copy.deepcopy(model))
    packed = TrainEngine(copy.deepcopy(model), TrainEngineConfig(precision="fp32", lora=LORA, pack_sequences=True))
    with torch.no_grad():
        for name, tensor in padded.state_dict()["model"].items():
            tensor.normal_(0, 0.3) if "lora_B" in name else None
        load_adapter_state(packed.module, padded.state_dict()["model"])  # the same (non-zero) adapters in both
    batch = _batch(tokenizer, padded.module)
    mask = batch["response_mask"]
    assert ((padded.compute_log_probs(batch) - packed.compute_log_probs(batch)) * mask).abs().max() < 1e-5
    with adapters_disabled(padded.module):
        base = padded.compute_log_probs(batch)
    assert ((packed.compute_log_probs(batch) - base) * mask).abs().max() > 1e-2
