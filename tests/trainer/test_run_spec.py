"""The run spec (hybridflow/trainer/run_spec.py): one model table, one batch shape, what the run and compile share."""
from __future__ import annotations

import dataclasses

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import local_machine
from hybridflow.compiler.models import ModelSpec
from hybridflow.errors import ConfigError
from hybridflow.graph.analysis import samples_per_prompt
from hybridflow.trainer.run_spec import derive, model_sources
from hybridflow.trainer.setup import check_batch_sizes, run_inputs


def _greedy_first(n: int):
    """ReMax's graph with its greedy generation listed first and the sampled one drawing ``n`` per prompt."""
    graph = ALGORITHMS["remax"].build()
    sampled, greedy, *rest = graph.nodes
    sampled = dataclasses.replace(sampled, attrs=dataclasses.replace(sampled.attrs, n=n))
    return dataclasses.replace(graph, nodes=(greedy, sampled, *rest))


def test_responses_per_prompt_are_the_sampled_rollouts_n_wherever_it_is_listed():
    assert samples_per_prompt(ALGORITHMS["grpo"].build(n=4)) == 4
    assert samples_per_prompt(ALGORITHMS["remax"].build()) == 1  # sampled and greedy, one each
    # the greedy generation first (a "first generate node" rule would say 1) and the sampled one with n=4
    assert samples_per_prompt(_greedy_first(4)) == 4


def test_batch_checks_count_the_sampled_rollouts_responses(fast_config):
    check_batch_sizes(_greedy_first(4), fast_config(batch_size=32))  # 8 prompts x 4 samples: 32 divides 32
    with pytest.raises(ConfigError, match=r"batch_size \(12\) does not divide the 32 responses"):
        check_batch_sizes(_greedy_first(4), fast_config(batch_size=12))


def test_one_model_table_gives_every_role_its_source(fast_config):
    ppo = ALGORITHMS["ppo"].build()
    config = fast_config(critic_model_name="critic/dir", reward_model_name="rm/dir")
    assert model_sources(config, ppo, "actor/dir") == {"actor": "actor/dir", "critic": "critic/dir", "ref": "actor/dir",
                                                        "reward": "rm/dir"}
    # defaults: the critic and the reference are the actor's model, a rule reward has none
    assert model_sources(fast_config(), ppo, "a") == {"actor": "a", "critic": "a", "ref": "a", "reward": None}
    # a reward source set on the trainer replaces reward_model_name; a cost role reads cost_model_name, not the reward's
    assert model_sources(config, ppo, "a", reward_source=object())["reward"] is None
    safe = ALGORITHMS["safe_rlhf"].build()
    sources = model_sources(fast_config(reward_model_name="rm", cost_model_name="cm"), safe, "a")
    assert {sources[r.name] for r in safe.roles if r.kind == "cost"} == {"cm"}


def test_derive_computes_the_batch_shape_and_the_models_once(fast_config, tmp_path):
    config = fast_config(calibrate=False, rollout_batch_size=8, n_samples=4, batch_size=16, ppo_epochs=2)
    graph = ALGORITHMS["grpo"].build(n=4)
    inputs = run_inputs(config, tmp_path)
    spec = derive(config, graph, local_machine(), inputs)
    assert spec.responses == 32 and not spec.calibrated and spec.profiles == ()
    assert (spec.batch.prompts, spec.batch.response_len, spec.batch.epochs, spec.batch.mini_batches) == (8, 3, 2, 2)
    first = inputs.tokenizer([r["prompt"] for r in inputs.train_rows[:8]], padding=True)["input_ids"]
    assert spec.batch.prompt_len == len(first[0])  # the first rollout batch, padded
    assert isinstance(spec.models["actor"].cost, ModelSpec) and spec.models["reward"].cost == "rule"
    assert spec.source("actor") == inputs.actor_path
    assert spec.options.data_parallel_only and spec.cluster == local_machine().cluster()
    plan = spec.compile().plan
    assert plan.machine == local_machine().describe() and plan.graph == graph
