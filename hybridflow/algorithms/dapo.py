"""DAPO: GRPO with clip-higher, a token-level loss, overlong reward shaping and dynamic sampling.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476:

* clip-higher (sec. 3.1): PPO's clip range is asymmetric, ``[1 - 0.2, 1 + 0.28]``;
* dynamic sampling (sec. 3.2): groups whose rewards are all equal carry no gradient and are
  dropped, and generation goes on, on fresh prompts, until the batch has as many groups as
  asked for (at most ``max_rounds`` rounds; a :class:`~hybridflow.graph.resampling.Resample`
  region, run by the plan interpreter);
* token-level policy loss (sec. 3.3): ``token-mean`` over all the batch's tokens;
* overlong reward shaping (sec. 3.4, eq. 13): a penalty ramping to -1 over the last
  ``overlong_cache`` tokens of the length budget (``overlong_penalty``).

The paper drops the KL term; ``kl_coef > 0`` adds a KL loss to a reference model.
"""
from __future__ import annotations

import hybridflow as hf


@hf.algorithm
def dapo(prompts, actor, ref, reward, *, n=8, clip_low=0.2, clip_high=0.28, loss_agg_mode="token-mean", max_rounds=3,
         expected_keep=0.5, overlong_cache=1, overlong_max_length=None, overlong_penalty=1.0, kl_coef=0.0, kl_type="low_var_kl"):
    with hf.resample(max_rounds=max_rounds, expected_keep=expected_keep) as rounds:
        rollout = actor.generate(prompts, n=n)
        raw = reward.score(rollout)
        rounds.keep(hf.compute("uniform_group_filter", rollout, raw))
    scores = hf.compute("overlong_penalty", rollout, raw, max_length=overlong_max_length, cache_length=overlong_cache,
                        penalty=overlong_penalty)
    adv = hf.compute("grpo_advantage", rollout, scores)
    inputs, loss = [rollout, adv, actor.logprob(rollout)], hf.loss("ppo_clip", clip_low=clip_low, clip_high=clip_high, loss_agg_mode=loss_agg_mode)
    if kl_coef:
        inputs.append(ref.logprob(rollout))
        loss += hf.loss("kl_loss", weight=kl_coef, kl_type=kl_type, loss_agg_mode=loss_agg_mode)
    actor.update(*inputs, loss=loss)
