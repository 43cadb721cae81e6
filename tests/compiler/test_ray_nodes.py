"""CPU slots over the nodes of a Ray cluster (:func:`cpu_nodes_machine`), worked by hand; no Ray needed."""
from __future__ import annotations

import pytest

from hybridflow.compiler.machine import Machine, RayNode, bind, compile_for, cpu_nodes_machine, describe_nodes
from hybridflow.errors import PlacementError


def nodes(*cpus: int, head: int | None = None) -> list[RayNode]:
    return [RayNode(f"id{k}", f"10.0.0.{k}", c, head=k == head) for k, c in enumerate(cpus)]


def test_one_node_that_holds_the_slots_is_used_alone():
    # 8 CPUs: 4 slots (the default's cap) of (8 - 1) // 4 = 1 thread; the small nodes are not used
    m = cpu_nodes_machine(nodes(2, 8, 1))
    assert (m.slots, m.nodes, m.threads_per_slot, m.node_ids) == (4, 1, 1, ("id1",))


def test_slots_spread_over_nodes_when_no_node_holds_them():
    # three 1-CPU raylets: 2 slots by default (3 - 1 for the host pools); one per node on two of them,
    # the head (the driver's node) left for the host pools
    m = cpu_nodes_machine(nodes(1, 1, 1, head=0))
    assert (m.slots, m.nodes, m.threads_per_slot) == (1, 2, 1)
    assert m.node_ids == ("id1", "id2")
    # 3 slots on 2-CPU nodes: ceil(3 / 2) = 2 per node on two nodes (4 in all), 1 thread each, 1 CPU spare
    m = cpu_nodes_machine(nodes(2, 2, 1), cpu_slots=3)
    assert (m.slots, m.nodes, m.threads_per_slot, m.node_ids) == (2, 2, 1, ("id0", "id1"))
    # 2 slots on two 4-CPU nodes (and a 1-CPU head): one node holds both, 3 // 2 = 1 thread each
    m = cpu_nodes_machine(nodes(1, 4, 4, head=0), cpu_slots=2)
    assert (m.slots, m.nodes, m.threads_per_slot) == (2, 1, 1)
    # 4 slots on two 4-CPU nodes and the head: 2 per node on one node? 4 > 4 - 1 spare -> no; one node of 4 slots
    # leaves 9 - 4 = 5 spare, so one node it is, with (4 - 1) // 4 -> 1 thread
    assert cpu_nodes_machine(nodes(1, 4, 4, head=0), cpu_slots=4).nodes == 1
    # 6 slots: no node has 6 CPUs; 3 per node on the two 4-CPU nodes, 1 thread, 9 - 6 = 3 spare
    m = cpu_nodes_machine(nodes(1, 4, 4, head=0), cpu_slots=6)
    assert (m.slots, m.nodes, m.threads_per_slot, m.node_ids) == (3, 2, 1, ("id1", "id2"))


def test_a_cluster_without_cpus_is_an_error():
    with pytest.raises(PlacementError, match="no node with a CPU"):
        cpu_nodes_machine(nodes(0, 0))


def test_bind_records_the_ray_node_of_each_plan_node():
    from hybridflow.algorithms import ALGORITHMS
    from hybridflow.compiler.passes import BatchShape

    machine = cpu_nodes_machine(nodes(1, 1, 1, head=0))
    plan = compile_for(ALGORITHMS["grpo"].build(kl_loss=False), "qwen2.5-0.5b", machine=machine, placement="colocate",
                       batch=BatchShape(prompts=4, prompt_len=8, response_len=8, mini_batches=1))
    assert plan.nodes == ("id1", "id2")
    (pool,) = [p for p in plan.pools if p.name != "host"]
    assert pool.slots == ("n0.d0", "n1.d0")  # one pool over both machines
    assert describe_nodes(machine) == "n0 -> Ray node id1 at 10.0.0.1, n1 -> Ray node id2 at 10.0.0.2"
    assert describe_nodes(Machine("cpu", 2)) == "plan nodes on any Ray node"
    assert bind(plan, machine).nodes == ("id1", "id2")
