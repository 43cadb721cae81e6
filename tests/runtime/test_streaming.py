"""Streamed rollouts (runtime/streaming.py): the region that runs per piece, the same results as a run without
streaming, and the order in which the interpreter issued the pieces' ops."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.plan import PlanOp
from hybridflow.runtime.engines import SamplingParams
from hybridflow.runtime.local import LocalExecutor
from hybridflow.runtime.streaming import GRANULARITY, granularity, mark_streaming, streamed_region

from test_local_executor import _prompts, _specs, local_plan_for

torch.set_num_threads(1)


def _long_specs(graph):
    """The local executor tests' engines, with responses of up to 16 tokens (their lengths then vary widely)."""
    return {name: dataclasses.replace(spec, sampling=SamplingParams(max_new_tokens=16, seed=0)) if spec.sampling else spec
            for name, spec in _specs(graph).items()}


def _generate(plan):
    return next(op for op in plan.ops if op.kind == "node" and plan.graph.node(op.node).kind == "generate")


def test_grpo_region_is_its_scores_log_probs_and_group_advantage_but_not_the_update():
    plan = local_plan_for(ALGORITHMS["grpo"].build(n=2))
    region = [op.name for op in streamed_region(plan.ops, plan.graph, _generate(plan))]
    assert region == ["actor.logprob", "reward.score", "ref.logprob", "grpo_advantage"]


def test_a_batch_wise_op_and_what_reads_it_wait_for_the_join():
    plan = local_plan_for(ALGORITHMS["reinforce_pp"].build())
    region = {op.node for op in streamed_region(plan.ops, plan.graph, _generate(plan))}
    batch_wise = {n.name for n in plan.graph.nodes if n.kind == "compute" and granularity(n) == "batch"}
    assert batch_wise and not region & batch_wise
    after = {n.name for n in plan.graph.nodes if any(i.source in batch_wise for i in n.inputs)}
    assert not region & after
    assert "reward.score" in region


def test_an_op_behind_one_that_waits_for_the_whole_rollout_does_not_stream():
    plan = local_plan_for(ALGORITHMS["grpo"].build(n=2))
    ops = list(plan.ops)
    generate = _generate(plan)
    # an offload of the rollout's KV cache after generation, which the actor's log-prob waits for
    offload = PlanOp(name="actor.offload", kind="offload", role="actor", pool=generate.pool, deps=(generate.name,),
                     items=("kv_cache",))
    at = next(i for i, op in enumerate(ops) if op.name == "actor.logprob")
    ops[at] = ops[at].model_copy(update={"deps": ops[at].deps + (offload.name,)})
    ops.insert(at, offload)
    region = [op.name for op in streamed_region(ops, plan.graph, generate)]
    # every op on the offload's pool after it keeps the plan's order and waits, and the advantage reads a score
    assert region == []
    assert [op.name for op in streamed_region(plan.ops, plan.graph, generate)]  # without the offload, they stream


def _run(plan, stream: bool, prompts=8):
    torch.manual_seed(0)
    executor = LocalExecutor(mark_streaming(plan) if stream else plan, _long_specs(plan.graph))
    return executor, executor.run_iteration({"prompts": _prompts(prompts)})


def test_a_streamed_grpo_step_computes_what_an_unstreamed_one_does_and_scores_before_generation_ends():
    plan = local_plan_for(ALGORITHMS["grpo"].build(n=4))
    _, plain = _run(plan, False)
    executor, streamed = _run(plan, True)
    mask = plain.env["actor.generate"]["response_mask"]
    lengths = mask.sum(-1)
    assert lengths.min() <= 8 < lengths.max()  # lengths that vary: the case streaming is for
    for name, batch in plain.env.items():
        for field in batch.tensors.keys():
            a, b = batch[field], streamed.env[name][field]
            if field.endswith("log_probs") and name != "actor.generate":
                # the train engine computes padding columns only up to its batch's longest response: compare responses
                a, b = a * mask, b * mask
                assert torch.allclose(a, b, atol=1e-6, rtol=0), (name, field)
            else:
                assert torch.equal(a, b), (name, field)
        assert {k: list(v) for k, v in batch.columns.items()} == {k: list(v) for k, v in streamed.env[name].columns.items()}
    for key, value in plain.metrics.items():
        assert streamed.metrics[key] == pytest.approx(value, abs=1e-6), key
    # the order the interpreter issued its ops in (event numbers, not times)
    spans = executor.recorder.spans
    generation = next(s for s in spans if s.op == "actor.generate")
    scores = [s for s in spans if s.op == "reward.score"]
    assert len(scores) > 1  # one per piece
    assert min(s.sent for s in scores) < generation.done  # a group was scored while others were still decoding
    update = next(s for s in spans if s.op == "actor.update")
    assert update.sent > max(s.done for s in spans if s.op != "actor.update")  # the update waited for the join


def test_mark_streaming_marks_generate_ops_only_and_the_plan_says_so():
    from hybridflow.compiler.plan import verify_plan
    from hybridflow.errors import PlanError

    plan = mark_streaming(local_plan_for(ALGORITHMS["grpo"].build(n=2)))
    assert [op.name for op in plan.ops if op.stream] == ["actor.generate"]
    again = type(plan).model_validate_json(plan.model_dump_json())
    assert [op.stream for op in again.ops] == [op.stream for op in plan.ops]
    assert [line for line in plan.to_text().splitlines() if "streamed" in line][0].startswith("op actor.generate:")
    verify_plan(plan)
    wrong = plan.model_copy(update={"ops": tuple(op.model_copy(update={"stream": op.name == "reward.score"})
                                                 for op in plan.ops)})
    with pytest.raises(PlanError, match="'reward.score' is marked stream"):
        verify_plan(wrong)


def _inputs(spec, generator, groups=4, n=3, r=6):
    """Random inputs of op ``spec``: ``groups`` groups of ``n`` rows, responses of 1..r valid tokens."""
    b = groups * n
    lengths = torch.randint(1, r + 1, (b,), generator=generator)
    mask = (torch.arange(r)[None, :] < lengths[:, None]).float()
    values = {"response_mask": mask, "group_index": torch.arange(groups).repeat_interleave(n) * 7 + 3}
    out = {}
    for f in spec.inputs:
        if f.name in values:
            out[f.name] = values[f.name]
        elif len(f.dims) == 2:
            out[f.name] = -torch.rand((b, r), generator=generator) * 3 * mask
        else:
            out[f.name] = torch.randint(0, 2, (b,), generator=generator).float()
    return out


def _call(spec, inputs, params):
    outputs = spec.fn(*inputs.values(), **params)
    return outputs if isinstance(outputs, torch.Tensor) else outputs[0]


PARAMS = {"overlong_penalty": {"max_length": 6, "cache_length": 3}}


@pytest.mark.parametrize("name", sorted(GRANULARITY))
@pytest.mark.parametrize("seed", range(5))
def test_a_declared_row_or_group_op_on_pieces_of_whole_groups_is_the_op_on_the_batch(name, seed):
    from hybridflow_ops import get_op

    spec = get_op(name)
    generator = torch.Generator().manual_seed(seed)
    inputs = _inputs(spec, generator)
    params = PARAMS.get(name, {})
    whole = _call(spec, inputs, params)
    # the groups dealt to two pieces in a random order, as they might finish
    groups = torch.randperm(4, generator=generator)
    pieces = [groups[:1], groups[1:]]
    rows = [(g[:, None] * 3 + torch.arange(3)).reshape(-1) for g in pieces]
    parts = [_call(spec, {k: v[idx] for k, v in inputs.items()}, params) for idx in rows]
    joined = torch.cat(parts)[torch.argsort(torch.cat(rows))]
    assert torch.allclose(joined, whole, atol=1e-6, rtol=0)


def test_the_check_above_tells_a_batch_wise_op_apart():
    """Whitening over the batch (undeclared, so batch-wise) gives other numbers on pieces: the check can fail."""
    from hybridflow_ops import get_op

    spec = get_op("whiten")
    inputs = _inputs(spec, torch.Generator().manual_seed(0))
    assert "whiten" not in GRANULARITY
    whole = _call(spec, inputs, {})
    rows = [torch.arange(3), torch.arange(3, 12)]
    joined = torch.cat([_call(spec, {k: v[idx] for k, v in inputs.items()}, {}) for idx in rows])
    assert not torch.allclose(joined, whole, atol=1e-6, rtol=0)
