"""Topology and reservations: the plan's pools as slots, ranks, process groups and Ray bundles (no Ray needed)."""
from __future__ import annotations

import pytest
from ray_testkit import hand_plan

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.plan import LayoutPlan
from hybridflow.errors import ExecutionError
from hybridflow.runtime.ray.cluster import pool_bundle
from hybridflow.runtime.ray.executor import group_backend
from hybridflow.runtime.ray.topology import topology

KINDS = {"actor": "policy", "ref": "reference", "reward": "reward", "critic": "critic"}


def test_slots_ranks_and_groups_of_a_split_plan_with_a_generation_pool():
    graph = ALGORITHMS["grpo"].build()
    plan = hand_plan(graph, {"train": (("actor", "ref"), 2), "score": (("reward",), 1), "gen": ((), 2)},
                     generation=("actor", "gen"))
    topo = topology(plan, KINDS)
    # Pools in plan order, slots in device order: train 0-1, score 2, gen 3-4.
    assert [(s.pool, s.rank, s.global_rank, s.device) for s in topo.slots] == [
        ("train", 0, 0, "n0.d0"), ("train", 1, 1, "n0.d1"), ("score", 0, 2, "n0.d2"), ("gen", 0, 3, "n0.d3"),
        ("gen", 1, 4, "n0.d4")]
    # The actor trains on 'train' (no rollout engine there) and generates on 'gen' (rollout engine only).
    train_roles = {r.role: (r.train, r.rollout, r.dp) for r in topo.slots[0].roles}
    assert train_roles == {"actor": (True, False, 2), "ref": (True, False, 2)}
    assert [(r.role, r.train, r.rollout, r.dp) for r in topo.slots[3].roles] == [("actor", False, True, 2)]
    assert [(r.role, r.train) for r in topo.slots[2].roles] == [("reward", False)]
    # One group per pool, and the broadcast group: the train pool's rank 0 and every generation rank.
    assert topo.groups == {"pool:train": (0, 1), "pool:score": (2,), "pool:gen": (3, 4), "sync:actor:train->gen": (0, 3, 4)}
    sync = next(op for op in plan.ops if op.kind == "weight_sync")
    assert [s.name for s in topo.op_slots(sync)] == ["train/rank0", "train/rank1", "gen/rank0", "gen/rank1"]


def test_tensor_parallel_layouts_are_refused_by_name():
    graph = ALGORITHMS["rloo"].build()
    plan = hand_plan(graph, {"pool0": (("actor", "reward"), 2)})
    placements = tuple(p.model_copy(update={"layout": LayoutPlan(tp=2), "generation_layout": LayoutPlan(tp=2)})
                       if p.role == "actor" else p for p in plan.placements)
    with pytest.raises(ExecutionError, match=r"role 'actor': training layout dp1·tp2·pp1 has tensor or pipeline"):
        topology(plan.model_copy(update={"placements": placements}), KINDS)


def test_bundles_and_backends():
    assert pool_bundle(("n0.d0", "n0.d1"), "GPU", 1.0) == {"CPU": 1.0, "GPU": 1.0}
    assert pool_bundle(("cpu",), "GPU", 0.5) == {"CPU": 0.5}  # a pool of host CPUs takes no GPU
    assert pool_bundle(("n0.d0",), "CPU", 1.0) == {"CPU": 1.0}
    graph = ALGORITHMS["rloo"].build()
    topo = topology(hand_plan(graph, {"a": (("actor",), 2), "b": (("reward",), 1)}), {"actor": "policy", "reward": "reward"})
    devices = {"a/rank0": "cuda:0", "a/rank1": "cuda:0", "b/rank0": "cpu"}
    assert group_backend((0, 1), topo, devices) == "nccl" and group_backend((0, 2), topo, devices) == "gloo"
