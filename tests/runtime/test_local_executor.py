"""LocalExecutor: runs compiled plans of the standard algorithms on tiny models, honouring weight syncs and offloads."""
from __future__ import annotations

import json

import pytest
import torch

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.local_plan import plan_local
from hybridflow.compiler.plan import PlanOp
from hybridflow.data import make_prompt_batch, make_tiny_model, make_tiny_tokenizer
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
from hybridflow.errors import ExecutionError, RewardError
from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig
from hybridflow.runtime.local import LocalExecutor
from hybridflow.runtime.roles import RoleSpec
from hybridflow.runtime.spans import write_chrome_trace
from hybridflow_ops import get_op
from hybridflow_ops.rewards.arithmetic import compute_score

torch.set_num_threads(1)
TOKENIZER = make_tiny_tokenizer("arithmetic")


def _model(seed=0):
    return make_tiny_model("qwen2", vocab_size=len(TOKENIZER), hidden=32, layers=1, heads=2, kv_heads=1, seed=seed)


def _specs(graph, *, reward=compute_score, share=True, lr=1e-2):
    sampling = SamplingParams(max_new_tokens=3, seed=0)
    specs = {}
    for role in graph.roles:
        if role.kind == "policy":
            specs[role.name] = RoleSpec(model=_model(), tokenizer=TOKENIZER, sampling=sampling,
                                        train=TrainEngineConfig(lr=lr), share_rollout_module=share)
        elif role.kind == "critic":
            specs[role.name] = RoleSpec(model=_model(1), train=TrainEngineConfig(lr=lr))
        elif role.kind == "reference":
            specs[role.name] = RoleSpec(model=_model())
        else:
            specs[role.name] = RoleSpec(reward=reward, tokenizer=TOKENIZER)
    return specs


def _prompts(n=4):
    return make_prompt_batch(make_arithmetic_rows()[:n], TOKENIZER)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_standard_algorithm_runs_one_iteration(name, tmp_path):
    graph = ALGORITHMS[name].build(**({"n": 2} if "n" in dict(graph_attrs(name)) else {}))
    executor = LocalExecutor(plan_local(graph), _specs(graph, reward=lambda *a, **k: 1.0 if name == "safe_rlhf" else compute_score(*a, **k)))
    result = executor.run_iteration({"prompts": _prompts()})
    assert set(result.env) == {"prompts"} | {n.name for n in graph.nodes}
    for node in graph.nodes:
        for field in node.outputs.fields:
            value = result.env[node.name][field.name]
            assert torch.isfinite(value.float()).all(), (node.name, field.name)
    updated = {n.role for n in graph.nodes if n.kind == "update"}
    assert any(k.endswith("/grad_norm") for k in result.metrics) == bool(updated)
    # One span per op, written as a Chrome trace that names every op.
    assert [s.op for s in executor.recorder.spans] == [op.name for op in executor.plan.ops]
    trace = json.loads(write_chrome_trace(executor.recorder.spans, tmp_path / "trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} == {op.name for op in executor.plan.ops}


def graph_attrs(name):
    return ALGORITHMS[name].build().attrs


def test_compute_nodes_equal_the_op_called_directly():
    graph = ALGORITHMS["grpo"].build(n=4, kl_loss=False)
    result = LocalExecutor(plan_local(graph), _specs(graph)).run_iteration({"prompts": _prompts(2)})
    rollout, scores = result.env["actor.generate"], result.env["reward.score"]["scores"]
    # The scores are the rule reward of the decoded responses, in order.
    expected = [compute_score("arithmetic", r, g) for r, g in zip(rollout["responses"], rollout["ground_truth"])]
    assert scores.tolist() == pytest.approx(expected)
    direct = get_op("grpo_advantage").fn(scores, rollout["group_index"], rollout["response_mask"])
    assert torch.equal(result.env["grpo_advantage"]["advantages"], direct.advantages)


def test_params_set_a_compute_node_for_one_iteration():
    # Safe-RLHF's multiplier as run state: lambda = 3 for one call, the plan's 0.5 again for the next.
    from hybridflow.errors import GraphError

    graph = ALGORITHMS["safe_rlhf"].build(lagrange_lambda=0.5)
    costs = lambda data_source, solution_str, ground_truth, extra_info=None: float(len(solution_str.strip()) > 1)
    executor = LocalExecutor(plan_local(graph), _specs(graph, reward=costs))

    def combined(result, lagrange_lambda):
        env = result.env
        mask = env["actor.generate"]["response_mask"]
        expected = (env["gae"]["advantages"] - lagrange_lambda * env["gae_2"]["advantages"]) / (1 + lagrange_lambda)
        return torch.allclose(env["safe_rlhf_advantage"]["advantages"], expected * mask)

    result = executor.run_iteration({"prompts": _prompts()}, params={"safe_rlhf_advantage": {"lagrange_lambda": 3.0}})
    assert combined(result, 3.0) and not combined(result, 0.5)
    assert dict(executor.graph.node("safe_rlhf_advantage").attrs.params) == {"lagrange_lambda": 3.0}
    assert combined(executor.run_iteration({"prompts": _prompts()}), 0.5)
    with pytest.raises(GraphError, match="has no parameter gamma"):
        executor.run_iteration({"prompts": _prompts()}, params={"safe_rlhf_advantage": {"gamma": 0.9}})


def test_weight_sync_refreshes_a_separate_rollout_copy():
    graph = ALGORITHMS["grpo"].build(n=2, kl_loss=False)
    executor = LocalExecutor(plan_local(graph), _specs(graph, share=False, lr=0.05))
    engines = executor.workers["cpu"].engines["actor"]
    assert engines.rollout.model is not engines.train.module

    def same():
        train = dict(engines.train.module.named_parameters())
        return all(torch.equal(p, train[n]) for n, p in engines.rollout.model.named_parameters())

    executor.run_iteration({"prompts": _prompts()})
    assert not same()  # the update changed the train copy after this iteration's sync
    sync = next(op for op in executor.plan.ops if op.kind == "weight_sync")
    executor.workers["cpu"].sync_weights(sync.role)
    assert same()


def test_offloaded_role_refuses_work_until_onloaded():
    graph = ALGORITHMS["grpo"].build(n=2, kl_loss=False)
    plan = plan_local(graph)
    off = PlanOp(name="actor.offload", kind="offload", role="actor", pool="cpu", items=("params", "optimizer"))
    executor = LocalExecutor(plan.model_copy(update={"ops": (off,) + plan.ops}), _specs(graph))
    with pytest.raises(ExecutionError, match="offloaded"):
        executor.run_iteration({"prompts": _prompts()})
    on = PlanOp(name="actor.onload", kind="onload", role="actor", pool="cpu", items=("params", "optimizer"))
    executor = LocalExecutor(plan.model_copy(update={"ops": (off, on) + plan.ops}), _specs(graph))
    executor.run_iteration({"prompts": _prompts()})


def test_errors_name_what_is_wrong():
    graph = ALGORITHMS["grpo"].build(n=2, kl_loss=False)
    plan = plan_local(graph)
    with pytest.raises(ExecutionError, match="no RoleSpec for role"):
        LocalExecutor(plan, {"actor": _specs(graph)["actor"]})
    executor = LocalExecutor(plan, _specs(graph))
    with pytest.raises(ExecutionError, match="takes inputs"):
        executor.run_iteration({"questions": _prompts()})
    nan_reward = LocalExecutor(plan, _specs(graph, reward=lambda *a, **k: float("nan")))
    with pytest.raises(RewardError, match="sample 0"):
        nan_reward.run_iteration({"prompts": _prompts()})
