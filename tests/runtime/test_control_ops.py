"""Control ops on the LocalExecutor: checkpoint, restore, export, a new reward source and a report, each a plan.

The plans come from :func:`hybridflow.compiler.control.control_plan` (the training plan's pools and
bracketing) and run through ``executor.run_plan``, exactly as the trainer runs them; the results come
back per op, in rank order.
"""
from __future__ import annotations

import torch

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import compile_for, local_machine
from hybridflow.compiler.control import control_plan
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.passes import BatchShape
from hybridflow.data import make_prompt_batch, make_tiny_model, make_tiny_tokenizer
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig
from hybridflow.runtime.local import LocalExecutor
from hybridflow.runtime.roles import RoleSpec
from hybridflow.trainer.run_state import role_sections, state_sections
from hybridflow_ops.rewards.arithmetic import compute_score

torch.set_num_threads(1)
TOKENIZER = make_tiny_tokenizer("arithmetic")


def _model(seed=0):
    return make_tiny_model("qwen2", vocab_size=len(TOKENIZER), hidden=32, layers=1, heads=2, kv_heads=1, seed=seed)


def _executor(algorithm="grpo", **attrs) -> LocalExecutor:
    graph = ALGORITHMS[algorithm].build(**attrs)
    plan = compile_for(graph, ModelSpec.from_config(_model().config.to_dict(), name="tiny"), machine=local_machine(1),
                       placement={r.name: "cpu" for r in graph.roles},
                       batch=BatchShape(prompts=4, prompt_len=8, response_len=3, mini_batches=1))
    specs = {}
    for role in graph.roles:
        if role.kind == "policy":
            specs[role.name] = RoleSpec(model=_model(), tokenizer=TOKENIZER, sampling=SamplingParams(max_new_tokens=3, seed=0),
                                        train=TrainEngineConfig(lr=5e-2))
        elif role.kind == "reference":
            specs[role.name] = RoleSpec(model=_model())
        else:
            specs[role.name] = RoleSpec(reward=compute_score, tokenizer=TOKENIZER)
    return LocalExecutor(plan, specs)


def _prompts(step=0):
    return {"prompts": make_prompt_batch(make_arithmetic_rows()[4 * step:4 * step + 4], TOKENIZER)}


def _weights(executor) -> dict[str, torch.Tensor]:
    exported = executor.run_plan(control_plan(executor.plan, "export")).results["actor.export"]
    assert len(exported) == 1  # one slot: rank 0's
    return exported[0]["model"]


def test_a_restore_plan_brings_back_the_weights_the_optimizer_and_the_sampler(tmp_path):
    executor = _executor(n=2, kl_loss=False)
    executor.run_iteration(_prompts(0))
    save = control_plan(executor.plan, "save_state")
    ops = {op.name: op.role for op in save.ops if op.kind == "save_state"}
    results = executor.run_plan(save, args={name: str(tmp_path) for name in ops}).results
    sections, manifest = state_sections(ops, results)
    assert set(sections["engines"]) == {"actor"} and set(sections["rollout_rng"]) == {"actor"}
    assert "actor/.metadata" in manifest  # the shards' files, named relative to the folder
    saved_weights = _weights(executor)
    after_save = executor.run_iteration(_prompts(1))  # samples, updates: weights, Adam moments and sampler move on

    load = control_plan(executor.plan, "load_state")
    executor.run_plan(load, args={op.name: {"folder": str(tmp_path), **role_sections(sections, op.role)}
                                  for op in load.ops if op.kind == "load_state"})
    restored = _weights(executor)
    assert all(torch.equal(restored[k], saved_weights[k]) for k in saved_weights)
    again = executor.run_iteration(_prompts(1))  # the same step again: the same samples and the same update
    assert torch.equal(again.env["actor.generate"]["response_ids"], after_save.env["actor.generate"]["response_ids"])
    assert again.metrics["actor/loss"] == after_save.metrics["actor/loss"]
    assert again.metrics["actor/grad_norm"] == after_save.metrics["actor/grad_norm"]


def test_export_gives_the_train_modules_weights_as_copies():
    executor = _executor(n=2, kl_loss=False)
    module = executor.slots["cpu/rank0"].engines["actor"].train.module  # the local transport's own worker
    exported = _weights(executor)
    assert exported.keys() == module.state_dict().keys()
    assert all(torch.equal(exported[k], v) and exported[k].data_ptr() != v.data_ptr() for k, v in module.state_dict().items())
    executor.run_iteration(_prompts(0))
    assert any(not torch.equal(exported[k], v) for k, v in module.state_dict().items())  # a copy: training moved on


def test_set_reward_installs_a_source_that_the_next_iteration_scores_with():
    executor = _executor(n=2, kl_loss=False)

    def always_two(data_source, solution_str, ground_truth, extra_info=None):
        return 2.0

    role = "reward"
    executor.run_plan(control_plan(executor.plan, "set_reward", [role]),
                      args={f"{role}.set_reward": RoleSpec(reward=always_two, tokenizer=TOKENIZER)})
    (report,) = executor.run_plan(control_plan(executor.plan, "describe", [role])).results[f"{role}.describe"]
    assert report["reward_fn"] is always_two and report["kind"] == "reward"
    scores = executor.run_iteration(_prompts(0)).env["reward.score"]["scores"]
    assert torch.all(scores == 2.0)
