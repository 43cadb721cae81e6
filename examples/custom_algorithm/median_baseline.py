"""A custom algorithm: n responses per prompt, advantage = score minus the group's median score.

Run: python examples/custom_algorithm/median_baseline.py   (validates the graph, prints it, draws median_grpo.svg)
"""
from typing import NamedTuple

import torch

import hybridflow as hf


class Advantages(NamedTuple):
    advantages: torch.Tensor


@hf.register_op("median_advantage", inputs=("scores: float32[B]", "group_index: int64[B]", "response_mask: float32[B, R]"),
                outputs=("advantages: float32[B, R]",))
def median_advantage(scores, group_index, response_mask, *, scale=1.0):
    """A_i = scale * (s_i - median of the scores in i's group), on every valid token; shapes (b,), (b,), (b, r) -> (b, r)."""
    medians = torch.stack([scores[group_index == g].median() for g in group_index.tolist()])
    return Advantages(scale * (scores - medians)[:, None] * response_mask)


@hf.algorithm
def median_grpo(prompts, actor, reward, *, n=4, scale=1.0):
    rollout = actor.generate(prompts, n=n)
    old_logp = actor.logprob(rollout)
    adv = hf.compute("median_advantage", rollout, reward.score(rollout), scale=scale)
    actor.update(rollout, adv, old_logp, loss="ppo_clip")


if __name__ == "__main__":
    from hybridflow.graph import validate
    from hybridflow.viz.graph import draw_graph

    graph = median_grpo.build()
    validate(graph)
    print(graph.to_text())
    print(draw_graph(graph, "median_grpo").message)
