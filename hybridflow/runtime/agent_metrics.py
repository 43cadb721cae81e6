"""Metrics of a multi-turn rollout: per sample and per turn.

``agent/num_turns/mean``, ``agent/env_reward/mean``, ``agent/tool_calls/mean``,
``agent/tool_errors/mean``, ``agent/tool_error_rate`` (failed calls over calls), and per model
turn ``k``: ``agent/turn{k}/reached`` (share of samples that took turn k),
``agent/turn{k}/model_tokens/mean`` and ``agent/turn{k}/obs_tokens/mean`` (over the samples
that reached it).
"""
from __future__ import annotations

from ..batch import Batch

__all__ = ["agent_metrics"]


def agent_metrics(rollout: Batch) -> dict[str, float]:
    """The metrics above from a rollout's ``turn_index``, ``response_mask`` and counts."""
    calls, errors = rollout["tool_calls"].float(), rollout["tool_errors"].float()
    metrics = {
        "agent/num_turns/mean": float(rollout["num_turns"].float().mean()),
        "agent/env_reward/mean": float(rollout["env_reward"].mean()),
        "agent/tool_calls/mean": float(calls.mean()),
        "agent/tool_errors/mean": float(errors.mean()),
        "agent/tool_error_rate": float(errors.sum() / calls.sum()) if float(calls.sum()) else 0.0,
    }
    turn_index, model = rollout["turn_index"], rollout["response_mask"] > 0
    b = max(len(rollout), 1)
    for k in range(int(rollout["num_turns"].max()) if len(rollout) else 0):
        reached = rollout["num_turns"] > k
        count = max(int(reached.sum()), 1)
        in_turn = turn_index == k
        metrics[f"agent/turn{k}/reached"] = float(reached.sum()) / b
        metrics[f"agent/turn{k}/model_tokens/mean"] = float((in_turn & model).sum()) / count
        metrics[f"agent/turn{k}/obs_tokens/mean"] = float((in_turn & ~model).sum()) / count
    return metrics
