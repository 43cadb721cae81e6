"""The environment pool: a multi-turn rollout's environment workers are a host pool of the plan, named by the
generating role's placement and its generate op, shown by ``hybridflow compile`` and the plan's text form."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from hybridflow.cli import main
from hybridflow.compiler.plan import ExecutionPlan, PlanError, verify_plan
from hybridflow.data import create_tiny_model_dir
from hybridflow.data.datasets import write_prompt_dataset
from hybridflow.data.tasks.agent_calc import make_sum3_rows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_calc" / "config.yaml"


@pytest.fixture(scope="module")
def compile_example(tmp_path_factory):
    """``compile_example(*overrides)``: the agent example's config compiled for this machine (its model and data
    made small and local) -> (plan, what ``hybridflow compile`` printed)."""
    root = tmp_path_factory.mktemp("agent_calc")
    model = create_tiny_model_dir(root / "model", task="agent_calc", seed=0, hidden=32, layers=1)
    train = write_prompt_dataset(make_sum3_rows(64, seed=0), root / "train.jsonl")
    val = write_prompt_dataset(make_sum3_rows(4, seed=1), root / "val.jsonl")

    def compile_(*overrides: str) -> tuple[ExecutionPlan, str]:
        out = root / f"plan{len(overrides)}.json"
        argv = ["compile", str(EXAMPLE), "--cluster", "local", f"actor_model_name={model}", f"train_files={train}",
                f"val_files={val}", *overrides, "-o", str(out)]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(argv) == 0
        return ExecutionPlan.from_json(out.read_text()), printed.getvalue()

    return compile_


@pytest.fixture(scope="module")
def agent_plan(compile_example) -> tuple[ExecutionPlan, str]:
    return compile_example()


def test_the_config_sets_the_env_pool_s_workers(compile_example):
    plan, printed = compile_example("env_workers=3")
    assert plan.pool("env").workers == 3
    assert "env (3 env workers on host CPUs): environments of actor" in printed


def test_the_agent_example_plan_has_an_env_pool_named_by_its_generate_op(agent_plan):
    plan, printed = agent_plan
    verify_plan(plan)
    env = plan.pool("env")
    assert env.workers == 2 and env.devices == ("cpu",) and env.memory_bytes is None
    assert plan.placement("actor").env_pool == "env"
    assert {p.role: p.env_pool for p in plan.placements if p.role != "actor"} == {"ref": None, "reward": None}
    (generate,) = [op for op in plan.ops if op.kind == "node" and plan.graph.node(op.node).kind == "generate"]
    assert generate.env_pool == "env" and generate.pool != "env"
    assert all(op.env_pool is None for op in plan.ops if op is not generate)
    assert "env (2 env workers on host CPUs): environments of actor" in printed
    assert "pool env [cpu" in plan.to_text() and "env steps on env" in plan.to_text()


def test_an_env_pool_must_be_a_pool_with_workers(agent_plan):
    plan, _ = agent_plan
    pools = tuple(p.model_copy(update={"workers": None}) if p.name == "env" else p for p in plan.pools)
    with pytest.raises(PlanError, match="env_pool 'env' is not an environment pool"):
        verify_plan(plan.model_copy(update={"pools": pools}))


def test_a_plan_written_before_env_pools_still_loads(agent_plan):
    plan, _ = agent_plan
    old = plan.model_dump(mode="json")
    old["pools"] = [p for p in old["pools"] if p["name"] != "env"]
    for p in old["pools"]:
        p.pop("workers")
    for record in old["placements"] + old["ops"]:
        record.pop("env_pool")
    loaded = ExecutionPlan.from_json(json.dumps(old))
    verify_plan(loaded)
    assert loaded.placement("actor").env_pool is None and all(p.workers is None for p in loaded.pools)


def test_the_placement_drawing_shows_the_env_pool_beside_the_rollout(agent_plan):
    pytest.importorskip("graphviz")
    from hybridflow.viz.plan import plan_to_dot

    plan, _ = agent_plan
    dot = plan_to_dot(plan).source
    assert "subgraph cluster_env" in dot and "2 environment worker(s) on host CPUs" in dot
    assert "env.actor" in dot
    assert "actions → observations" in dot
