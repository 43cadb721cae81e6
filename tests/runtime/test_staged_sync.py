"""Where a staged weight sync (:mod:`hybridflow.runtime.staged_sync`) cannot run, a ConfigError says why and what to set.

Its behaviour on Ray (versions, log-probs, the two halves of the sync) is tested in
tests/runtime/ray/test_staged_sync_ray.py.
"""
from __future__ import annotations

import pytest

from hybridflow.algorithms import grpo_is
from hybridflow.compiler import compile_for
from hybridflow.compiler.passes import BatchShape
from hybridflow.data import make_tiny_model, make_tiny_tokenizer
from hybridflow.errors import ConfigError
from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig
from hybridflow.runtime.local import LocalExecutor
from hybridflow.runtime.roles import RoleSpec
from hybridflow.runtime.staged_sync import check_weight_sync, plan_op_name
from hybridflow_ops.rewards.arithmetic import compute_score

TOKENIZER = make_tiny_tokenizer("arithmetic")


def _executor() -> LocalExecutor:
    graph = grpo_is.build(n=2)
    plan = compile_for(graph, "qwen2.5-0.5b", placement={r.name: "cpu" for r in graph.roles},
                       batch=BatchShape(prompts=2, prompt_len=8, response_len=3))
    model = make_tiny_model("qwen2", vocab_size=len(TOKENIZER), hidden=16, layers=1, heads=2, kv_heads=1, seed=0)
    specs = {"actor": RoleSpec(model=model, tokenizer=TOKENIZER, sampling=SamplingParams(max_new_tokens=3, seed=0),
                               train=TrainEngineConfig(lr=1e-2)),
             "reward": RoleSpec(reward=compute_score, tokenizer=TOKENIZER)}
    return LocalExecutor(plan, specs)


def test_an_executor_refuses_staged_sync_for_a_plan_without_staleness():
    executor = _executor()
    assert executor.plan.staleness == 0 and executor.weight_sync == "collective"
    with pytest.raises(ConfigError, match=r"async_weight_sync=staged .* needs staleness >= 1; set staleness=k"):
        executor.set_weight_sync("staged")
    with pytest.raises(ConfigError, match="async_weight_sync='eager': use one of collective, staged"):
        executor.set_weight_sync("eager")
    executor.set_weight_sync("collective")
    assert executor.weight_sync == "collective"


def test_staged_sync_needs_pools_that_run_at_once_and_no_midway_sync():
    check_weight_sync("staged", staleness=2, executor="ray")
    check_weight_sync("collective", staleness=0, executor="local")
    with pytest.raises(ConfigError, match=r"needs a rollout pool that runs beside the train pool \(executor='ray'\)"):
        check_weight_sync("staged", staleness=2, executor="local")
    with pytest.raises(ConfigError, match="partial_rollouts=continue: a generation continued under newer weights"):
        check_weight_sync("staged", staleness=1, executor="ray", partial_rollouts="continue")


def test_a_staged_syncs_halves_count_as_its_plan_op():
    ops = frozenset({"actor.weight_sync", "actor.generate", "actor.update"})
    assert plan_op_name("actor.weight_sync.stage", ops) == plan_op_name("actor.weight_sync.load", ops) == "actor.weight_sync"
    assert plan_op_name("actor.generate", ops) == "actor.generate"
    assert plan_op_name("critic.load", ops) == "critic.load"  # no plan op 'critic': a name of its own
