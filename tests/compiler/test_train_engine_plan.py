"""The plan records each role's training engine (RolePlacement.train_engine): compiled, costed, round-tripped, refused by bind."""
from __future__ import annotations

import json

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import bind, local_machine
from hybridflow.compiler.compile import compile
from hybridflow.compiler.layout import Layout
from hybridflow.compiler.memory import PARAM_BYTES
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.placement import place_fixed
from hybridflow.compiler.passes import resolve_models
from hybridflow.compiler.passes.context import CompileContext
from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.plan import ExecutionPlan, verify_plan
from hybridflow.compiler.reshard import transition_figures
from hybridflow.errors import BindError, ConfigError

SEVEN_B = {"actor": "llama2-7b"}


def _layout(lp) -> Layout:
    return Layout(lp.dp, lp.tp, lp.pp)


@pytest.fixture(scope="module")
def graph():
    return ALGORITHMS["ppo"].build()


@pytest.fixture(scope="module")
def megatron_plan(graph):
    return compile(graph, "a100-80g:2", SEVEN_B, placement="colocate", engines=("megatron",), debug=True)


def test_default_plans_train_with_fsdp_and_print_as_before(graph):
    plan = compile(graph, "a100-80g:2", SEVEN_B, placement="colocate")
    assert {p.train_engine for p in plan.placements} == {"fsdp"}
    assert "[fsdp]" not in plan.to_text()


def test_megatron_plan_round_trips_and_names_the_engine(megatron_plan):
    verify_plan(megatron_plan)
    trained = [p for p in megatron_plan.placements if p.role in ("actor", "critic")]
    assert {p.train_engine for p in trained} == {"megatron"}
    again = ExecutionPlan.from_json(megatron_plan.to_json())
    assert again == megatron_plan and again.to_text() == megatron_plan.to_text()
    assert "[megatron]" in megatron_plan.to_text()
    # a plan written before the field existed reads as fsdp
    data = json.loads(megatron_plan.to_json())
    for p in data["placements"]:
        del p["train_engine"]
    assert {p.train_engine for p in ExecutionPlan.from_json(json.dumps(data)).placements} == {"fsdp"}


def test_megatron_plan_is_costed_with_its_engine(graph, megatron_plan):
    # the hybrid-engine transition moves the paper's M/(tg·pg) - M/(t·p), not fsdp's M/(tg·pg) - M/(t·p·d)
    actor = megatron_plan.placement("actor")
    train, gen = _layout(actor.layout), _layout(actor.generation_layout)
    m = PARAM_BYTES * ModelSpec.preset("llama2-7b").params
    (sync,) = [op for op in megatron_plan.ops if op.kind == "weight_sync"]
    assert sync.volume_bytes == int(transition_figures(m, train, gen, "megatron").comm_volume_bytes)
    if train.dp > 1:
        assert sync.volume_bytes != int(transition_figures(m, train, gen, "fsdp").comm_volume_bytes)
    # the timeline agrees with the search's own evaluation of the same strategy and engine (one pool: the
    # stage sum of evaluate is the op chain of the schedule, up to the controller's small ops)
    ctx = CompileContext(graph=graph, cluster=ClusterSpec.parse("a100-80g:2"), models=resolve_models(graph, SEVEN_B),
                         engines=("megatron",))
    searched = place_fixed("colocate", ctx.workload, ctx.cluster)
    assert megatron_plan.predicted_iteration_s == pytest.approx(searched.iteration_s, rel=1e-3)
    fsdp = compile(graph, "a100-80g:2", SEVEN_B, placement="colocate")
    assert megatron_plan.predicted_iteration_s != pytest.approx(fsdp.predicted_iteration_s, rel=1e-3)


def test_bind_refuses_an_engine_the_runtime_does_not_run(megatron_plan):
    with pytest.raises(BindError, match="megatron.*compile with engines"):
        bind(megatron_plan, local_machine(1))


def test_unknown_engine_is_a_config_error(graph):
    with pytest.raises(ConfigError, match="deepspeed"):
        compile(graph, "a100-80g:2", SEVEN_B, placement="colocate", engines=("deepspeed",))
