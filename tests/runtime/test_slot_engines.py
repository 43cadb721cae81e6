"""The engines of one slot: a policy's train-only slot never builds the rollout engine the config names.

With ``placement: split`` the train pool's slot keeps only the train engine; the rollout engine is built
in the generation pool. Building the configured engine there too and dropping it cost a whole vLLM
start-up (tens of seconds, a second KV cache) per train slot; where vLLM is not importable it failed.
"""
from __future__ import annotations

import importlib.util

import pytest

from hybridflow.data import create_tiny_model_dir, load_causal_lm, load_tokenizer
from hybridflow.errors import ConfigError
from hybridflow.runtime.roles import RoleSpec
from hybridflow.runtime.slot_engines import build_slot_engines
from hybridflow.runtime.topology import RoleSlot


@pytest.fixture(scope="module")
def vllm_spec(tmp_path_factory):
    folder = create_tiny_model_dir(tmp_path_factory.mktemp("model") / "tiny", seed=0)
    return RoleSpec(model=load_causal_lm(folder), tokenizer=load_tokenizer(folder), rollout_engine="vllm")


def test_a_train_only_policy_slot_builds_no_rollout_engine(vllm_spec):
    slot = RoleSlot(role="actor", kind="policy", train=True, rollout=False, dp=1)
    engines = build_slot_engines((slot,), {"actor": vllm_spec}, "cpu")["actor"]
    assert engines.rollout is None and engines.train is not None
    assert engines.train.module is vllm_spec.model  # dp 1: the train engine trains the spec's module itself


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks the error where vLLM is missing")
def test_a_generation_slot_builds_the_named_engine(vllm_spec):
    slot = RoleSlot(role="actor", kind="policy", train=False, rollout=True, dp=1)
    with pytest.raises(ConfigError, match="make vllm-env"):
        build_slot_engines((slot,), {"actor": vllm_spec}, "cpu")


def test_a_lora_policys_reference_shares_its_module_on_its_slot_and_loads_its_own_elsewhere(tmp_path):
    pytest.importorskip("peft")
    from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig
    from hybridflow.runtime.engines.base_view import BaseModelView
    from hybridflow.runtime.engines.lora import LoraSettings, is_lora

    folder = str(create_tiny_model_dir(tmp_path / "tiny", seed=0))
    actor = RoleSpec(model=folder, tokenizer=load_tokenizer(folder),
                     train=TrainEngineConfig(lr=1e-3, lora=LoraSettings(rank=2)))
    ref = RoleSpec(model=folder, base_of="actor")
    slots = (RoleSlot(role="ref", kind="reference", train=True, rollout=False, dp=1),  # listed first: built after
             RoleSlot(role="actor", kind="policy", train=True, rollout=True, dp=1))
    together = build_slot_engines(slots, {"actor": actor, "ref": ref}, "cpu")
    assert list(together) == ["ref", "actor"]
    assert isinstance(together["ref"].train, BaseModelView) and together["ref"].train.module is together["actor"].train.module
    assert together["actor"].rollout.model is together["actor"].train.module  # the rollout samples with the adapters
    apart = build_slot_engines(slots[:1], {"ref": ref}, "cpu")["ref"].train  # another pool: its own base weights
    assert isinstance(apart, TrainEngine) and not is_lora(apart.module)
