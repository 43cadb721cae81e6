"""Hybrid-engine rank groups and volumes against a brute-force count over every rank's weight elements."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.layout import Layout
from hybridflow.compiler.reshard import (ReshardFigures, cross_pool_sync, hybrid_engine_figures, hybrid_engine_groups, table2,
                                        transition_figures)
from hybridflow.errors import PlanError


def test_paper_figure_8_groups():
    # Training 1-4-2 (p=1, t=4, d=2, weights replicated over d), generation 1-2-2-2 (pg=1, tg=2, d_m=2):
    # micro-DP groups [G1,G2], [G3,G4] per replica; generation TP groups [G1,G3], [G2,G4].
    g = hybrid_engine_groups(Layout(2, 4, 1), Layout(4, 2, 1), sharded_over_dp=False)
    assert g.micro_dp_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert g.shard_of_group == ((0, 0), (0, 1), (0, 0), (0, 1))
    assert g.gen_groups == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert g.micro_dp_size == 2 and g.gen_coords(3) == (1, 0, 1) and g.micro_dp_group_of(5) == 2


def test_table2_rows():
    m, train, gen = 1.0, Layout(2, 4, 1), Layout(4, 2, 1)
    rows = table2(m, train, gen)
    # HybridFlow: (t·p − tg·pg)/(tg·pg·t·p)·M = (4 − 2)/(2·4) = 1/4; peak M/(tg·pg) = 1/2; no redundancy
    assert (rows["hybridflow"].comm_volume_bytes, rows["hybridflow"].peak_memory_bytes, rows["hybridflow"].redundant_bytes) == (0.25, 0.5, 0.0)
    # HybridFlow-V: (t·p − 1)/(t·p)·M = 3/4, peak M, training shard M/4 kept twice
    assert (rows["hybridflow-v"].comm_volume_bytes, rows["hybridflow-v"].peak_memory_bytes, rows["hybridflow-v"].redundant_bytes) == (0.75, 1.0, 0.25)
    assert rows["openrlhf"].comm_volume_bytes == 1.0
    assert hybrid_engine_figures(m, train, gen, sharded_over_dp=False) == rows["hybridflow"]


def test_paper_figure_8_volumes():
    # Fig. 8: training 1-4-2 (p=1, t=4, d=2) on 8 GPUs, generation 1-2-4 (pg=1, tg=2, dg=4). Table 2 per rank:
    # DS-Chat (t·p·d − 1)/(t·p·d)·M = 7/8, peak M, redundant M/8; HybridFlow-V (t·p − 1)/(t·p)·M = 3/4, redundant M/4;
    # HybridFlow (t·p − tg·pg)/(tg·pg·t·p)·M = 1/4, peak M/2, redundant 0; OpenRLHF M, M, M.
    rows = table2(1.0, Layout(2, 4, 1), Layout(4, 2, 1))
    assert rows["ds-chat"] == ReshardFigures(7 / 8, 1.0, 1 / 8)
    assert rows["hybridflow-v"] == ReshardFigures(3 / 4, 1.0, 1 / 4)
    assert rows["hybridflow"] == ReshardFigures(1 / 4, 1 / 2, 0.0)
    assert rows["openrlhf"] == ReshardFigures(1.0, 1.0, 1.0)
    # the megatron engine moves what the paper says; fsdp (ZeRO-3) holds M/(t·p·d) and receives (d − 1)/(t·p·d)·M more
    assert transition_figures(1.0, Layout(2, 4, 1), Layout(4, 2, 1), "megatron") == rows["hybridflow"]
    assert transition_figures(1.0, Layout(2, 4, 1), Layout(4, 2, 1), "fsdp").comm_volume_bytes == pytest.approx(1 / 4 + 1 / 8)
    # with d = 1 both engines agree
    assert transition_figures(1.0, Layout(1, 4, 2), Layout(2, 2, 2), "fsdp") == transition_figures(1.0, Layout(1, 4, 2), Layout(2, 2, 2), "megatron")


def test_incompatible_generation_layouts_are_refused():
    with pytest.raises(PlanError, match="redundant"):
        hybrid_engine_groups(Layout(2, 4, 1), Layout(1, 8, 1), sharded_over_dp=False)  # tg 8 does not divide t = 4
    with pytest.raises(PlanError, match="same|one pool"):
        hybrid_engine_groups(Layout(2, 4, 1), Layout(2, 2, 1))


def _divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


@st.composite
def transitions(draw):
    p, t, d = draw(st.sampled_from([1, 2, 3, 4])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 3]))
    sharded = draw(st.booleans())
    columns = t * d if sharded else t
    pg, tg = draw(st.sampled_from(_divisors(p))), draw(st.sampled_from(_divisors(columns)))
    train = Layout(d, t, p)
    return train, Layout(train.size // (tg * pg), tg, pg), sharded


def _held(rank, train, sharded, layers, cols):
    """Elements (layer, column) a training rank holds, from the layouts' definitions alone."""
    r, rest = divmod(rank, train.tp * train.pp)
    i, j = divmod(rest, train.tp)
    lw, cw = layers // train.pp, cols // train.tp
    c0, c1 = j * cw, (j + 1) * cw
    if sharded:  # ZeRO-3 splits the tensor-parallel block further over the d replicas
        sub = cw // train.dp
        c0, c1 = c0 + r * sub, c0 + (r + 1) * sub
    return {(a, b) for a in range(i * lw, (i + 1) * lw) for b in range(c0, c1)}


def _needed(a, b, gen, layers, cols):
    lw, cw = layers // gen.pp, cols // gen.tp
    return {(x, y) for x in range(a * lw, (a + 1) * lw) for y in range(b * cw, (b + 1) * cw)}


@settings(max_examples=120, deadline=None)
@given(transitions())
def test_groups_and_volumes_agree_with_brute_force(case):
    train, gen, sharded = case
    layers, cols = train.pp * 2, train.tp * train.dp * 2  # a grid every layout divides
    g = hybrid_engine_groups(train, gen, sharded)
    element = 3.0  # bytes per element
    figures = hybrid_engine_figures(element * layers * cols, train, gen, sharded)
    assert len(g.gen_groups) == gen.dp and all(len(m) == gen.tp * gen.pp for m in g.gen_groups)
    assert sorted(r for m in g.gen_groups for r in m) == list(range(train.size))
    assert sorted(r for m in g.micro_dp_groups for r in m) == list(range(train.size))
    for rank in range(train.size):
        _, a, b = g.gen_coords(rank)
        held, needed = _held(rank, train, sharded, layers, cols), _needed(a, b, gen, layers, cols)
        assert held <= needed  # no redundant copy: the training shard is part of the generation shard
        assert len(needed - held) * element == pytest.approx(figures.comm_volume_bytes)
        assert len(needed) * element == pytest.approx(figures.peak_memory_bytes)
    for members, (a, b) in zip(g.micro_dp_groups, g.shard_of_group):
        union = set().union(*(_held(r, train, sharded, layers, cols) for r in members))
        assert union == _needed(a, b, gen, layers, cols)  # an all-gather inside the group suffices
        assert all(g.gen_coords(r)[1:] == (a, b) for r in members)
    for members in g.gen_groups:  # each replica holds the whole model once
        coords = [g.gen_coords(r)[1:] for r in members]
        assert sorted(coords) == [(a, b) for a in range(gen.pp) for b in range(gen.tp)]
    if not sharded:  # the paper's formula
        mp, gp = train.tp * train.pp, gen.tp * gen.pp
        assert figures.comm_volume_bytes == pytest.approx((mp - gp) / (gp * mp) * element * layers * cols)


def test_consecutive_generation_groups_would_hold_redundant_copies():
    # The naive grouping (generation TP groups of consecutive training ranks (0,1), (2,3)) breaks held <= needed,
    # which is why HybridFlow strides them: with t=4, tg=2, rank 1 holds column block 1 of 4 (inside the first
    # half) but as tp rank 1 of its generation group would need the second half.
    train, gen, layers, cols = Layout(1, 4, 1), Layout(2, 2, 1), 1, 4
    naive_b = {0: 0, 1: 1, 2: 0, 3: 1}  # consecutive pairs (0,1), (2,3)
    assert any(not _held(r, train, False, layers, cols) <= _needed(0, naive_b[r], gen, layers, cols) for r in range(4))


def test_cross_pool_broadcast_by_hand():
    toy = ClusterSpec(name="toy", nodes=2, devices_per_node=4, device_memory_bytes=1e9, peak_flops=1e12,
                      memory_bandwidth=1e11, intra_node_bandwidth=1e10, inter_node_bandwidth=4e9, host_bandwidth=1e9,
                      collective_latency_s=0.0, comm_efficiency=1.0)
    sync = cross_pool_sync(4e9, Layout(4, 1, 1), Layout(2, 2, 1), toy, bucket_bytes=1e9)
    assert sync.buckets == 4 and sync.volume_per_receiver == 4e9 and sync.bytes_sent_by_source == 4e9
    # gather: 3/4·4e9 over NVLink 1e10 = 0.3 s; broadcast to 4 ranks across nodes at 4e9/4 = 1e9 B/s:
    # (4 buckets + 3) x 1 s = 7 s; pipelined: max + min/4 = 7 + 0.075
    assert sync.gather_volume_per_trainer_rank == 3e9
    assert sync.time_s == pytest.approx(7.075)


# HybridFlow Fig. 14 (transition time of the actor, 7B-70B): training (d, t, p) and generation (tg, pg) as the issue
# reads them, each on 2 replicas. Per-rank bytes received, M = 2 bytes x params (GB = 1e9 bytes):
#   megatron (the paper's table 2): M/(tg·pg) - M/(t·p)      fsdp (ZeRO-3): M/(tg·pg) - M/(t·p·d)
#   7B,  M = 13.477: t8 p1 -> tg2:  6.738 - 1.685 = 5.054    6.738 - 0.842 = 5.896
#   13B, M = 26.032: t8 p1 -> tg4:  6.508 - 3.254 = 3.254    6.508 - 1.627 = 4.881
#   34B, M = 67.488: t8 p4 -> tg8:  8.436 - 2.109 = 6.327    8.436 - 1.055 = 7.381
#   70B, M = 137.95: t8 p8 -> tg8: 17.244 - 2.156 = 15.089  17.244 - 1.078 = 16.167
FIG14 = [
    ("llama2-7b", Layout(2, 8, 1), Layout(8, 2, 1), 5.05, 5.90),
    ("llama2-13b", Layout(2, 8, 1), Layout(4, 4, 1), 3.25, 4.88),
    ("llama2-34b", Layout(2, 8, 4), Layout(8, 8, 1), 6.33, 7.38),
    ("llama2-70b", Layout(2, 8, 8), Layout(16, 8, 1), 15.09, 16.17),
]


@pytest.mark.parametrize("model, train, gen, megatron_gb, fsdp_gb", FIG14, ids=[c[0] for c in FIG14])
def test_paper_figure_14_transition_volumes(model, train, gen, megatron_gb, fsdp_gb):
    from hybridflow.compiler.models import ModelSpec

    m = 2.0 * ModelSpec.preset(model).params
    megatron, fsdp = transition_figures(m, train, gen, "megatron"), transition_figures(m, train, gen, "fsdp")
    assert megatron.comm_volume_bytes / 1e9 == pytest.approx(megatron_gb, abs=0.006)
    assert fsdp.comm_volume_bytes / 1e9 == pytest.approx(fsdp_gb, abs=0.006)
    assert megatron == table2(m, train, gen)["hybridflow"]  # the megatron engine moves exactly the paper's row
    # fsdp receives (d - 1)/(t·p·d)·M more: each rank starts from a piece d times smaller
    assert fsdp.comm_volume_bytes - megatron.comm_volume_bytes == pytest.approx((train.dp - 1) * m / train.size)
    assert megatron.peak_memory_bytes == fsdp.peak_memory_bytes == pytest.approx(m / gen.model_parallel)
    # and both volumes are what the micro-DP groups really exchange (each rank gathers the rest of its generation shard)
    for engine, figures in (("megatron", megatron), ("fsdp", fsdp)):
        groups = hybrid_engine_groups(train, gen, sharded_over_dp=engine == "fsdp")
        assert groups.micro_dp_size * (m / gen.model_parallel - figures.comm_volume_bytes) == pytest.approx(m / gen.model_parallel)
