"""Cost rules, one hand-worked case each, on a toy cluster and model with round numbers."""
import math

import pytest

from hybridflow.compiler import memory as mem
from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.comm import all_gather_volume, all_reduce_volume, broadcast_time, span_of_group
from hybridflow.compiler.cost import (COST_RULES, Compute, CostOptions, Generate, Infer, Offload, Onload, Score, Update,
                                      WeightSync, estimate)
from hybridflow.compiler.layout import Layout
from hybridflow.compiler.models import ModelSpec
from hybridflow.errors import PlanError

TOY = ClusterSpec(
    name="toy", nodes=1, devices_per_node=4, device_memory_bytes=1e9, peak_flops=1e12, memory_bandwidth=1e11,
    intra_node_bandwidth=1e10, inter_node_bandwidth=1e9, host_bandwidth=1e9, collective_latency_s=0.0,
    mfu_train=0.5, mfu_infer=0.5, mfu_prefill=0.5, memory_bandwidth_efficiency=0.5, comm_efficiency=1.0,
    usable_memory_fraction=1.0)
# params: embedding 100·64 = 6,400; per layer q 64·64 + k 64·32 + v 64·32 + o 64·64 = 12,288,
# MLP 3·64·128 = 24,576, norms 128 -> 36,992; x2 layers = 73,984; final norm 64; lm_head 6,400 -> 86,848.
# FLOP-bearing params (no input embedding): 80,448. KV per token: 2·2 layers·2 kv heads·16·2 B = 256.
TOY_MODEL = ModelSpec(name="toy", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=100)
OPTS = CostOptions()  # train micro-batch 4, infer micro-batch 16, recomputation on


def test_toy_model_sizes():
    assert TOY_MODEL.params == 86_848 and TOY_MODEL.flop_params == 80_448
    assert TOY_MODEL.layer_params == 36_992 and TOY_MODEL.kv_bytes_per_token() == 256


def test_collective_volumes():
    assert all_reduce_volume(100, 4) == 150  # 2·3/4·100
    assert all_gather_volume(100, 4) == 75  # 3/4·100
    assert all_reduce_volume(100, 1) == all_gather_volume(100, 1) == 0
    assert span_of_group(4, 2) == 7
    # 1000 B in 4 buckets of 250 B to 3 receivers at 100 B/s: (4 + 3 − 1) steps of 2.5 s
    assert broadcast_time(1000, 3, 250, 100, 0.0) == pytest.approx(15.0)


def test_generate_rule_by_hand():
    # dg=2 replicas, 4 sequences each; weights 2·86,848 = 173,696 B; KV/seq 7 tokens·256 = 1,792 B; all fit: 1 wave.
    w = Generate(TOY_MODEL, Layout(2, 1, 1), sequences=8, prompt_len=4, response_len=3)
    r = estimate(w, TOY)
    # prefill: 2·80,448·(4 seqs·4 tokens) / (1e12·0.5) = 5.148672e-6 s
    # decode step: read 2·80,448 + 4 seqs·(4 + (3−1)/2 = 5 tokens)·256 = 166,016 B / (1e11·0.5) = 3.32032e-6 s,
    #   compute 2·80,448·4 / 5e11 = 1.287168e-6 s -> memory-bound; x 3 steps = 9.96096e-6 s
    assert r.time_s == pytest.approx(5.148672e-6 + 9.96096e-6, rel=1e-12)
    assert r.peak_memory_bytes == 173_696 + 4 * 1_792
    assert dict(r.parts)["waves"] == 1


def test_generate_runs_in_waves_when_the_kv_cache_does_not_fit():
    # leave room for 3 sequences' KV: waves = ceil(4/3) = 2 of ceil(4/2) = 2 sequences
    used = 1e9 - 173_696 - 3 * 1_792 - 1
    r = estimate(Generate(TOY_MODEL, Layout(2, 1, 1), 8, 4, 3, memory_used_bytes=used), TOY)
    # per wave: prefill 2·80,448·8/5e11 = 2.574336e-6; decode 3·(160,896 + 2·5·256)/5e10 = 9.80736e-6
    assert dict(r.parts)["waves"] == 2
    assert r.time_s == pytest.approx(2 * (2.574336e-6 + 9.80736e-6), rel=1e-12)
    full = estimate(Generate(TOY_MODEL, Layout(2, 1, 1), 8, 4, 3, memory_used_bytes=1e9 - 173_696), TOY)
    assert not full.feasible and math.isinf(full.time_s) and "KV cache" in full.problem


def test_infer_rule_frozen_by_hand():
    # 4 sequences x 7 tokens per replica, one micro-batch of 4: 2·80,448·28 / 5e11 = 9.010176e-6 s, no communication
    r = estimate(Infer(TOY_MODEL, Layout(2, 1, 1), trainable=False, sequences=8, seq_len=7), TOY)
    assert r.time_s == pytest.approx(9.010176e-6, rel=1e-12)
    # memory: bf16 weights 173,696 + one layer 28·64·(10 + 24) = 60,928 + logits 8·28·100 = 22,400
    assert r.peak_memory_bytes == 173_696 + 60_928 + 22_400


def test_infer_rule_trainable_with_tensor_parallelism_by_hand():
    # dp2·tp2: compute 2·80,448·28 / (2·5e11) = 4.505088e-6 s
    # ZeRO-3 all-gather of the 86,848 B tp shard over 2 ranks: 1/2·86,848 / 1e10 = 4.3424e-6 s (overlapped: max)
    # TP: 2 layers x 2 all-reduces of 28·64·2 = 3,584 B over 2 ranks: 2·1/2·3,584 / 1e10 = 3.584e-7 s each -> 1.4336e-6 s
    r = estimate(Infer(TOY_MODEL, Layout(2, 2, 1), trainable=True, sequences=8, seq_len=7), TOY)
    assert r.time_s == pytest.approx(max(4.505088e-6, 4.3424e-6) + 1.4336e-6, rel=1e-12)
    assert Score(TOY_MODEL, Layout(2, 2, 1), True, 8, 7).kind == "score"
    assert estimate(Score(TOY_MODEL, Layout(2, 2, 1), True, 8, 7), TOY).time_s == r.time_s


def test_update_rule_by_hand():
    # dp2, 2 mini-batches: 2 sequences per replica per step = one micro-batch of 2 (14 tokens)
    # compute with recomputation 8·80,448·14 / 5e11 = 1.8020352e-5 s
    # ZeRO-3: 2 all-gathers + 1 reduce-scatter of 173,696 B over 2 ranks: 3·1/2·173,696 / 1e10 = 2.60544e-5 s
    # Adam: 30 B·86,848 / 2 ranks / (1e11·0.5) = 2.60544e-5 s
    r = estimate(Update(TOY_MODEL, Layout(2, 1, 1), sequences=8, seq_len=7, epochs=1, mini_batches=2), TOY, OPTS)
    assert r.time_s == pytest.approx(2 * (max(1.8020352e-5, 2.60544e-5) + 2.60544e-5), rel=1e-12)
    # memory: states 18·86,848/2 = 781,632; two gathered layers 2·2·36,992 = 147,968;
    # activations: 2 layers·2·14·64 = 3,584 kept + one layer 14·64·34 = 30,464 + logits 8·14·100 = 11,200
    assert r.peak_memory_bytes == 781_632 + 147_968 + 3_584 + 30_464 + 11_200


def test_packed_forwards_and_updates_cost_the_real_sequence_length():
    # real_seq_len 3.5 of the padded 7: the infer case above (dp2, one replica's 4 sequences) computes
    # 2·80,448·4·3.5 / 5e11 = 4.505088e-6 s, half of 9.010176e-6 s; its activations halve too
    packed = CostOptions(real_seq_len=3.5)
    r = estimate(Infer(TOY_MODEL, Layout(2, 1, 1), trainable=False, sequences=8, seq_len=7), TOY, packed)
    assert r.time_s == pytest.approx(4.505088e-6, rel=1e-12)
    assert r.peak_memory_bytes == 173_696 + 60_928 / 2 + 22_400 / 2
    # the update case above: compute 8·80,448·7 / 5e11 = 9.010176e-6 s, now under the ZeRO-3 gathers (2.60544e-5 s),
    # so the step time stays; the activations halve: 1,792 + 15,232 + 5,600
    u = estimate(Update(TOY_MODEL, Layout(2, 1, 1), sequences=8, seq_len=7, epochs=1, mini_batches=2), TOY,
                 OPTS.model_copy(update={"real_seq_len": 3.5}))
    assert dict(u.parts)["compute"] == pytest.approx(2 * 9.010176e-6, rel=1e-12)
    assert u.peak_memory_bytes == 781_632 + 147_968 + 1_792 + 15_232 + 5_600
    # a reward model scores padded rows; a real length above the padded width is capped at it
    score = Score(TOY_MODEL, Layout(2, 1, 1), False, 8, 7)
    assert estimate(score, TOY, packed).time_s == estimate(score, TOY).time_s
    assert estimate(Infer(TOY_MODEL, Layout(2, 1, 1), False, 8, 7), TOY, CostOptions(real_seq_len=9.0)).time_s == \
        pytest.approx(9.010176e-6, rel=1e-12)


def test_pipeline_bubble_and_no_recomputation():
    no_ckpt = CostOptions(activation_checkpointing=False, train_micro_batch=1)
    r = estimate(Update(TOY_MODEL, Layout(1, 1, 2), sequences=8, seq_len=7, epochs=1, mini_batches=1), TOY, no_ckpt)
    # 8 micro-batches of 1 sequence; compute 6·80,448·56 / (2·5e11) = 2.7030528e-5; bubble (2−1)/8 of it;
    # pipeline sends: 8 micro-batches x 2 (fwd, bwd) x 7·64·2 = 896 B / 1e10; Adam 30·86,848/2/5e10
    compute = 6 * 80_448 * 56 / 1e12
    expected = compute * (1 + 1 / 8) + 8 * 2 * 896 / 1e10 + 30 * 86_848 / 2 / 5e10
    assert r.time_s == pytest.approx(expected, rel=1e-12)
    # 1F1B: stage 0 holds min(8, 2) = 2 micro-batches of 1 layer's full activations 7·64·34 = 15,232, + logits 5,600
    assert r.peak_memory_bytes == 18 * 86_848 / 2 + 2 * 15_232 + 8 * 7 * 100


def test_weight_sync_rule_by_hand():
    # ZeRO-3 dp4 -> generation tg2 on 4 devices: each rank holds M/4 and needs M/2: receives M/4 = 43,424 B
    r = estimate(WeightSync(TOY_MODEL, Layout(4, 1, 1), Layout(2, 2, 1)), TOY)
    assert r.time_s == pytest.approx(43_424 / 1e10, rel=1e-12)
    assert r.peak_memory_bytes == 86_848
    bad = estimate(WeightSync(TOY_MODEL, Layout(2, 1, 2), Layout(1, 4, 1)), TOY)  # tg 4 does not divide t·d = 2
    assert not bad.feasible and "redundant" in bad.problem


def test_transfers_and_controller_compute():
    assert estimate(Offload(1e9), TOY).time_s == pytest.approx(1.0)  # 1 GB over 1 GB/s PCIe
    assert estimate(Onload(5e8), TOY).kind == "onload"
    assert estimate(Compute(tokens=56), TOY).time_s == pytest.approx(56 * 64 / 1e9)


def test_every_kind_has_a_rule_and_unknown_work_is_rejected():
    assert set(COST_RULES) == {"generate", "infer", "score", "compute", "update", "weight_sync", "offload", "onload"}
    with pytest.raises(PlanError, match="no cost rule"):
        estimate(object(), TOY)


def test_memory_formulas():
    llama = ModelSpec.preset("llama2-70b")
    # 18 B/param over 128 devices; frozen 2 B/param over tp·pp = 8
    assert mem.resident_bytes(llama, Layout(16, 8, 1), True) == 18 * llama.params / 128
    assert mem.resident_bytes(llama, Layout(16, 8, 1), False) == 2 * llama.params / 8
    # KV of a 2048-token sequence at tg8: 2048·327,680 / 8
    assert mem.kv_bytes_per_sequence(llama, Layout(1, 8, 1), 2048) == 2048 * 327_680 / 8
    # tg 16 > 8 kv heads: replicated, still / 8; with pg 2 halves again
    assert mem.kv_bytes_per_sequence(llama, Layout(1, 16, 2), 2048) == 2048 * 327_680 / 16
