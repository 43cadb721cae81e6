"""Topology and reservations: the plan's pools as slots, ranks, process groups and Ray bundles (no Ray needed)."""
from __future__ import annotations

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.compile import compile
from hybridflow.compiler.cost import CostOptions
from hybridflow.compiler.passes import BatchShape
from hybridflow.compiler.plan import LayoutPlan
from hybridflow.errors import ExecutionError
from hybridflow.runtime.ray.cluster import pool_bundle
from hybridflow.runtime.ray.executor import group_backend
from hybridflow.runtime.topology import topology

KINDS = {"actor": "policy", "ref": "reference", "reward": "reward", "critic": "critic"}
SMALL = BatchShape(prompts=8, prompt_len=16, response_len=16, mini_batches=1)


def compiled(graph, placement: str, devices: int):
    """``graph`` compiled for ``devices`` GPUs with a rule reward (abstract slots, not bound)."""
    return compile(graph, ClusterSpec.preset("a100-80g").model_copy(update={"devices_per_node": devices}),
                   {"actor": "qwen2.5-0.5b", "reward": "rule"}, placement=placement, batch=SMALL,
                   options=CostOptions(data_parallel_only=True))


def test_slots_ranks_and_groups_of_a_split_plan_with_a_generation_pool():
    graph = ALGORITHMS["grpo"].build()
    plan = compiled(graph, "actor(dp2,tp1,pp1)+ref(dp2,tp1,pp1)@2;actor.generate(dp2,tp1,pp1)@2", 4)
    topo = topology(plan, KINDS)
    # Pools in plan order, slots in device order: train 0-1, generation 2-3, the rule reward's host pool 4.
    assert [(s.pool, s.rank, s.global_rank, s.device) for s in topo.slots] == [
        ("pool0", 0, 0, "n0.d0"), ("pool0", 1, 1, "n0.d1"), ("pool1", 0, 2, "n0.d2"), ("pool1", 1, 3, "n0.d3"),
        ("host", 0, 4, "cpu")]
    # The actor trains on pool0 (no rollout engine there) and generates on pool1 (rollout engine only).
    train_roles = {r.role: (r.train, r.rollout, r.dp) for r in topo.slots[0].roles}
    assert train_roles == {"actor": (True, False, 2), "ref": (True, False, 2)}
    assert [(r.role, r.train, r.rollout, r.dp) for r in topo.slots[2].roles] == [("actor", False, True, 2)]
    assert [(r.role, r.train) for r in topo.slots[4].roles] == [("reward", False)]
    # One group per pool, and the broadcast group: the train pool's rank 0 and every generation rank.
    assert topo.groups == {"pool:pool0": (0, 1), "pool:pool1": (2, 3), "pool:host": (4,), "sync:actor:pool0->pool1": (0, 2, 3)}
    sync = next(op for op in plan.ops if op.kind == "weight_sync")
    assert [s.name for s in topo.op_slots(sync)] == ["pool0/rank0", "pool0/rank1", "pool1/rank0", "pool1/rank1"]


def test_tensor_parallel_layouts_are_refused_by_name():
    graph = ALGORITHMS["rloo"].build()
    plan = compiled(graph, "colocate", 2)
    placements = tuple(p.model_copy(update={"layout": LayoutPlan(tp=2), "generation_layout": LayoutPlan(tp=2)})
                       if p.role == "actor" else p for p in plan.placements)
    with pytest.raises(ExecutionError, match=r"role 'actor': training layout dp1·tp2·pp1 has tensor or pipeline"):
        topology(plan.model_copy(update={"placements": placements}), KINDS)


def test_bundles_and_backends():
    assert pool_bundle(("n0.d0", "n0.d1"), "GPU", 1.0) == {"CPU": 1.0, "GPU": 1.0}
    assert pool_bundle(("cpu",), "GPU", 0.5) == {"CPU": 0.5}  # a pool of host CPUs takes no GPU
    assert pool_bundle(("n0.d0",), "CPU", 1.0) == {"CPU": 1.0}
    graph = ALGORITHMS["rloo"].build()
    topo = topology(compiled(graph, "colocate", 2), {"actor": "policy", "reward": "reward"})
    devices = {"pool0/rank0": "cuda:0", "pool0/rank1": "cuda:0", "host/rank0": "cpu"}
    assert group_backend((0, 1), topo, devices) == "nccl" and group_backend((0, 2), topo, devices) == "gloo"


def test_each_slot_is_pinned_to_its_plan_nodes_ray_node():
    from hybridflow.compiler import Machine, compile_for
    from hybridflow.runtime.ray.cluster import NODE_LABEL, PoolLayout, pool_groups

    graph = ALGORITHMS["grpo"].build(kl_loss=False)
    machine = Machine("cuda", 2, nodes=2, where="ray", node_addresses=("10.0.0.1", "10.0.0.1"), node_ids=("aa", "bb"))
    plan = compile_for(graph, "qwen2.5-0.5b", machine=machine, placement="actor@2;actor.generate@2", batch=SMALL)
    assert plan.nodes == ("aa", "bb")  # ids, not addresses: two raylets of one host stay apart
    assert [p.slots for p in plan.pools] == [("n0.d0", "n0.d1"), ("n1.d0", "n1.d1"), ("cpu",)]
    groups = pool_groups(plan, "GPU", 1.0)
    gpu = {"CPU": 1.0, "GPU": 1.0}
    assert groups["pool0"] == PoolLayout(gpu, ({NODE_LABEL: "aa"},) * 2, "STRICT_PACK")
    assert groups["pool1"] == PoolLayout(gpu, ({NODE_LABEL: "bb"},) * 2, "STRICT_PACK")
    assert groups["host"] == PoolLayout({"CPU": 0.5}, (), "PACK")  # the rule reward goes wherever there is room
    # a pool spanning both nodes: PACK, each bundle on its own slot's node
    wide = compile_for(graph, "qwen2.5-0.5b", machine=machine, placement="actor@4", batch=SMALL)
    (pool,) = [p for p in wide.pools if p.name != "host"]
    assert pool.slots == ("n0.d0", "n0.d1", "n1.d0", "n1.d1")
    assert pool_groups(wide, "GPU", 1.0)[pool.name] == PoolLayout(
        gpu, ({NODE_LABEL: "aa"},) * 2 + ({NODE_LABEL: "bb"},) * 2, "PACK")
    # bound without node ids (a local machine): no node constraint
    local = compile_for(graph, "qwen2.5-0.5b", machine=Machine("cuda", 4), placement="actor@2;actor.generate@2", batch=SMALL)
    assert {(p.strategy, p.selectors) for p in pool_groups(local, "GPU", 1.0).values()} == {("PACK", ())}
