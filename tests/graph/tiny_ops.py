"""Test ops and a tiny algorithm for the graph tests, independent of hybridflow_ops' real ops.

Imported by the test modules of this folder (pytest puts the folder on sys.path).
"""
from __future__ import annotations

from typing import NamedTuple

from hybridflow.graph import algorithm, compute, loss
from hybridflow_ops.registry import register_op


class Out(NamedTuple):
    advantages: object


class Loss(NamedTuple):
    loss: object


@register_op("t_adv", inputs=("scores: float32[B]", "response_mask: float32[B, R]"), outputs=("advantages: float32[B, R]",), replace=True)
def t_adv(scores, response_mask, *, scale=1.0):
    return Out(scale * scores[:, None] * response_mask)


@register_op("t_baseline", inputs=("scores: float32[B]", "baseline_scores: float32[B]", "response_mask: float32[B, R]"),
             outputs=("advantages: float32[B, R]",), replace=True)
def t_baseline(scores, baseline_scores, response_mask):
    return Out((scores - baseline_scores)[:, None] * response_mask)


@register_op("t_pg", model_inputs=("log_probs: float32[B, R]",),
             inputs=("old_log_probs: float32[B, R]", "advantages: float32[B, R]", "response_mask: float32[B, R]"),
             outputs=("loss: float32",), kind="loss", replace=True)
def t_pg(log_probs, old_log_probs, advantages, response_mask, *, clip=0.2):
    return Loss(-(advantages * log_probs * response_mask).sum())


@register_op("t_kl", model_inputs=("log_probs: float32[B, R]",), inputs=("ref_log_probs: float32[B, R]", "response_mask: float32[B, R]"),
             outputs=("loss: float32",), kind="loss", replace=True)
def t_kl(log_probs, ref_log_probs, response_mask):
    return Loss(((log_probs - ref_log_probs) * response_mask).sum())


@register_op("t_vloss", model_inputs=("value_preds: float32[B, R]",),
             inputs=("values: float32[B, R]", "advantages: float32[B, R]", "response_mask: float32[B, R]"),
             outputs=("loss: float32",), kind="loss", replace=True)
def t_vloss(value_preds, values, advantages, response_mask):
    return Loss(((value_preds - values - advantages) ** 2 * response_mask).sum())


@algorithm
def tiny(prompts, actor, critic, ref, reward, *, n=2, scale=1.0, kl_weight=0.1):
    rollout = actor.generate(prompts, n=n)
    old, ref_logp, values = actor.logprob(rollout), ref.logprob(rollout), critic.values(rollout)
    adv = compute("t_adv", rollout, reward.score(rollout), scale=scale)
    actor.update(rollout, adv, old, ref_logp, loss=loss("t_pg", clip=0.3) + loss("t_kl", weight=kl_weight))
    critic.update(rollout, adv, values, loss="t_vloss")
