"""The megatron training engine's rules, worked by hand on the toy model of test_cost, and the issue's worked example."""
import pytest

from hybridflow.compiler import memory as mem
from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.cost import CostOptions, Infer, Update, WeightSync, estimate
from hybridflow.compiler.layout import Layout, generation_layouts
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.workload import RoleWork, paper_workload

TOY = ClusterSpec(  # the toy cluster and model of test_cost.py
    name="toy", nodes=1, devices_per_node=4, device_memory_bytes=1e9, peak_flops=1e12, memory_bandwidth=1e11,
    intra_node_bandwidth=1e10, inter_node_bandwidth=1e9, host_bandwidth=1e9, collective_latency_s=0.0,
    mfu_train=0.5, mfu_infer=0.5, mfu_prefill=0.5, memory_bandwidth_efficiency=0.5, comm_efficiency=1.0,
    usable_memory_fraction=1.0)
TOY_MODEL = ModelSpec(name="toy", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=100)

P = 86_848  # TOY_MODEL.params


def test_megatron_memory_keeps_weights_and_gradients_replicated():
    # 6·P/mp + 12·P/N: dp2·tp2 -> 6·P/2 + 12·P/4; frozen models are 2·P/mp under both engines
    assert mem.resident_bytes(TOY_MODEL, Layout(2, 2, 1), True, "megatron") == 3 * P + 3 * P
    assert mem.resident_bytes(TOY_MODEL, Layout(2, 2, 1), True, "fsdp") == 18 * P / 4
    assert mem.resident_bytes(TOY_MODEL, Layout(2, 2, 1), False, "megatron") == mem.resident_bytes(TOY_MODEL, Layout(2, 2, 1), False)
    assert mem.gathered_param_bytes(TOY_MODEL, Layout(2, 1, 1), True, "megatron") == 0.0


def test_megatron_update_by_hand():
    # dp2, 2 mini-batches: one micro-batch of 2 sequences (14 tokens) per step, as in test_update_rule_by_hand.
    # compute 8·80,448·14 / 5e11 = 1.8020352e-5 s; its backward with the recomputed forward is 6/8 of it.
    # reduce-scatter of the fp32 gradients: 1/2·4·P / 1e10 = 1.73696e-5 s; all-gather of bf16 weights 1/2·2·P / 1e10.
    # Adam as in fsdp: 30·P/2 / 5e10.
    compute, rs, ag, adam = 1.8020352e-5, 0.5 * 4 * P / 1e10, 0.5 * 2 * P / 1e10, 30 * P / 2 / 5e10
    work = Update(TOY_MODEL, Layout(2, 1, 1), sequences=8, seq_len=7, epochs=1, mini_batches=2, engine="megatron")
    r = estimate(work, TOY, CostOptions())
    assert r.time_s == pytest.approx(2 * (compute + max(0.0, rs - 0.75 * compute) + ag + adam), rel=1e-12)
    no_overlap = estimate(work, TOY, CostOptions(overlap_grad_reduce=False))
    assert no_overlap.time_s == pytest.approx(2 * (compute + rs + ag + adam), rel=1e-12)
    # memory: 6·P + 12·P/2 states, no gathered layers; activations as in the fsdp case
    assert r.peak_memory_bytes == 6 * P + 6 * P + 3_584 + 30_464 + 11_200


def test_megatron_forward_of_a_trainable_model_needs_no_dp_communication():
    fsdp = estimate(Infer(TOY_MODEL, Layout(4, 1, 1), True, 16, 7), TOY)
    megatron = estimate(Infer(TOY_MODEL, Layout(4, 1, 1), True, 16, 7, engine="megatron"), TOY)
    assert dict(fsdp.parts)["dp_comm"] > 0 and dict(megatron.parts)["dp_comm"] == 0
    assert megatron.time_s < fsdp.time_s


def test_weight_sync_by_engine():
    # dp2·tp2 -> dp2·tp2: megatron already holds the generation shard M/2; fsdp holds M/4 and receives M/4
    same = Layout(2, 2, 1)
    assert estimate(WeightSync(TOY_MODEL, same, same, "megatron"), TOY).time_s == 0.0
    assert estimate(WeightSync(TOY_MODEL, same, same, "fsdp"), TOY).time_s == pytest.approx(2 * P / 4 / 1e10)
    # dp1·tp4 -> dp2·tp2: the paper's (t·p − tg·pg)/(tg·pg·t·p)·M = 2/8·2P
    r = estimate(WeightSync(TOY_MODEL, Layout(1, 4, 1), Layout(2, 2, 1), "megatron"), TOY)
    assert r.time_s == pytest.approx(2 * P / 4 / 1e10) and r.peak_memory_bytes == P
    # megatron needs tg | t: tp1 training cannot feed tp2 generation without redundancy
    assert not estimate(WeightSync(TOY_MODEL, Layout(4, 1, 1), Layout(2, 2, 1), "megatron"), TOY).feasible


def test_generation_layouts_by_engine():
    train = Layout(2, 2, 1)
    assert {g.tp for g in generation_layouts(TOY_MODEL, train, 4, "megatron")} == {1, 2}
    assert {g.tp for g in generation_layouts(TOY_MODEL, train, 4, "fsdp")} == {1, 2, 4}


def test_worked_example_34b_on_128_gpus():
    # Issue 13's figure: 34B, tp8 dp16 on 16 nodes of A100s, 8 optimizer steps (the paper's workload), nothing
    # overlapped: per step (15/16)·(4 + 2)·P/8 bytes over a cross-node ring at 200 GB/s / 8 GPUs · 0.8 = 20 GB/s;
    # about 9.5 s per model per iteration.
    model, cluster = ModelSpec.preset("llama2-34b"), ClusterSpec.preset("a100-80g", nodes=16)
    work = Update(model, Layout(16, 8, 1), 1024, 2048, 1, 8, engine="megatron")
    r = estimate(work, cluster, CostOptions(overlap_grad_reduce=False))
    expected = 8 * (15 / 16 * 6 * model.params / 8 / 20e9 + 2 * cluster.collective_latency_s)
    assert dict(r.parts)["dp_comm"] == pytest.approx(expected, rel=1e-9)
    assert 9.0 < expected < 10.0


def test_role_engines_are_checked():
    with pytest.raises(ValueError, match="training engines"):  # ConfigError, wrapped by pydantic
        RoleWork(name="actor", model=TOY_MODEL, engines=("deepspeed",))
    w = paper_workload(TOY_MODEL, "paper").with_engines(("megatron", "fsdp"))
    assert w.role("actor").search_engines == ("megatron", "fsdp") and w.role("ref").search_engines == ("megatron",)
    assert w.role("actor").mini_batches == 8
