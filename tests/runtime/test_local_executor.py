"""LocalExecutor: runs compiled, bound plans of the standard algorithms on tiny models, honouring weight syncs and offloads."""
from __future__ import annotations

import json

import pytest
import torch

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import compile_for, local_machine
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.passes import BatchShape
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


TINY = ModelSpec.from_config(_model().config.to_dict(), name="tiny")
BATCH = BatchShape(prompts=4, prompt_len=8, response_len=3, mini_batches=1)


def local_plan_for(graph, placement=None, slots=1):
    """The graph compiled for this machine (all roles on one CPU device unless ``placement`` says otherwise), bound."""
    placement = placement or {r.name: "cpu" for r in graph.roles}
    return compile_for(graph, TINY, machine=local_machine(slots), placement=placement, batch=BATCH)


def _prompts(n=4):
    return make_prompt_batch(make_arithmetic_rows()[:n], TOKENIZER)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_standard_algorithm_runs_one_iteration(name, tmp_path):
    overrides = {"n": 2} if "n" in dict(graph_attrs(name)) else {}
    graph = ALGORITHMS[name].build(**overrides, **({"k": 2} if name == "passk" else {}))  # pass@k needs n >= k
    executor = LocalExecutor(local_plan_for(graph), _specs(graph, reward=lambda *a, **k: 1.0 if name == "safe_rlhf" else compute_score(*a, **k)))
    result = executor.run_iteration({"prompts": _prompts()})
    assert set(result.env) == {"prompts"} | {n.name for n in graph.nodes}
    for node in graph.nodes:
        for field in node.outputs.fields:
            value = result.env[node.name][field.name]
            assert torch.isfinite(value.float()).all(), (node.name, field.name)
    updated = {n.role for n in graph.nodes if n.kind == "update"}
    assert any(k.endswith("/grad_norm") for k in result.metrics) == bool(updated)
    # One span per op (per round for the ops of a dynamic-sampling region), written as a Chrome trace that names every op.
    if graph.resample:
        from collections import Counter

        body = [op.name for op in executor.plan.ops if op.node in graph.resample[0].nodes]
        repeats = Counter(body * int(result.metrics["dynamic_sampling/extra_rounds"]))
        assert Counter(s.op for s in executor.recorder.spans) == Counter(op.name for op in executor.plan.ops) + repeats
    else:
        assert [s.op for s in executor.recorder.spans] == [op.name for op in executor.plan.ops]
    trace = json.loads(write_chrome_trace(executor.recorder.spans, tmp_path / "trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} == {op.name for op in executor.plan.ops}


def graph_attrs(name):
    return ALGORITHMS[name].build().attrs


def test_compute_nodes_equal_the_op_called_directly():
    graph = ALGORITHMS["grpo"].build(n=4, kl_loss=False)
    result = LocalExecutor(local_plan_for(graph), _specs(graph)).run_iteration({"prompts": _prompts(2)})
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
    executor = LocalExecutor(local_plan_for(graph), _specs(graph, reward=costs))

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
    executor = LocalExecutor(local_plan_for(graph), _specs(graph, share=False, lr=0.05))
    worker = executor.slots["cpu/rank0"]  # the local transport's own worker
    engines = worker.engines["actor"]
    assert engines.rollout.model is not engines.train.module

    def same():
        train = dict(engines.train.module.named_parameters())
        return all(torch.equal(p, train[n]) for n, p in engines.rollout.model.named_parameters())

    executor.run_iteration({"prompts": _prompts()})
    assert not same()  # the update changed the train copy after this iteration's sync
    sync = next(op for op in executor.plan.ops if op.kind == "weight_sync")
    worker.sync_weights(sync.role)
    assert same()


def test_offloaded_role_refuses_work_until_onloaded():
    graph = ALGORITHMS["grpo"].build(n=2, kl_loss=False)
    plan = local_plan_for(graph)
    off = PlanOp(name="actor.offload", kind="offload", role="actor", pool="cpu", items=("params", "optimizer"))
    executor = LocalExecutor(plan.model_copy(update={"ops": (off,) + plan.ops}), _specs(graph))
    with pytest.raises(ExecutionError, match="offloaded"):
        executor.run_iteration({"prompts": _prompts()})
    on = PlanOp(name="actor.onload", kind="onload", role="actor", pool="cpu", items=("params", "optimizer"))
    executor = LocalExecutor(plan.model_copy(update={"ops": (off, on) + plan.ops}), _specs(graph))
    executor.run_iteration({"prompts": _prompts()})


def test_errors_name_what_is_wrong():
    graph = ALGORITHMS["grpo"].build(n=2, kl_loss=False)
    plan = local_plan_for(graph)
    with pytest.raises(ExecutionError, match="no RoleSpec for role"):
        LocalExecutor(plan, {"actor": _specs(graph)["actor"]})
    executor = LocalExecutor(plan, _specs(graph))
    with pytest.raises(ExecutionError, match="takes inputs"):
        executor.run_iteration({"questions": _prompts()})
    nan_reward = LocalExecutor(plan, _specs(graph, reward=lambda *a, **k: float("nan")))
    with pytest.raises(RewardError, match="sample 0"):
        nan_reward.run_iteration({"prompts": _prompts()})


# -- compiled placements: the same math wherever the roles are placed ---------------------------------

PLACEMENTS = {
    # name -> (placement request, CPU slots)
    "device_map": (None, 1),
    "colocate": ("colocate", 1),
    "split": ("split", 2),  # actor+ref on one slot, critic on the other
    "standalone": ("standalone", 3),  # actor, critic and ref on a slot each
    "rollout_pool": ("actor+ref+critic@1;actor.generate@1", 2),  # generation on a pool of its own: a real copy
}


def _two_iterations(placement, slots):
    graph = ALGORITHMS["ppo"].build()
    torch.manual_seed(0)
    plan = local_plan_for(graph, placement, slots)
    executor = LocalExecutor(plan, _specs(graph, share=False, lr=0.05))
    metrics = [executor.run_iteration({"prompts": _prompts()}).metrics for _ in range(2)]
    return plan, executor, metrics


def test_placements_compile_bind_and_agree():
    _, _, reference = _two_iterations(*PLACEMENTS["device_map"])
    for name, (placement, slots) in PLACEMENTS.items():
        plan, executor, metrics = _two_iterations(placement, slots)
        assert plan.machine and all(d == "cpu" for p in plan.pools for d in p.devices), name
        if name in ("split", "standalone", "rollout_pool"):
            assert len([p for p in plan.pools if p.slots[0].startswith("n0.")]) == slots, plan.to_text()
        for got, want in zip(metrics, reference):
            for key in ("critic/score/mean", "actor/pg_loss", "critic/vf_loss", "actor/entropy"):
                assert got[key] == pytest.approx(want[key], abs=1e-5), (name, key)
    # the rollout pool's engine is a copy of the actor's weights, refreshed by the plan's cross-pool sync
    plan, executor, _ = _two_iterations(*PLACEMENTS["rollout_pool"])
    placement = plan.placement("actor")
    train = executor.slots[f"{placement.pool}/rank0"].engines["actor"].train.module
    rollout = executor.slots[f"{placement.generation_pool}/rank0"].engines["actor"].rollout.model
    assert rollout is not train
    sync = next(op for op in plan.ops if op.kind == "weight_sync")
    assert sync.target_pool == placement.generation_pool


def test_unbound_and_oversized_plans_are_named_errors():
    from hybridflow.compiler import bind
    from hybridflow.compiler.compile import compile
    from hybridflow.errors import BindError, PlanError

    graph = ALGORITHMS["grpo"].build(n=2, kl_loss=False)
    machine = local_machine(2)
    plan = compile(graph, machine.cluster(), {"actor": TINY, "reward": "rule"}, placement="colocate", batch=BATCH)
    with pytest.raises(PlanError, match="not bound to a machine"):
        LocalExecutor(plan, _specs(graph))
    with pytest.raises(BindError, match=r"pool 'pool0' \(actor\) needs 2 device\(s\) n0.d0, n0.d1; n0.d1 is not on this machine"):
        bind(plan, local_machine(1))
    with pytest.raises(ExecutionError, match="span several devices.*executor='ray'"):
        LocalExecutor(bind(plan, machine), _specs(graph))
    with pytest.raises(BindError, match="cuda:1"):
        bind(compile(graph, machine.cluster(), {"actor": TINY, "reward": "rule"}, placement={"actor": "cuda:1"}, batch=BATCH),
             machine)


def test_validation_runs_as_a_plan_on_the_training_pools():
    from hybridflow.compiler.validation import validation_plan

    graph = ALGORITHMS["ppo"].build()
    plan = local_plan_for(graph, "actor+critic+ref@1;actor.generate@1", 2)
    torch.manual_seed(0)  # the critic's value head is drawn from the global generator
    executor = LocalExecutor(plan, _specs(graph, share=False, lr=0.05))
    executor.run_iteration({"prompts": _prompts()})  # the update leaves the rollout pool's copy one update behind
    val = validation_plan(plan, samples=3, seed=11)
    assert [op.kind for op in val.ops][:1] == ["weight_sync"] and val.ops[0].target_pool == "pool1"
    assert {op.pool for op in val.ops if op.kind == "node" and op.node.startswith("actor.")} == {"pool1"}
    env = executor.run_plan(val, {"prompts": _prompts()}).env
    greedy, sampled = env["actor.generate_greedy"], env["actor.generate"]
    assert greedy["response_ids"].shape[0] == 4 and sampled["response_ids"].shape[0] == 12
    # the sync before generating: the rollout copy now holds the trained weights
    train = executor.slots["pool0/rank0"].engines["actor"].train.module.state_dict()
    rollout = executor.slots["pool1/rank0"].engines["actor"].rollout.model.state_dict()
    assert all(torch.equal(train[k], rollout[k]) for k in train)
    assert env["reward.score"]["scores"].shape == (4,) and env["reward.score_2"]["scores"].shape == (12,)
    assert executor.iteration == 1 and executor.side_spans and len(executor.recorder.spans) == len(plan.ops)
    # the sampled stream is the node's own: the same seed gives the same samples from the same weights
    again = executor.run_plan(val, {"prompts": _prompts()}).env["actor.generate"]["response_ids"]
    torch.manual_seed(0)
    fresh = LocalExecutor(plan, _specs(graph, share=False, lr=0.05))
    fresh.run_iteration({"prompts": _prompts()})
    first = fresh.run_plan(val, {"prompts": _prompts()}).env["actor.generate"]["response_ids"]
    assert torch.equal(first, sampled["response_ids"]) and not torch.equal(again, sampled["response_ids"])
