"""GPG: plain policy gradient with group-centred, rescaled advantages; no ratio, no clip, no KL, no old log-probs.

Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
Reasoning", arXiv 2504.02546: ``A_i = alpha (s_i - mean_g s)`` with ``alpha`` the batch size
over its informative responses (``gpg_advantage``), and the REINFORCE loss averaged over all
tokens (``gpg``). No reference or old-policy forward is needed.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def gpg(prompts, actor, reward, *, n=8, norm_by_std=False, loss_agg_mode="token-mean"):
    rollout = actor.generate(prompts, n=n)
    adv = hf.compute("gpg_advantage", rollout, reward.score(rollout), norm_by_std=norm_by_std)
    actor.update(rollout, adv, loss=hf.loss("gpg", loss_agg_mode=loss_agg_mode))
