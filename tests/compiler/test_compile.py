"""compile(): every algorithm compiles to a verified plan; weight syncs, offload brackets, overlap and the pass manager."""
from __future__ import annotations

import warnings

import pytest

from hybridflow.compiler.cluster import ClusterSpec

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import compile as compile_module
from hybridflow.compiler.compile import IRDump, PassTimer, compile, compile_report
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.passes import BatchShape, PIPELINE
from hybridflow.compiler.plan import ExecutionPlan, verify_plan
from hybridflow.errors import ConfigError, PlacementError, PlanError, StalenessError

SEVEN_B = {"actor": "llama2-7b"}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_compiles_and_round_trips(name):
    plan = compile(ALGORITHMS[name].build(), "a100-80g:2", SEVEN_B, debug=True)
    verify_plan(plan)
    again = ExecutionPlan.from_json(plan.to_json())
    assert again == plan and again.to_text() == plan.to_text()
    assert plan.strategy == "auto" and plan.predicted_iteration_s == max(op.predicted_end_s for op in plan.ops)
    assert {op.node for op in plan.ops if op.kind == "node"} == {n.name for n in plan.graph.nodes}


def _timeline_is_consistent(plan: ExecutionPlan) -> None:
    """Deps end before their users start; ops on one pool never overlap; peaks fit the devices."""
    ends = {op.name: op.predicted_end_s for op in plan.ops}
    for op in plan.ops:
        assert all(ends[d] <= op.predicted_start_s + 1e-9 for d in op.deps), op.name
    for pool in plan.pools:
        spans = sorted((op.predicted_start_s, op.predicted_end_s) for op in plan.ops if pool.name in (op.pool, op.target_pool))
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:])), pool.name
        if pool.memory_bytes:
            assert all(op.peak_memory_bytes <= pool.memory_bytes for op in plan.ops if op.pool == pool.name)


def _elements(rank, train, layers, cols):
    """Grid cells (layer, column) that training rank ``rank`` holds: pp stage rows, tp block columns split again over dp (ZeRO-3)."""
    r, rest = divmod(rank, train.tp * train.pp)
    i, j = divmod(rest, train.tp)
    lw, cw = layers // train.pp, cols // train.tp
    sub = cw // train.dp
    return {(a, b) for a in range(i * lw, (i + 1) * lw) for b in range(j * cw + r * sub, j * cw + (r + 1) * sub)}


def test_hybrid_engine_sync_groups_and_volume_agree_with_a_count_over_ranks():
    plan = compile(ALGORITHMS["ppo"].build(), "a100-80g:2", SEVEN_B, placement="colocate", debug=True)
    sync = next(op for op in plan.ops if op.kind == "weight_sync")
    actor = plan.placement("actor")
    train, gen = actor.layout, actor.generation_layout
    assert (str(train), str(gen)) == ("dp16·tp1·pp1", "dp2·tp8·pp1")
    layers, cols = train.pp * gen.pp * 2, train.tp * train.dp * gen.tp
    model_bytes = 2 * ModelSpec.preset("llama2-7b").params
    per_cell = model_bytes / (layers * cols)
    shard_rows, shard_cols = layers // gen.pp, cols // gen.tp
    assert sorted(r for g in sync.rank_groups for r in g) == list(range(16))
    for group in sync.rank_groups:
        held = [_elements(r, train, layers, cols) for r in group]
        union = set().union(*held)
        assert sum(map(len, held)) == len(union)  # no cell twice: nothing redundant is gathered
        rows, columns = {a for a, _ in union}, {b for _, b in union}
        assert len(rows) == shard_rows and len(columns) == shard_cols and len(union) == shard_rows * shard_cols
        for cells in held:  # every member receives the rest of the shard
            assert sync.volume_bytes == pytest.approx((len(union) - len(cells)) * per_cell, rel=1e-6)
    assert "micro-DP groups of 2" in sync.note


def test_rollout_pool_gets_a_bucketed_broadcast_and_overlaps_with_staleness():
    graph = ALGORITHMS["ppo"].build()
    spec = "actor+ref@8;critic+reward@4;actor.generate@4"
    on_policy = compile(graph, "a100-80g:2", SEVEN_B, placement=spec, debug=True)
    actor = on_policy.placement("actor")
    sync = next(op for op in on_policy.ops if op.kind == "weight_sync")
    assert actor.generation_pool == "pool2" and sync.pool == "pool0" and sync.target_pool == "pool2"
    assert sync.volume_bytes == 2 * ModelSpec.preset("llama2-7b").params and "buckets" in sync.note
    assert set(on_policy.pool("pool2").devices).isdisjoint(on_policy.pool("pool0").devices)
    with pytest.raises(StalenessError, match="ppo_clip trains on lagged data"):  # PPO has no off-policy correction
        compile(graph, "a100-80g:2", SEVEN_B, placement=spec, staleness=1)
    with pytest.warns(UserWarning, match="no off-policy correction"):
        stale = compile(graph, "a100-80g:2", SEVEN_B, placement=spec, staleness=1, debug=True,
                        allow_uncorrected_staleness=True)
    moved = {op.name for op in stale.ops if op.iteration_offset == 1}
    assert moved == {"actor.weight_sync", "actor.generate"}
    assert not any(set(op.deps) & moved for op in stale.ops if op.iteration_offset == 0)
    assert stale.predicted_iteration_s < on_policy.predicted_iteration_s
    _timeline_is_consistent(stale)


def test_staleness_on_a_shared_pool_says_why_not():
    with pytest.raises(PlanError, match=r"generation runs on pool 'pool0'.*actor.update.*pool of its own"):
        compile(ALGORITHMS["ppo"].build(), "a100-80g:2", SEVEN_B, placement="colocate", staleness=1,
                allow_uncorrected_staleness=True)
    with pytest.raises(PlanError, match="devices of its own"):  # one device: nothing to give the rollout
        compile(ALGORITHMS["ppo"].build(), ClusterSpec.preset("a100-80g", devices_per_node=1), SEVEN_B, staleness=1,
                allow_uncorrected_staleness=True)


def test_staleness_on_one_node_carves_a_rollout_pool_out_of_it():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPO has no IS correction: the compiler warns about the bias
        for placement in ("auto", "split"):
            plan = compile(ALGORITHMS["ppo"].build(), "a100-80g:1", SEVEN_B, placement=placement, staleness=1,
                           allow_uncorrected_staleness=True)
            rollout = plan.placement("actor").generation_pool
            assert rollout and plan.strategy == placement
            assert sum(len(p.devices) for p in plan.pools if p.name != "host") == 8
            assert not set(plan.pool(rollout).devices) & {d for p in plan.pools if p.name != rollout for d in p.devices}


def test_auto_with_staleness_gives_the_rollout_whole_nodes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        report = compile_report(ALGORITHMS["ppo"].build(), "a100-80g:3", SEVEN_B, staleness=1, debug=True,
                                allow_uncorrected_staleness=True)
    assert [label for label, _ in report.candidates] == ["auto+rollout@8", "auto+rollout@16"]
    gen_pool = report.plan.placement("actor").generation_pool
    assert gen_pool and len(report.plan.pool(gen_pool).devices) % 8 == 0
    _timeline_is_consistent(report.plan)


def test_offload_brackets_keep_one_role_resident_at_a_time():
    plan = compile(ALGORITHMS["ppo"].build(), "a100-80g:2", {"actor": "llama2-34b"}, placement="colocate", debug=True)
    pool = plan.pools[0]
    assert pool.offload
    resident: str | None = None
    for op in sorted((op for op in plan.ops if op.pool == pool.name), key=lambda o: o.predicted_start_s):
        if op.kind == "onload":
            assert resident is None
            resident = op.role
        elif op.kind == "offload":
            assert resident == op.role
            resident = None
        else:
            assert resident == op.role, f"{op.name} runs while {resident} is resident"
    critic_on = next(op for op in plan.ops if op.kind == "onload" and op.role == "critic")
    assert critic_on.items == ("params", "optimizer", "grads")
    assert next(op for op in plan.ops if op.kind == "offload" and op.role == "actor").items[-1] == "kv_cache"
    _timeline_is_consistent(plan)


def test_resident_pools_get_no_offload_and_disjoint_pools_run_concurrently():
    plan = compile(ALGORITHMS["ppo"].build(), "a100-80g:2", SEVEN_B, placement="split", debug=True)
    assert not any(op.kind in ("offload", "onload") for op in plan.ops)
    by = {op.name: op for op in plan.ops}
    assert by["ref.logprob"].pool != by["critic.values"].pool
    assert by["critic.values"].predicted_start_s < by["ref.logprob"].predicted_end_s  # they overlap in time
    _timeline_is_consistent(plan)


def test_device_maps_and_rule_rewards():
    tiny = BatchShape(prompts=8, prompt_len=32, response_len=32)
    graph = ALGORITHMS["grpo"].build()
    plan = compile(graph, "a100-80g:1", {"actor": "qwen2.5-0.5b", "reward": "rule"},
                   placement={"actor": "cuda:0", "ref": "cuda:1", "rm": "cpu"}, batch=tiny, debug=True)
    assert [p.name for p in plan.pools] == ["cuda0", "cuda1", "cpu"]
    assert plan.placement("reward").pool == "cpu" and plan.strategy == "device_map"
    auto = compile(graph, "a100-80g:1", {"actor": "qwen2.5-0.5b", "reward": "rule"}, batch=tiny)
    assert auto.placement("reward").pool == "host" and auto.pool("host").devices == ("cpu",)
    with pytest.raises(PlacementError, match="even with offloading"):
        compile(graph, "cpu-local", {"actor": "llama2-70b", "reward": "rule"}, placement="actor=cpu,ref=cpu")


def test_placement_spec_errors():
    graph = ALGORITHMS["ppo"].build()
    for spec, message in (("actor+ref@8;critic+reward", "ROLES@DEVICES"), ("actor@8;critic+ref+reward@8;ref.generate@4", "rollout pool"),
                          ("actor+critic.generate@8", "holds nothing else"), ("nearby", "pool spec")):
        with pytest.raises(ConfigError, match=message):
            compile(graph, "a100-80g:2", SEVEN_B, placement=spec)


def test_pass_manager_names_the_pass_that_broke_the_plan(monkeypatch):
    def dropping_offload(plan, ctx):  # a broken pass: loses the critic's update
        return plan.model_copy(update={"ops": tuple(op for op in plan.ops if op.name != "critic.update")})

    broken = tuple((name, dropping_offload if name == "offload" else fn) for name, fn in PIPELINE)
    monkeypatch.setattr(compile_module, "PIPELINE", broken)
    with pytest.raises(PlanError, match=r"run by no op.*broken by pass 'offload'"):
        compile(ALGORITHMS["ppo"].build(), "a100-80g:2", SEVEN_B, placement="colocate", debug=True)
    with pytest.raises(PlanError, match=r"broken by pass 'compile'"):  # without debug only the final check runs
        compile(ALGORITHMS["ppo"].build(), "a100-80g:2", SEVEN_B, placement="colocate", debug=False)


def test_hooks_time_and_dump_every_pass(tmp_path):
    timer, dump = PassTimer(), IRDump(tmp_path)
    compile(ALGORITHMS["grpo"].build(), "a100-80g:1", "qwen2.5-1.5b", placement="colocate", hooks=(timer, dump))
    assert list(timer.seconds) == [name for name, _ in PIPELINE]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{k:02d}-{name}.txt" for k, (name, _) in enumerate(PIPELINE)]
    assert "strategy=unplaced" in (tmp_path / "00-lower.txt").read_text()
