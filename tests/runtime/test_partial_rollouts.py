"""Partial rollouts at staleness 1 (runtime/partial.py): the generation sent ahead finishes with its weights, or is
continued in segments under the weights of the update that completed while it ran.

The plan runs on two pools (the actor trains on pool0, generates on pool1) behind the deferred transport of
test_transport (calls run one at a time, oldest first, when the interpreter waits): the order in which ops run
is what the interpreter decided, the same on every machine, so the test knows which segment follows the update.
Each token's ``policy_version`` must say which weights decoded it, and its rollout log-prob must be those weights'.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridflow.algorithms import grpo_is
from hybridflow.compiler import compile_for, local_machine
from hybridflow.compiler.control import control_plan
from hybridflow.errors import ConfigError
from hybridflow.runtime.engines import SamplingParams, TrainEngine, TrainEngineConfig
from hybridflow.runtime.partial import PartialRollouts

from test_local_executor import BATCH, TINY, _model, _prompts, _specs
from test_transport import DeferredExecutor

SEGMENT, LENGTH = 2, 8


class OverlappingDeferred(DeferredExecutor):
    """The deferred transport over two in-process pools, allowed to run a staleness-1 plan (its pools' calls
    interleave in the order they were sent)."""

    overlaps = True

    def wait(self, refs, timeout):
        if not any(ref.done for ref in refs):  # calls of a call left in flight may have run in a plan run between
            super().wait(refs, timeout)


def weights(executor) -> dict:
    plan = control_plan(executor.plan, "export", ["actor"], items=("optimizer",))
    return executor.run_plan(plan).results["actor.export"][0]["train_state"]["model"]


def log_probs_under(state: dict, batch) -> torch.Tensor:
    engine = TrainEngine(_model(), TrainEngineConfig(precision="fp32"))
    engine.module.load_state_dict(state)
    return engine.compute_log_probs(batch)


def varied_reward(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """A reward that differs within groups (an untrained model earns 0 everywhere on the task): a real update."""
    return float(sum(map(ord, solution_str)) % 3)


def run(partial: PartialRollouts | None):
    graph = grpo_is.build(n=2)
    plan = compile_for(graph, TINY, machine=local_machine(2), placement="split", staleness=1, batch=BATCH)
    assert plan.placement("actor").generation_pool == "pool1"
    sampling = SamplingParams(max_new_tokens=LENGTH, seed=0, stop_at_eos=False)  # every response runs 8 tokens
    specs = {name: dataclasses.replace(spec, sampling=sampling) if spec.sampling else spec
             for name, spec in _specs(graph, share=False, reward=varied_reward, lr=5e-2).items()}
    executor = OverlappingDeferred(plan, specs)
    executor.partial_rollouts = partial
    batches = [{"prompts": _prompts(4)} for _ in range(3)]
    before = weights(executor)
    first = executor.run_iteration(batches[0], next_inputs=batches[1])
    after = weights(executor)  # after step 0's update
    second = executor.run_iteration(batches[1], next_inputs=batches[2])
    return executor, first, second, before, after


def spans_of(executor, iteration: int, pool: str, prefix: str):
    spans = [s for s in executor.recorder.spans if s.iteration == iteration and s.device == pool and s.op.startswith(prefix)]
    return sorted(spans, key=lambda s: s.sent)


def test_continue_switches_to_the_updated_weights_at_a_segment_boundary():
    executor, first, second, before, after = run(PartialRollouts("continue", SEGMENT))
    (update,) = spans_of(executor, 0, "pool0", "actor.update")
    segments = spans_of(executor, 1, "pool1", "actor.generate")
    syncs = spans_of(executor, 1, "pool0", "actor.weight_sync")
    assert [s.op for s in segments] == ["actor.generate"] + [f"actor.generate#{k}" for k in range(2, LENGTH // SEGMENT + 1)]
    assert [s.done for s in segments] == sorted(s.done for s in segments)  # one after the other
    assert len(syncs) == 2  # the plan's sync ahead of the generation, and one of the updated weights mid-way
    plan_sync, mid_sync = syncs
    assert plan_sync.op == "actor.weight_sync" and plan_sync.sent < update.sent  # queued ahead of step 0's update
    # the controller synced the newer weights only once the update was done, and went on only once they were in
    assert mid_sync.sent > update.done
    resumed = [k for k, s in enumerate(segments) if s.sent > mid_sync.done]
    assert resumed and all(s.sent < mid_sync.sent for s in segments[:resumed[0]])
    switch = resumed[0] * SEGMENT  # the first position decoded with the updated weights
    assert 0 < switch < LENGTH  # this order does cut the generation (otherwise the test tests nothing)

    rollout = second.env["actor.generate"]
    mask = rollout["response_mask"]
    assert bool((mask == 1).all())
    versions = rollout["policy_version"]
    # versions are the trained policy's step count: 0 (initial weights) for step 0's rollout and for this one's
    # tokens before the switch, 1 (after step 0's update) from the switch on
    assert torch.equal(first.env["actor.generate"]["policy_version"], torch.zeros_like(versions))
    assert torch.equal(versions, torch.where(torch.arange(LENGTH) < switch, 0, 1).expand_as(versions))
    assert second.metrics["actor.generate/segments"] == LENGTH // SEGMENT
    assert second.metrics["actor.generate/midway_syncs"] == 1.0
    assert "decoded_steps" not in rollout and "rollout_finished" not in rollout
    # the tokens before the switch were decoded by the weights step 0 started from, the rest by the updated ones
    old, new = log_probs_under(before, rollout), log_probs_under(after, rollout)
    early = (torch.arange(LENGTH) < switch).float().expand_as(mask)
    assert ((rollout["rollout_log_probs"] - old) * early).abs().max() < 1e-5
    assert ((rollout["rollout_log_probs"] - new) * (1 - early)).abs().max() < 1e-5
    assert ((old - new) * (1 - early)).abs().max() > 1e-3  # the update changed them


def test_finish_runs_the_generation_whole_with_the_weights_it_started_with():
    executor, first, second, before, after = run(None)
    segments = spans_of(executor, 1, "pool1", "actor.generate")
    assert [s.op for s in segments] == ["actor.generate"]
    assert [s.op for s in spans_of(executor, 1, "pool0", "actor.weight_sync")] == ["actor.weight_sync"]
    rollout = second.env["actor.generate"]
    assert torch.equal(rollout["policy_version"], torch.zeros_like(rollout["policy_version"]))  # initial weights
    old, new = log_probs_under(before, rollout), log_probs_under(after, rollout)
    assert (rollout["rollout_log_probs"] - old).abs().max() < 1e-5
    assert (rollout["rollout_log_probs"] - new).abs().max() > 1e-3  # not a token of the updated weights


def test_finish_mode_setting_is_the_default_behaviour():
    executor, _, second, _, _ = run(PartialRollouts("finish", SEGMENT))
    assert [s.op for s in spans_of(executor, 1, "pool1", "actor.generate")] == ["actor.generate"]
    assert "actor.generate/segments" not in second.metrics


def test_bad_settings_are_named():
    with pytest.raises(ConfigError, match="partial_rollouts must be one of"):
        PartialRollouts("resume", 4)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="partial_segment_tokens must be at least 1"):
        PartialRollouts("continue", 0)
