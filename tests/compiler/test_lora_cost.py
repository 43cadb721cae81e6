"""The compiler knows LoRA: adapter parameter counts, model-state memory, the Adam step and adapter-only weight syncs."""
from __future__ import annotations

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.compile import compile
from hybridflow.compiler.cost import CostOptions, Update, estimate
from hybridflow.compiler.layout import Layout
from hybridflow.compiler.memory import resident_bytes
from hybridflow.compiler.models import ModelSpec, lora_adapter_params
from hybridflow.errors import ConfigError


@pytest.mark.parametrize("targets", ["all-linear", ("q_proj", "v_proj"), ("down_proj",)])
def test_adapter_params_equal_peft_counts(targets):
    peft = pytest.importorskip("peft")
    from hybridflow.data import make_tiny_model

    model = make_tiny_model("qwen2", vocab_size=32, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96)
    spec = ModelSpec.from_config(model.config.to_dict())
    config = peft.LoraConfig(r=8, target_modules=targets if isinstance(targets, str) else list(targets))
    peft.inject_adapter_in_model(config, model)
    adapters = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    assert lora_adapter_params(spec, 8, targets) == adapters
    assert spec.with_lora(8, targets).trainable_params == adapters and spec.trainable_params == spec.params


def test_qwen7b_rank16_adapters_by_hand():
    # per layer: q 3584+3584, k 3584+512, v 3584+512, o 3584+3584, gate/up/down 3 x (3584+18944) = 90,112; x 16 x 28
    assert lora_adapter_params(ModelSpec.preset("qwen2.5-7b"), 16) == 90_112 * 16 * 28
    with pytest.raises(ConfigError, match="c_attn"):
        lora_adapter_params(ModelSpec.preset("qwen2.5-7b"), 16, ("c_attn",))


def test_lora_model_states_are_frozen_base_plus_adapter_adam():
    spec = ModelSpec.preset("llama2-7b")
    lora = spec.with_lora(16)
    layout = Layout(dp=4)
    assert resident_bytes(lora, layout, True) == pytest.approx((2 * spec.params + 18 * lora.adapter_params) / 4)
    assert resident_bytes(lora, layout, True) < resident_bytes(spec, layout, True) / 8
    assert resident_bytes(lora, layout, False) == resident_bytes(spec, layout, False)  # a frozen copy: bf16 weights


def _actor_figures(plan):
    """The actor's update (peak memory, time), and its weight syncs' time and volume."""
    sync = [op for op in plan.ops if op.kind == "weight_sync" and op.role == "actor"]
    update = next(op for op in plan.ops if op.kind == "node" and op.role == "actor" and "update" in op.node)
    return (update.peak_memory_bytes, update.predicted_end_s - update.predicted_start_s,
            sum(op.predicted_end_s - op.predicted_start_s for op in sync), sum(op.volume_bytes for op in sync))


@pytest.mark.parametrize("placement", ["colocate", "actor+ref+reward@4;actor.generate@4"])
def test_a_lora_plan_predicts_less_actor_memory_and_a_faster_sync(placement):
    graph = ALGORITHMS["grpo"].build()
    spec, lora_spec = ModelSpec.preset("qwen2.5-7b"), ModelSpec.preset("qwen2.5-7b").with_lora(16)
    full = compile(graph, "a100-80g:1", {"actor": spec, "ref": spec, "reward": "rule"}, placement=placement)
    lora = compile(graph, "a100-80g:1", {"actor": lora_spec, "ref": spec, "reward": "rule"}, placement=placement)
    (full_mem, full_update, full_sync, full_volume), (lora_mem, lora_update, lora_sync, lora_volume) = \
        _actor_figures(full), _actor_figures(lora)
    assert lora_mem < full_mem
    assert 0 < lora_sync < full_sync / 10 and lora_volume < full_volume / 50  # broadcast: fixed latencies remain
    assert lora_update < full_update  # no weight gradients of the frozen base, Adam over the adapters only


def test_the_update_peak_drops_by_the_model_states_lora_does_not_keep():
    spec, lora_spec = ModelSpec.preset("qwen2.5-7b"), ModelSpec.preset("qwen2.5-7b").with_lora(16)
    layout, cluster = Layout(dp=8), ClusterSpec.parse("a100-80g:1")
    full, lora = (estimate(Update(m, layout, 64, 1536, 1, 1, prompt_len=512, samples=8), cluster, CostOptions())
                  for m in (spec, lora_spec))
    saved = resident_bytes(spec, layout, True) - resident_bytes(lora_spec, layout, True)
    # 18 B/param over 8 ranks -> 2 B/param of frozen weights + 18 B per adapter parameter: 15 GB per device saved
    assert full.peak_memory_bytes - lora.peak_memory_bytes == pytest.approx(saved) and saved > 15e9
