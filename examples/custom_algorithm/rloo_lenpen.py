"""The tutorial's algorithm (docs/tutorial.md): RLOO with a length penalty, clip-higher and a KL loss.

* a 5-line op: the score minus ``penalty`` per response token (a bare tensor: one output);
* the leave-one-out baseline of RLOO (Ahmadian et al. 2024, eq. 4) on the penalised score;
* PPO's clipped surrogate with decoupled clip ranges (``clip_high > clip_low``: DAPO's clip-higher,
  Yu et al. 2025) plus the KL to the reference as a loss term, weighted by ``kl_coef``;
* the reward is a rule function (``roles={"reward": "rule"}``), so ``hybridflow compile`` costs it as ~0.

Train it:  hybridflow run algorithm=rloo_lenpen:rloo_lenpen max_steps=3   (from this folder)
"""
import hybridflow as hf


@hf.register_op("length_penalty", inputs=("scores: float32[B]", "response_mask: float32[B, R]"),
                outputs=("scores: float32[B]",))
def length_penalty(scores, response_mask, *, penalty=0.01):
    """s'_i = s_i - penalty * |y_i| (|y_i|: response i's tokens); shapes (b,), (b, r) -> (b,)."""
    return scores - penalty * response_mask.sum(-1)


@hf.algorithm(roles={"reward": "rule"})
def rloo_lenpen(prompts, actor, ref, reward, *, n=4, len_penalty=0.01, clip_low=0.2, clip_high=0.28, kl_coef=0.001):
    rollout = actor.generate(prompts, n=n)
    old_logp, ref_logp = actor.logprob(rollout), ref.logprob(rollout)
    scores = hf.compute("length_penalty", rollout, reward.score(rollout), penalty=len_penalty)
    adv = hf.compute("rloo_advantage", rollout, scores)
    loss = hf.loss("ppo_clip", clip_low=clip_low, clip_high=clip_high) + hf.loss("kl_loss", weight=kl_coef)
    actor.update(rollout, adv, old_logp, ref_logp, loss=loss)
