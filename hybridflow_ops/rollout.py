"""Ops on the rollout itself."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .registry import register_op

__all__ = ["OldLogProbs", "old_log_probs_from_rollout", "EnvScores", "env_scores"]


class OldLogProbs(NamedTuple):
    old_log_probs: torch.Tensor


@register_op(
    "old_log_probs_from_rollout",
    inputs=("rollout_log_probs: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("old_log_probs: float32[B, R]",),
    correction="the behaviour policy's own log-probs as old_log_probs: a loss whose ratio is taken against them "
               "(ppo_clip, gspo, cispo, ...) weights each token by pi_theta / mu",
    rollout_input="rollout_log_probs", behaviour_output="old_log_probs",
)
def old_log_probs_from_rollout(rollout_log_probs: torch.Tensor, response_mask: torch.Tensor) -> OldLogProbs:
    """Use the rollout engine's log-probs as PPO's old log-probs (0 at padding).

    Shapes: rollout_log_probs, response_mask ``(b, r)`` -> old_log_probs ``(b, r)``.
    Valid only on-policy, when the rollout engine samples from the same weights and
    computes the same quantity as the train engine (``log_softmax(logits / T)`` before
    top-k/top-p truncation); it saves one forward pass of the actor per step. With an
    engine that differs (vLLM kernels, bf16), recompute them or correct with
    ``truncated_is_weight`` (Yao et al. 2025).

    On lagged samples (a plan with staleness) this *is* an off-policy correction for the losses
    whose ratio ``pi_theta / pi_x`` is taken against ``old_log_probs`` (registry ``ratio_input``):
    the ratio becomes ``pi_theta / mu``, the importance weight of the sampled token against the
    behaviour policy ``mu``, clipped by the loss (verl's "bypass mode": "the PPO ratio
    pi_current / pi_rollout already incorporates the IS correction"). It corrects nothing for a
    loss without that ratio (reinforce, gpg, dro); :mod:`hybridflow.graph.staleness` checks the pairing.
    Reference: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv 1707.06347
    (the clipped surrogate as an importance-sampled objective, eq. 6-7).
    """
    valid = response_mask.to(torch.bool)
    return OldLogProbs(torch.where(valid, rollout_log_probs, torch.zeros_like(rollout_log_probs)))


class EnvScores(NamedTuple):
    scores: torch.Tensor


@register_op(
    "env_scores",
    inputs=("env_reward: float32[B]",),
    outputs=("scores: float32[B]",),
)
def env_scores(env_reward: torch.Tensor) -> EnvScores:
    """A multi-turn rollout's environment reward (summed over its steps) as the scores advantages read.

    Shapes: env_reward ``(b,)`` -> scores ``(b,)``.

    Reference: the undiscounted episodic return of Sutton and Barto 2018, "Reinforcement Learning: An
    Introduction", eq. 3.7, as multi-turn agent RL uses it (Zhou et al. 2024, ArCHer, arXiv 2402.19446).
    """
    return EnvScores(env_reward.to(torch.float32).clone())
