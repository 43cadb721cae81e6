"""A sample of each step's multi-turn trajectories, as JSON lines, and their readable form.

After every training step, :func:`log_trajectories` appends the first ``samples`` trajectories
of each multi-turn rollout of the step to ``output_dir/trajectories.jsonl``: one record per
trajectory with the step, the node, the prompt and ground truth, its segments (model turns and
observations, text and token ids), turns, environment reward, tool calls and errors, and the
score the reward role gave it. ``hybridflow trajectories FILE`` prints records readably
(:func:`format_trajectory`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..batch import Batch

__all__ = ["TRAJECTORY_FILE", "trajectory_records", "log_trajectories", "format_trajectory"]

TRAJECTORY_FILE = "trajectories.jsonl"


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def trajectory_records(step: int, env: Mapping[str, Batch], samples: int) -> list[dict[str, Any]]:
    """Records of the first ``samples`` trajectories of every multi-turn rollout in ``env`` (node -> output)."""
    scores = next((b["scores"] for name, b in env.items() if "scores" in b.tensors.keys()), None)
    records = []
    for node, batch in env.items():
        if "agent_segments" not in batch.columns:
            continue
        for i in range(min(samples, len(batch))):
            records.append({
                "step": step, "node": node, "sample": i,
                "prompt": _plain(batch.columns["prompt"][i]) if "prompt" in batch.columns else None,
                "ground_truth": _plain(batch.columns["ground_truth"][i]) if "ground_truth" in batch.columns else None,
                "segments": json.loads(batch.columns["agent_segments"][i]),
                "steps": json.loads(batch.columns["agent_steps"][i]),
                "num_turns": int(batch["num_turns"][i]), "env_reward": float(batch["env_reward"][i]),
                "tool_calls": int(batch["tool_calls"][i]), "tool_errors": int(batch["tool_errors"][i]),
                "score": float(scores[i]) if scores is not None and len(scores) == len(batch) else None,
            })
    return records


def log_trajectories(output_dir: str | Path, step: int, env: Mapping[str, Batch], samples: int) -> int:
    """Append the step's records to ``output_dir/trajectories.jsonl``; returns how many were written."""
    records = trajectory_records(step, env, samples)
    if records:
        with open(Path(output_dir) / TRAJECTORY_FILE, "a", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    return len(records)


def format_trajectory(record: Mapping[str, Any]) -> str:
    """A record as text: a header, then each model turn (``model>``) and observation (``  env>``)."""
    head = (f"step {record['step']}  {record['node']}  sample {record['sample']}  turns {record['num_turns']}  "
            f"env_reward {record['env_reward']:g}  tool calls {record['tool_calls']} (errors {record['tool_errors']})"
            + (f"  score {record['score']:g}" if record.get("score") is not None else ""))
    lines = [head, f"prompt: {record.get('prompt')}   ground truth: {record.get('ground_truth')}"]
    for segment in record["segments"]:
        lines.append(f"{'model>' if segment['model'] else '  env>'} {segment['text']}  ({len(segment['ids'])} tokens)")
    return "\n".join(lines)
