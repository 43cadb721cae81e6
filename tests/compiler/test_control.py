"""control_plan / graph_plan: the controller's other requests as plans of the training plan's pools and bracketing."""
from __future__ import annotations

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.compile import compile
from hybridflow.compiler.control import control_plan, state_roles, trained_roles
from hybridflow.compiler.plan import ExecutionPlan, PlanOp, verify_plan
from hybridflow.compiler.validation import validation_plan
from hybridflow.errors import PlanError


@pytest.fixture(scope="module")
def offloaded():
    """PPO's four 34B roles on one pool of 2 A100s: they do not fit together, so the plan offloads each between uses."""
    plan = compile(ALGORITHMS["ppo"].build(), "a100-80g:2", {"actor": "llama2-34b"}, placement="colocate")
    assert plan.pools[0].offload
    return plan


@pytest.fixture(scope="module")
def rollout_pool():
    """GRPO whose actor generates on a pool of its own: a cross-pool weight sync, no offloading."""
    plan = compile(ALGORITHMS["grpo"].build(), "a100-80g:2", {"actor": "qwen2.5-0.5b"}, placement="actor+ref+reward@1;actor.generate@1")
    assert plan.placement("actor").generation_pool not in (None, plan.placement("actor").pool)
    return plan


def _kinds(plan: ExecutionPlan) -> list[tuple[str, str]]:
    return [(op.kind, op.role) for op in plan.ops]


def test_a_checkpoint_saves_every_trained_role_and_policy_inside_the_offload_brackets(offloaded):
    assert trained_roles(offloaded.graph) == ("actor", "critic") and state_roles(offloaded) == ("actor", "critic")
    save = control_plan(offloaded, "save_state")
    verify_plan(save)
    assert save.pools == offloaded.pools and save.placements == offloaded.placements and not save.graph.nodes
    # hand-worked: each role onloaded with what the training plan offloads of it, saved, offloaded again
    items = {role: tuple(dict.fromkeys(i for op in offloaded.ops if op.kind == "offload" and op.role == role for i in op.items))
             for role in ("actor", "critic")}  # every item any of its offloads moves
    assert _kinds(save) == [("onload", "actor"), ("onload", "critic"), ("save_state", "actor"), ("save_state", "critic"),
                            ("offload", "actor"), ("offload", "critic")]
    ops = {op.name: op for op in save.ops}
    assert ops["actor.onload"].items == items["actor"] and ops["critic.offload"].items == items["critic"]
    assert ops["actor.save_state"].items == ("train",)  # its shards; the sampler's RNG on the same slot goes along
    assert set(ops["actor.save_state"].deps) == {"actor.onload", "critic.onload"}
    assert ops["actor.offload"].deps == ("actor.onload", "actor.save_state")


def test_a_restore_syncs_the_rollout_pool_after_loading_the_weights(rollout_pool):
    load = control_plan(rollout_pool, "load_state")
    verify_plan(load)
    sync = next(op for op in rollout_pool.ops if op.kind == "weight_sync")
    gen = rollout_pool.placement("actor").generation_pool
    assert [(op.name, op.pool, op.items) for op in load.ops] == [
        ("actor.load_state", rollout_pool.placement("actor").pool, ("train",)),
        (f"actor.load_state@{gen}", gen, ()),  # the sampler's RNG lives with the rollout engine
        (sync.name, sync.pool, ())]
    assert load.ops[-1].target_pool == gen and set(load.ops[-1].deps) == {"actor.load_state", f"actor.load_state@{gen}"}
    # a checkpoint needs no sync: it reads the train engine and the sampler as they are
    assert not any(op.kind == "weight_sync" for op in control_plan(rollout_pool, "save_state").ops)


def test_export_set_reward_and_describe_act_on_the_roles_pools(offloaded, rollout_pool):
    export = control_plan(offloaded, "export", items=("optimizer",))
    assert _kinds(export) == [("onload", "actor"), ("export", "actor"), ("offload", "actor")]
    assert export.ops[1].items == ("optimizer",)
    reward = control_plan(offloaded, "set_reward", ["reward"])
    assert any(op.kind == "offload" and op.role == "reward" for op in offloaded.ops)  # a reward model on the pool
    assert [(op.kind, op.pool) for op in reward.ops] == [(kind, offloaded.placement("reward").pool)
                                                         for kind in ("onload", "set_reward", "offload")]
    describe = control_plan(rollout_pool, "describe", ["actor"])
    placement = rollout_pool.placement("actor")
    assert [op.pool for op in describe.ops] == [placement.pool, placement.generation_pool]  # no bracketing: as it is


def test_validation_is_a_graph_plan_with_the_same_bracketing(offloaded):
    val = validation_plan(offloaded, samples=2, seed=7)
    kinds = _kinds(val)
    assert kinds[0] == ("onload", "actor") and kinds[-1] == ("offload", "actor")
    sync = next((op for op in offloaded.ops if op.kind == "weight_sync"), None)
    if sync is not None:
        assert kinds[1] == ("weight_sync", "actor")
    generates = [op for op in val.ops if op.kind == "node" and val.graph.node(op.node).kind == "generate"]
    assert all("actor.onload" in op.deps for op in generates)


def test_bad_requests_name_the_kind_and_the_roles(offloaded):
    with pytest.raises(PlanError, match="not a control op kind"):
        control_plan(offloaded, "offload")
    with pytest.raises(PlanError, match=r"export: the plan places no role \['nobody'\]"):
        control_plan(offloaded, "export", ["nobody"])
    bad = offloaded.model_copy(update={"ops": (PlanOp(name="x", kind="save_state", role="actor", pool="pool0",
                                                      items=("params",)),)})
    with pytest.raises(PlanError, match=r"names unknown items \('params',\); use train"):
        verify_plan(bad.model_copy(update={"graph": control_plan(offloaded, "save_state").graph}))
