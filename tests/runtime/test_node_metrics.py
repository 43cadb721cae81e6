"""Every node's float outputs are summarised under <node>/<field>/{mean,min,max}; per-token fields
over valid tokens only; the conventional score name follows the graph (critic/ only with a critic)."""
from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms import ALGORITHMS
from hybridflow.batch import Batch
from hybridflow.runtime.node_metrics import graph_metrics


def _env():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rollout = Batch({"prompt_ids": torch.zeros(2, 1, dtype=torch.long), "prompt_mask": torch.ones(2, 1, dtype=torch.long),
                     "response_ids": torch.zeros(2, 3, dtype=torch.long), "response_mask": mask,
                     "rollout_log_probs": torch.tensor([[-1.0, -3.0, 99.0], [-2.0, 99.0, 99.0]]),
                     "group_index": torch.tensor([0, 0])})
    return {"actor.generate": rollout, "reward.score": Batch({"scores": torch.tensor([1.0, 0.0])}),
            "grpo_advantage": Batch({"advantages": torch.tensor([[0.5, 0.5, 7.0], [-0.5, 7.0, 7.0]])})}


def test_summaries_are_masked_and_hand_worked():
    metrics = graph_metrics(ALGORITHMS["grpo"].build(n=1), _env())
    # valid rollout log-probs: -1, -3, -2 -> mean -2, min -3, max -1 (the 99s are padding)
    assert (metrics["actor.generate/rollout_log_probs/mean"], metrics["actor.generate/rollout_log_probs/min"],
            metrics["actor.generate/rollout_log_probs/max"]) == (-2.0, -3.0, -1.0)
    assert metrics["grpo_advantage/advantages/mean"] == pytest.approx(0.5 / 3)
    assert (metrics["grpo_advantage/advantages/min"], metrics["grpo_advantage/advantages/max"]) == (-0.5, 0.5)
    assert metrics["reward.score/scores/mean"] == 0.5 and metrics["reward.score/scores/max"] == 1.0
    assert "actor.generate/response_mask/mean" not in metrics  # masks are not summarised
    assert metrics["reward/score/mean"] == 0.5 and "critic/score/mean" not in metrics  # grpo has no critic


def test_critic_names_for_a_graph_with_a_critic():
    env = _env()
    env["critic.values"] = Batch({"values": torch.tensor([[1.0, 2.0, 5.0], [3.0, 5.0, 5.0]])})
    metrics = graph_metrics(ALGORITHMS["ppo"].build(), env)
    assert metrics["critic/score/mean"] == 0.5 and "reward/score/mean" not in metrics
    assert metrics["critic.values/values/mean"] == 2.0  # (1 + 2 + 3) / 3


def test_no_valid_token_gives_nan_not_an_error():
    env = _env()
    env["actor.generate"] = Batch({**env["actor.generate"].tensors, "response_mask": torch.zeros(2, 3)})
    metrics = graph_metrics(ALGORITHMS["grpo"].build(n=1), env)
    assert math.isnan(metrics["grpo_advantage/advantages/mean"]) and math.isnan(metrics["grpo_advantage/advantages/min"])


def test_one_host_transfer_per_device(monkeypatch):
    calls = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(self.shape) or original(self))
    metrics = graph_metrics(ALGORITHMS["grpo"].build(n=1), _env())
    assert len(calls) == 1 and calls[0] == (3, 3) and len(metrics) == 3 * 3 + 1
