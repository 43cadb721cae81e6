"""Per-token policy versions on rollouts and the staleness metrics made from them."""
from __future__ import annotations

import pytest
import torch

from hybridflow.batch import Batch
from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig
from hybridflow.runtime.policy_version import (policy_version, set_weight_version, staleness_metrics, weight_version,
                                               with_policy_version)


class Engine:
    """A rollout engine as the worker sees it: any object; the worker records its weights' version on it."""


def _rollout(rows: int, width: int, mask: list[list[float]]) -> Batch:
    return Batch({"response_ids": torch.ones(rows, width, dtype=torch.long), "response_mask": torch.tensor(mask)})


def test_a_rollout_carries_the_version_its_engine_was_synced_to():
    engine = Engine()
    assert weight_version(engine) == 0  # never synced: the initial weights
    set_weight_version(engine, 5)
    out = with_policy_version(_rollout(2, 3, [[1, 1, 0], [1, 0, 0]]), engine)
    assert out["policy_version"].dtype == torch.int64 and out["policy_version"].tolist() == [[5, 5, 5], [5, 5, 5]]
    per_token = out.with_fields(policy_version=torch.tensor([[4, 5, 5], [5, 5, 5]]))
    assert with_policy_version(per_token, engine) is per_token  # versions an engine wrote itself are kept


def test_staleness_is_the_trainer_version_minus_each_response_token_s_version():
    # trainer at version 7; tokens (masked) of versions 5, 5 | 7 and, in a second rollout, 4: lags 2, 2, 0, 3
    a = _rollout(2, 3, [[1, 1, 0], [1, 0, 0]]).with_fields(policy_version=torch.tensor([[5, 5, 1], [7, 0, 0]]))
    b = _rollout(1, 2, [[1, 0]]).with_fields(policy_version=torch.tensor([[4, 9]]))
    metrics = staleness_metrics({"a": a, "b": b, "scores": Batch({"scores": torch.ones(2)})}, trainer_version=7)
    assert metrics == {"rollout/staleness": pytest.approx(7 / 4), "rollout/staleness_max": 3.0}
    assert staleness_metrics({"scores": Batch({"scores": torch.ones(2)})}, trainer_version=7) == {}


def test_a_train_engine_s_version_counts_its_training_steps(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    engine = TrainEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir), TrainEngineConfig(precision="fp32"))
    assert policy_version(engine) == 0
    engine.scheduler.advance()  # what every update does once, taken or skipped
    assert policy_version(engine) == 1
