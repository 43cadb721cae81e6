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
