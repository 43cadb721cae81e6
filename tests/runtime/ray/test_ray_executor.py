"""RayExecutor: PPO and GRPO for three steps on colocate, split and standalone placements (virtual GPUs).

On placements where every role has one device, the Ray run must equal the LocalExecutor's run of
the same algorithm with the same seeds (the same engines do the same work in other processes); on
the colocated pool of two devices (FSDP2, data-parallel dispatch, hybrid-engine weight sync) the
rollout's log-probs must equal the train engine's after every sync.

A named placement whose compiled plan equals one that already passed in this session (all but the ``strategy``
label, which the executor does not read: PPO's ``auto`` is the search's pick, ``split``'s pools; GRPO's ``split``
and ``standalone`` give the same two pools) is not run again: its test finds its plan among those and stops. Each
distinct plan still runs its three steps once, with every check below (a Ray run is ~15 s of this 2-core
machine, most of it the workers' start).
"""
from __future__ import annotations

import json

import pytest
import torch
from ray_testkit import placement_plan, prompts, role_specs

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import compile_for, local_machine
from hybridflow.runtime.local import LocalExecutor
from hybridflow.runtime.ray import RayExecutor
from hybridflow.runtime.spans import chrome_trace

STEPS = 3


def _graph(algorithm):
    return ALGORITHMS[algorithm].build(n=2) if algorithm == "grpo" else ALGORITHMS[algorithm].build()


def _finite_outputs(graph, result):
    for node in graph.nodes:
        for field in node.outputs.fields:
            assert torch.isfinite(result.env[node.name][field.name].float()).all(), (node.name, field.name)


@pytest.mark.e2e
@pytest.mark.parametrize("placement", ["colocate", "split", "standalone"])
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_three_steps_on_each_placement(ray_cluster, algorithm, placement):
    _three_steps(algorithm, placement)


@pytest.mark.e2e
@pytest.mark.parametrize("placement", ["auto", "device_map"])
def test_three_steps_with_auto_and_a_device_map(ray_cluster, placement):
    _three_steps("ppo", placement)


RAN: dict[str, str] = {}
"""The plans that passed in this session (JSON, without the strategy label) -> the placement they ran as."""


def _three_steps(algorithm, placement):
    graph = _graph(algorithm)
    plan = placement_plan(graph, placement)
    ran_as = RAN.get(plan.model_copy(update={"strategy": ""}).to_json())
    if ran_as is not None:  # this placement compiles to a plan that already passed its three steps
        print(f"{algorithm}-{placement}: the plan of {ran_as}, which passed in this session")
        return
    local = None
    if plan.placement("actor").layout.dp == 1:  # one device per pool: the same math as on this process's CPU
        from ray_testkit import BATCH, TINY

        local = LocalExecutor(compile_for(graph, TINY, machine=local_machine(), placement={r.name: "cpu" for r in graph.roles},
                                          batch=BATCH), role_specs(graph))
    with RayExecutor(plan, role_specs(graph)) as executor:
        # Every model slot got its own (virtual) GPU from its pool's placement group; the rule reward's host pool none.
        gpus = [info["gpu_ids"] for name, info in executor.slot_info.items() if not name.startswith("host")]
        assert all(len(g) == 1 for g in gpus) and len({g[0] for g in gpus}) == len(gpus)
        assert all(not info["gpu_ids"] for name, info in executor.slot_info.items() if name.startswith("host"))
        for step in range(STEPS):
            result = executor.run_iteration({"prompts": prompts(step)})
            _finite_outputs(graph, result)
            rollout = result.env["actor.generate"]
            # Responses of one prompt share a group index, numbered over the whole batch.
            n = 2 if algorithm == "grpo" else 1
            assert rollout["group_index"].tolist() == [i for i in range(3) for _ in range(n)]
            # The rollout engine samples with the weights the train engine holds (weight sync).
            mask = rollout["response_mask"]
            assert ((rollout["rollout_log_probs"] - result.env["actor.logprob"]["old_log_probs"]) * mask).abs().max() < 1e-5
            assert result.metrics["actor/nan_skipped"] == 0
            if local is not None:
                expected = local.run_iteration({"prompts": prompts(step)})
                assert torch.equal(rollout["response_ids"], expected.env["actor.generate"]["response_ids"])
                for key, value in expected.metrics.items():
                    assert result.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        # One span per op and step on the controller's view, one per op, step and slot on the workers' tracks.
        assert len(executor.recorder.spans) == STEPS * len(plan.ops)
        slots = {info for info in executor.slot_info}
        assert {s.device for s in executor.worker_spans} == slots
        trace = chrome_trace(executor.trace_spans())
        tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
        assert slots <= tracks and "controller" in tracks
        json.dumps(trace)
    RAN[plan.model_copy(update={"strategy": ""}).to_json()] = f"{algorithm}-{placement}"


@pytest.mark.e2e
def test_ops_on_disjoint_pools_run_at_the_same_time(ray_cluster):
    # Safe-RLHF scores with a reward and a cost function; on pools of their own, both score nodes are
    # ready at once. Each function waits on its first call until the other has been called: an executor
    # that ran one pool's op after the other's would time out here instead of finishing the step.
    from ray_testkit import compiled_plan, meeting_score, rendezvous_actor

    graph = ALGORITHMS["safe_rlhf"].build()
    plan = compiled_plan(graph, "colocate", 1)  # the reward and cost functions get a host pool each
    assert {plan.placement("reward").pool, plan.placement("cost").pool} == {"host_reward", "host_cost"}
    meeting = rendezvous_actor(parties=2, timeout_s=60)
    specs = role_specs(graph)
    specs["reward"] = type(specs["reward"])(reward=meeting_score(meeting, "reward"), tokenizer=specs["reward"].tokenizer)
    specs["cost"] = type(specs["cost"])(reward=meeting_score(meeting, "cost", score=0.0), tokenizer=specs["cost"].tokenizer)
    with RayExecutor(plan, specs) as executor:
        # run state reaches the controller's compute nodes: lambda = 3 for this call (the graph says 1)
        result = executor.run_iteration({"prompts": prompts(0)}, params={"safe_rlhf_advantage": {"lagrange_lambda": 3.0}})
        assert result.metrics["critic/score/mean"] == 1.0
        spans = {s.op: s for s in executor.recorder.spans}
        reward, cost = spans["reward.score"], spans["cost.score"]
        # both were sent before either was collected (the interpreter's event order; the rendezvous above is
        # what proves they ran at the same time)
        assert max(reward.sent, cost.sent) < min(reward.done, cost.done)
        env = result.env
        expected = (env["gae"]["advantages"] - 3.0 * env["gae_2"]["advantages"]) / 4.0
        assert torch.allclose(env["safe_rlhf_advantage"]["advantages"], expected * env["actor.generate"]["response_mask"])
