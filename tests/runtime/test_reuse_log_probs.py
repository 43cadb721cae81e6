"""Compiler pass 'reuse': a policy's logprob node is served from its rollout only where the numbers are provably the same.

The runtime half checks the claim itself: the rollout's log-probs that the reused op returns
equal the train engine's forward (the op it replaces) to float rounding, and a GRPO/PPO
iteration with the pass gives the update the recomputing plan gives.
"""
from __future__ import annotations

import pytest
import torch

import hybridflow as hf
from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import compile_for, local_machine
from hybridflow.compiler.cost import CostOptions
from hybridflow.compiler.plan import ExecutionPlan, verify_plan
from hybridflow.errors import PlanError
from hybridflow.graph import CONTROLLER
from hybridflow.runtime.local import LocalExecutor

from test_local_executor import BATCH, TINY, _prompts, _specs

REUSE = CostOptions(reuse_rollout_log_probs=True)


def _plan(graph, *, options=REUSE, placement=None, slots=1):
    placement = placement or {r.name: "cpu" for r in graph.roles}
    return compile_for(graph, TINY, machine=local_machine(slots), placement=placement, batch=BATCH, options=options)


def _reused(plan: ExecutionPlan) -> dict[str, str]:
    return {op.node: op.reuse for op in plan.ops if op.reuse}


def test_the_actors_old_log_probs_are_reused_and_nothing_else():
    ppo = ALGORITHMS["ppo"].build(n=2)
    plan = _plan(ppo)
    generate = next(n.name for n in ppo.nodes if n.kind == "generate")
    actor_logprob = next(n.name for n in ppo.nodes if n.op == "logprob" and n.role == "actor")
    assert _reused(plan) == {actor_logprob: generate}  # the reference's logprob node has other weights
    op = next(op for op in plan.ops if op.node == actor_logprob)
    assert op.pool is None and "reused" in op.note and f"from {generate}'s rollout" in plan.to_text()
    assert _reused(_plan(ppo, options=CostOptions())) == {}  # off unless the engines are known to share precision


def test_no_reuse_where_the_rollout_has_other_weights_or_another_distribution():
    grpo = ALGORITHMS["grpo"].build(n=2)
    # two devices with the actor split from its generation (a copy on another pool): recompute
    split = _plan(grpo, placement="actor+ref@1;actor.generate@1", slots=2)
    assert _reused(split) == {}

    @hf.algorithm
    def tempered(prompts, actor, reward):
        rollout = actor.generate(prompts, n=2, temperature=0.5)
        adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
        actor.update(rollout, adv, actor.logprob(rollout), loss="ppo_clip")

    assert _reused(_plan(tempered.build())) == {}


def test_a_vllm_rollout_is_never_reused_it_holds_its_own_weights():
    ppo = ALGORITHMS["ppo"].build(n=2)
    plan = _plan(ppo, options=REUSE.model_copy(update={"rollout_engine": "vllm"}))
    assert plan.placement("actor").rollout_engine == "vllm"
    assert _reused(plan) == {} and _reused(_plan(ppo)) != {}


def test_a_plan_that_reuses_wrongly_is_refused():
    plan = _plan(ALGORITHMS["ppo"].build(n=2))
    ref_op = next(op for op in plan.ops if op.role == "ref")
    bad = plan.model_copy(update={"ops": tuple(op.model_copy(update={"reuse": "generate", "pool": None})
                                               if op is ref_op else op for op in plan.ops)})
    with pytest.raises(PlanError, match="reuses the log-probs"):
        verify_plan(bad)


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_reused_log_probs_equal_the_train_engines_forward(name):
    graph = ALGORITHMS[name].build(n=2)
    results = {}
    for label, options in (("reuse", REUSE), ("recompute", CostOptions())):
        torch.manual_seed(0)
        executor = LocalExecutor(_plan(graph, options=options), _specs(graph))
        results[label] = (executor, executor.run_iteration({"prompts": _prompts()}))
    (ex_reuse, reuse), (_, recompute) = results["reuse"], results["recompute"]
    node = next(n for n in graph.nodes if n.op == "logprob" and n.role == "actor")
    field = node.outputs.fields[0].name
    torch.testing.assert_close(reuse.env[node.name][field], recompute.env[node.name][field], atol=1e-5, rtol=0)
    # the same rollout was sampled, and the update saw the same inputs
    generate = next(n.name for n in graph.nodes if n.kind == "generate")
    assert torch.equal(reuse.env[generate]["response_ids"], recompute.env[generate]["response_ids"])
    assert reuse.metrics["actor/grad_norm"] == pytest.approx(recompute.metrics["actor/grad_norm"], rel=1e-4)
    # the reused op ran on the controller, with no worker forward
    span = next(s for s in ex_reuse.recorder.spans if s.node == node.name)
    assert span.device == CONTROLLER
    assert not any(s.node == node.name for s in ex_reuse.worker_spans)
