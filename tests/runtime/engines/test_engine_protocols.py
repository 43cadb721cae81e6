"""The engine protocols and the rollout registry: what every engine must offer, chosen by name, validated early.

These run without vLLM; the vLLM engine's own behaviour is in test_rollout_vllm.py (marker ``vllm``).
"""
from __future__ import annotations

import copy

import pytest
import torch
from engine_testkit import prompt_batch, tiny_model

from hybridflow.errors import ConfigError, ExecutionError
from hybridflow.runtime.engines import (ROLLOUT_ENGINES, HFRolloutEngine, RolloutBuild, RolloutEngine, SamplingParams,
                                        TrainEngine, TrainEngineConfig, TrainEngineProtocol, build_rollout)
from hybridflow.runtime.engines.registry import rollout_options
from hybridflow.runtime.roles import RoleSpec
from hybridflow.runtime.topology import RoleSlot, Slot
from hybridflow.runtime.worker import Worker


def _build(model, tokenizer, name="hf", share=True, **options):
    return build_rollout(name, RolloutBuild(role="actor", model=model, source=model, tokenizer=tokenizer,
                                            sampling=SamplingParams(max_new_tokens=4, seed=3), device="cpu",
                                            share=share, options=options))


def test_the_engines_satisfy_the_protocols(model, tokenizer):
    rollout = _build(model, tokenizer)
    assert isinstance(rollout, RolloutEngine) and isinstance(rollout, HFRolloutEngine)
    assert isinstance(TrainEngine(model), TrainEngineProtocol)
    assert set(ROLLOUT_ENGINES) >= {"hf", "vllm"}


def test_sharing_is_declared_by_the_engine_not_read_from_its_module(model, tokenizer):
    train = TrainEngine(model)
    assert _build(model, tokenizer).shares_weights_with(train)
    own = _build(model, tokenizer, share=False)
    assert not own.shares_weights_with(train)
    assert own.weight_shapes() == {n: tuple(t.shape) for n, t in model.state_dict().items()}


def test_unknown_engines_and_options_are_config_errors_naming_them(model, tokenizer):
    with pytest.raises(ConfigError, match="unknown rollout engine 'sglang'.*hf, vllm"):
        _build(model, tokenizer, name="sglang")
    with pytest.raises(ConfigError, match="micro_batch_sise.*micro_batch_size"):
        _build(model, tokenizer, micro_batch_sise=4)
    with pytest.raises(ConfigError, match="kv_cache_gib"):
        rollout_options("vllm", {"kv_cache_gib": -1})
    assert rollout_options("vllm", {"max_model_len": 64}).max_model_len == 64


def test_hf_rng_state_round_trips_through_json(model, tokenizer):
    import json

    rollout = _build(model, tokenizer, share=False)
    prompts = prompt_batch(tokenizer)
    rollout.generate(prompts)
    state = json.loads(json.dumps(rollout.rng_state()))
    after = rollout.generate(prompts)["response_ids"]
    fresh = _build(copy.deepcopy(rollout.model), tokenizer, share=False)
    fresh.set_rng_state(state)
    assert torch.equal(fresh.generate(prompts)["response_ids"], after)


def test_restore_gives_one_engine_the_streams_of_every_data_parallel_rank(model, tokenizer):
    """A Ray dp=2 rollout saves {"ranks": [rank 0's state, rank 1's]} (one seed per rank); a worker restoring it into
    one engine (a resume at dp=1: ``Worker.load_state``) continues both seeds' streams."""
    rank0, rank1 = _build(model, tokenizer, share=False), _build(copy.deepcopy(model), tokenizer, share=False)
    prompts = prompt_batch(tokenizer)
    for rollout, seed in ((rank0, 3), (rank1, 1003)):
        rollout.generate(prompts, SamplingParams(max_new_tokens=4, seed=seed))
    saved = {"ranks": [rank0.rng_state(), rank1.rng_state()]}
    expected = {seed: r.generate(prompts, SamplingParams(max_new_tokens=4, seed=seed))["response_ids"]
                for r, seed in ((rank0, 3), (rank1, 1003))}
    worker = _worker(RoleSpec(model=copy.deepcopy(model), tokenizer=tokenizer, train=TrainEngineConfig(lr=1e-2),
                              sampling=SamplingParams(max_new_tokens=4, seed=3), share_rollout_module=False))
    worker.load_state("actor", (), {"rollout_rng": saved})
    one = worker.engines["actor"].rollout
    for seed, ids in expected.items():
        assert torch.equal(one.generate(prompts, SamplingParams(max_new_tokens=4, seed=seed))["response_ids"], ids)


def test_update_weights_takes_buckets_and_names_a_wrong_tensor(model, tokenizer):
    rollout = _build(copy.deepcopy(model), tokenizer, share=False)
    changed = {n: t + 1.0 for n, t in model.state_dict().items()}
    names = list(changed)
    taken = sum(rollout.update_weights([(n, changed[n]) for n in part]) for part in (names[:3], names[3:]))
    assert taken == len(names)
    assert all(torch.equal(rollout.model.state_dict()[n], changed[n]) for n in names)
    with pytest.raises(ExecutionError, match="no parameter 'nope'"):
        rollout.update_weights([("nope", torch.zeros(1))])


def _worker(spec: RoleSpec) -> Worker:
    """A worker hosting one policy role ``actor`` on the CPU, as the LocalExecutor builds its slots."""
    slot = Slot(pool="cpu", rank=0, global_rank=0, device="cpu", roles=(RoleSlot("actor", "policy", True, True, 1),))
    worker = Worker(slot, {"actor": spec}, seed=None)
    worker.setup_local("cpu", {})
    return worker


def test_worker_syncs_and_offloads_through_the_protocol(model, tokenizer):
    # a policy whose rollout engine holds its own copy: sync copies every tensor, offload sleeps the rollout copy
    spec = RoleSpec(model=model, tokenizer=tokenizer, train=TrainEngineConfig(lr=1e-2), share_rollout_module=False)
    worker = _worker(spec)
    engines = worker.engines["actor"]
    assert worker.sync_weights("actor").tensors == len(model.state_dict())
    shared = _worker(RoleSpec(model=model, tokenizer=tokenizer))
    assert shared.sync_weights("actor").tensors == 0
    worker.offload("actor", ["params", "optimizer"])
    worker.onload("actor", ["params", "optimizer"])
    assert not engines.rollout.shares_weights_with(engines.train)


def test_building_vllm_without_vllm_says_how_to_get_it(model, tokenizer):
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="make vllm-env"):
            _build(model, tokenizer, name="vllm")
    else:
        pytest.skip("vLLM is importable here: its engine is tested in test_rollout_vllm.py")
