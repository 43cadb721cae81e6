"""ExecutionPlan: JSON/text forms, the verifier naming the pass that broke it, device maps, binding to a machine."""
from __future__ import annotations

import json

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import Machine, bind, compile_for, local_machine
from hybridflow.compiler.passes import BatchShape
from hybridflow.compiler.plan import ExecutionPlan, LayoutPlan, PlanOp, verify_plan
from hybridflow.errors import PlacementError, PlanError
from hybridflow.graph import Graph


TINY = "qwen2.5-0.5b"
SMALL = BatchShape(prompts=8, prompt_len=16, response_len=16, mini_batches=1)


def device_map_plan(graph, device_map=None):
    """``graph`` compiled with a device map (every role on the CPU unless the map says otherwise), not bound."""
    from hybridflow.compiler.compile import compile

    placement = {**{r.name: "cpu" for r in graph.roles}, **(device_map or {})}
    return compile(graph, "a100-80g", {"actor": TINY, **{r.name: "rule" for r in graph.roles if r.kind in ("reward", "cost")}},
                   placement=placement, batch=SMALL)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_plan_round_trips_json_and_names_every_node(name):
    graph = ALGORITHMS[name].build()
    plan = device_map_plan(graph)
    again = ExecutionPlan.from_json(plan.to_json())
    assert again == plan
    assert again.graph == graph
    assert again.to_json() == plan.to_json()  # the file form is stable: written, read and written again, byte for byte
    text = plan.to_text()
    for node in graph.nodes:
        assert f"op {node.name}:" in text


def test_a_plan_holds_its_graph_record_and_parses_a_file_s_graph_once():
    graph = ALGORITHMS["ppo"].build()
    plan = device_map_plan(graph)
    assert plan.graph is graph  # the compiler's record, not a copy re-read from JSON
    again = ExecutionPlan.from_json(plan.to_json())
    assert isinstance(again.graph, Graph) and again.graph is again.graph
    assert again.model_copy(update={"staleness": 1}).graph is again.graph  # edits share the parsed record


def test_a_plan_file_with_a_malformed_graph_is_a_plan_error():
    data = json.loads(device_map_plan(ALGORITHMS["ppo"].build()).to_json())
    del data["graph"]["nodes"]
    with pytest.raises(PlanError, match=r"not a valid plan: (.|\n)*graph: missing key\(s\) nodes"):
        ExecutionPlan.from_json(json.dumps(data))


def test_weight_sync_precedes_each_generation_of_an_updated_policy():
    plan = device_map_plan(ALGORITHMS["remax"].build())  # two generations: sampled and greedy
    names = [op.name for op in plan.ops]
    for op in plan.ops:
        if op.kind == "node" and op.node.startswith("actor.generate"):
            sync = [d for d in op.deps if d.startswith("actor.weight_sync")]
            assert len(sync) == 1 and names.index(sync[0]) < names.index(op.name)


def _broken(plan: ExecutionPlan, **changes) -> ExecutionPlan:
    return plan.model_copy(update=changes)


def test_verifier_names_the_pass_and_the_problem():
    plan = device_map_plan(ALGORITHMS["ppo"].build())
    ops = list(plan.ops)
    # Dropping the generate op leaves its consumers depending on an op that does not exist.
    no_generate = _broken(plan, ops=tuple(o for o in ops if o.node != "actor.generate"))
    with pytest.raises(PlanError, match=r"not an earlier op.*broken by pass 'my_pass'"):
        verify_plan(no_generate, after="my_pass")
    # Reversing the order puts consumers before producers.
    with pytest.raises(PlanError, match="not an earlier op"):
        verify_plan(_broken(plan, ops=tuple(reversed(ops))))
    # A consumer that lost its dependency on the producer it reads.
    gae = next(i for i, o in enumerate(ops) if o.node == "gae")
    ops_no_dep = ops.copy()
    ops_no_dep[gae] = ops[gae].model_copy(update={"deps": ("actor.generate",)})
    with pytest.raises(PlanError, match=r"op 'gae' reads '(kl_in_reward|critic.values)' but does not depend"):
        verify_plan(_broken(plan, ops=tuple(ops_no_dep)))
    # A role placed twice, a layout that does not fit its pool, an unknown pool.
    with pytest.raises(PlanError, match="placed 2 times"):
        verify_plan(_broken(plan, placements=plan.placements + plan.placements[:1]))
    wide = plan.placements[0].model_copy(update={"layout": LayoutPlan(dp=2)})
    with pytest.raises(PlanError, match="uses 2 devices but pool"):
        verify_plan(_broken(plan, placements=(wide,) + plan.placements[1:]))
    with pytest.raises(PlanError, match="unknown pool"):
        verify_plan(_broken(plan, ops=ops[:1] + [ops[1].model_copy(update={"pool": "nowhere"})] + ops[2:]))
    # An empty pool name is a name, and unknown (a fuzzed plan.json once reached a KeyError with it).
    for key in ("pool", "generation_pool"):
        nameless = plan.placements[0].model_copy(update={key: ""})
        with pytest.raises(PlanError, match="placed on unknown pool ''"):
            verify_plan(_broken(plan, placements=(nameless,) + plan.placements[1:]))
    # A node run twice, a node run on the wrong role, an unknown offload item.
    with pytest.raises(PlanError, match="run twice"):
        verify_plan(_broken(plan, ops=tuple(ops) + (ops[-1].model_copy(update={"name": "again"}),)))
    with pytest.raises(PlanError, match="the node's role is"):
        verify_plan(_broken(plan, ops=tuple(o.model_copy(update={"role": "critic"}) if o.node == "actor.update" else o for o in ops)))
    bad_item = PlanOp(name="off", kind="offload", role="actor", pool="cpu", items=("everything",))
    with pytest.raises(PlanError, match="unknown items"):
        verify_plan(_broken(plan, ops=tuple(ops) + (bad_item,)))


def test_from_json_rejects_garbage_with_plan_errors():
    plan = device_map_plan(ALGORITHMS["grpo"].build())
    for text in ("{", "[]", '{"version": 99}', plan.to_json().replace('"ops"', '"opz"')):
        with pytest.raises(PlanError):
            ExecutionPlan.from_json(text)


def test_device_map_aliases_and_errors():
    graph = ALGORITHMS["ppo"].build()
    plan = device_map_plan(graph, {"actor": "cpu", "critic": "cpu", "ref": "cpu", "rm": "cpu"})
    assert [p.name for p in plan.pools] == ["cpu"]
    assert plan.placement("reward").pool == "cpu"
    split = device_map_plan(graph, {"actor": "cuda:0", "critic": "cuda:1", "rm": "cpu"})
    assert split.placement("actor").pool == "cuda0" and split.placement("critic").pool == "cuda1"
    assert split.placement("ref").pool == "cpu"  # unnamed roles default to cpu here
    assert device_map_plan(graph, {"actor": "cuda"}).placement("actor").pool == "cuda0"
    # bound to a machine with two GPUs, the map's devices are kept; a CPU-only machine lacks them
    bound = bind(split, Machine("cuda", 2))
    assert bound.pool("cuda1").devices == ("cuda:1",) and bound.machine == "local: 2 CUDA devices"
    with pytest.raises(PlacementError, match=r"pool 'cuda1' \(critic\) needs 1 device\(s\) cuda:1; cuda:1 is not on this machine"):
        bind(split, Machine("cpu", 1))
    with pytest.raises(PlacementError, match="actor_lora.*roles are"):
        device_map_plan(graph, {"actor_lora": "cuda:1"})
    with pytest.raises(PlacementError, match="is not a device"):
        device_map_plan(graph, {"actor": "gpu0"})


def test_bind_maps_slots_to_devices_and_keeps_their_names():
    graph = ALGORITHMS["ppo"].build()
    plan = compile_for(graph, TINY, machine=Machine("cuda", 4), placement="split", batch=SMALL)
    assert plan.machine == "local: 4 CUDA devices"
    pools = {p.name: p for p in plan.pools}
    assert pools["pool0"].slots == ("n0.d0", "n0.d1") and pools["pool0"].devices == ("cuda:0", "cuda:1")
    assert pools["pool1"].devices == ("cuda:2", "cuda:3") and pools["host"].devices == ("cpu",)
    assert "[cuda:0, cuda:1 = n0.d0, n0.d1]" in plan.to_text()
    cpu = compile_for(graph, TINY, machine=local_machine(2), placement="split", batch=SMALL)
    assert [p.devices for p in cpu.pools] == [("cpu",), ("cpu",), ("cpu",)]
    # binding is idempotent, and a bound plan can be bound to another machine that has its slots
    assert bind(cpu, local_machine(2)) == cpu
    assert bind(cpu, Machine("cuda", 2)).pool("pool1").devices == ("cuda:1",)
