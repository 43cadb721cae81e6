"""Weight sync buckets and the hybrid-engine stream (the cross-pool broadcast runs in tests/runtime/ray)."""
from __future__ import annotations

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.data import make_prompt_batch, make_tiny_model, make_tiny_tokenizer
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams, TrainEngine, TrainEngineConfig
from hybridflow.runtime.weight_sync import TensorSpec, bucket_plan, stream_into, tensor_specs

torch.set_num_threads(1)
DTYPES = (torch.float32, torch.bfloat16, torch.int64)

specs_strategy = st.lists(
    st.builds(lambda n, d, i: TensorSpec(f"t{i}", (n,), d), st.integers(1, 64), st.sampled_from(DTYPES), st.integers(0, 999)),
    max_size=30)


@settings(max_examples=200, deadline=None)
@given(specs=specs_strategy, bucket=st.integers(1, 300))
def test_buckets_partition_the_tensors_in_order(specs, bucket):
    plan = bucket_plan(specs, bucket)
    assert [i for b in plan for i in b] == list(range(len(specs)))  # every tensor once, in order
    for b in plan:
        assert len({specs[i].dtype for i in b}) == 1  # one dtype per bucket: one flat buffer
        assert len(b) == 1 or sum(specs[i].nbytes for i in b) <= bucket  # only a lone tensor may exceed it
    for a, b in zip(plan, plan[1:]):  # greedy: the next tensor did not fit (or changed dtype)
        first = specs[b[0]]
        assert first.dtype != specs[a[0]].dtype or sum(specs[i].nbytes for i in a) + first.nbytes > bucket


def test_bucket_plan_by_hand():
    f, h = torch.float32, torch.bfloat16
    # 8 + 8 bytes fit in 16; the third float (16 bytes) starts a bucket; a bf16 tensor starts another.
    specs = [TensorSpec("a", (2,), f), TensorSpec("b", (2,), f), TensorSpec("c", (4,), f), TensorSpec("d", (1,), h)]
    assert bucket_plan(specs, 16) == [[0, 1], [2], [3]]
    assert specs[2].nbytes == 16 and specs[3].nbytes == 2


def test_hybrid_stream_makes_rollout_log_probs_equal_the_train_engine():
    tokenizer = make_tiny_tokenizer("arithmetic")
    model = make_tiny_model("qwen2", vocab_size=len(tokenizer), hidden=32, layers=2, heads=2, kv_heads=1, seed=0)
    train = TrainEngine(model, TrainEngineConfig(lr=5e-2, precision="fp32"))
    rollout = HFRolloutEngine(copy.deepcopy(model), tokenizer=tokenizer, sampling=SamplingParams(max_new_tokens=4, seed=0))
    prompts = make_prompt_batch(make_arithmetic_rows()[:4], tokenizer)
    batch = rollout.generate(prompts)
    train.update(batch.with_fields(old_log_probs=batch["rollout_log_probs"],
                                   advantages=torch.ones(batch["response_mask"].shape)), [("ppo_clip", 1.0, {})])
    mask = batch["response_mask"]

    def gap():
        fresh = rollout.generate(prompts)
        return float(((fresh["rollout_log_probs"] - train.compute_log_probs(fresh)) * fresh["response_mask"]).abs().max())

    assert gap() > 1e-3  # the update moved the train copy away from the rollout copy
    state = train.module.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    stats = stream_into(rollout, train.named_weights(), bucket_bytes=nbytes // 5)
    assert stats.tensors == len(state) and stats.bytes == nbytes
    assert stats.buckets >= 5 and stats.peak_bytes <= nbytes // 5 + max(t.numel() * t.element_size() for t in state.values())
    assert gap() < 1e-5 and mask.sum() > 0
    assert [s.name for s in tensor_specs(state)] == list(state)
