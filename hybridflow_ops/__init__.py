"""hybridflow_ops: the RL operators of hybridflow as pure tensor functions.

Every op takes tensors and masks, keyword-only hyper-parameters, returns a
named tuple, never mutates its inputs, and is registered by name in
:mod:`hybridflow_ops.registry` with its typed input and output fields.
This package imports torch, never ``hybridflow``.
"""
from .registry import FieldSpec, OpRegistryError, OpSpec, get_op, has_op, list_ops, register_op, unregister_op
from .masked import masked_mean, masked_sum, masked_var, masked_whiten
from .kl import kl_in_reward, kl_penalty, masked_kl, score_to_token_rewards
from .kl_control import adaptive_kl_coef
from .advantages import (
    gae, gpg_advantage, grpo_advantage, opo_advantage, optimal_token_baseline_advantage, overlong_penalty, uniform_group_filter, passk_advantage, reinforce_pp_advantage, reinforce_pp_baseline_advantage, remax_advantage, rloo_advantage,
)
from .losses import (
    aggregate_loss, cispo, clip_cov, dro, dppo_kl, dppo_tv, entropy_bonus, entropy_from_logits, gmpo, gpg, gspo, kl_cov,
    kl_loss, nll, ppo_clip, ppo_clip_is, reinforce, sapo, truncated_is_weight, value_clip,
    IS_WEIGHTED_LOSSES, cispo_is, clip_cov_is, dppo_kl_is, dppo_tv_is, dro_is, gmpo_is, gpg_is, gspo_is, kl_cov_is,
    reinforce_is, sapo_is,
)
from .rollout import old_log_probs_from_rollout
from .rollout_correction import (
    decoupled_is_weight, icepop_is_weight, normalize_is_weight, sequence_is_weight, sequence_rejection_mask,
)
from .rollout_rejection import chained_rejection_mask, kl_rejection_mask
from .logprob import TokenLogProbs, token_logprobs_from_hidden, token_logprobs_from_logits

__all__ = [
    "FieldSpec", "OpRegistryError", "OpSpec", "get_op", "has_op", "list_ops", "register_op", "unregister_op",
    "masked_mean", "masked_sum", "masked_var", "masked_whiten",
    "kl_in_reward", "kl_penalty", "masked_kl", "score_to_token_rewards", "adaptive_kl_coef",
    "gae", "grpo_advantage", "reinforce_pp_advantage", "reinforce_pp_baseline_advantage", "remax_advantage", "rloo_advantage",
    "gpg_advantage", "opo_advantage", "passk_advantage", "optimal_token_baseline_advantage", "overlong_penalty",
    "uniform_group_filter",
    "aggregate_loss", "entropy_bonus", "entropy_from_logits", "gspo", "kl_loss", "nll", "ppo_clip", "ppo_clip_is",
    "truncated_is_weight", "value_clip", "old_log_probs_from_rollout",
    "icepop_is_weight", "normalize_is_weight", "sequence_is_weight", "sequence_rejection_mask", "decoupled_is_weight",
    "kl_rejection_mask", "chained_rejection_mask",
    "IS_WEIGHTED_LOSSES", "cispo_is", "clip_cov_is", "dppo_kl_is", "dppo_tv_is", "dro_is", "gmpo_is", "gpg_is", "gspo_is",
    "kl_cov_is", "reinforce_is", "sapo_is",
    "cispo", "clip_cov", "dro", "dppo_kl", "dppo_tv", "gmpo", "gpg", "kl_cov", "reinforce", "sapo",
    "TokenLogProbs", "token_logprobs_from_hidden", "token_logprobs_from_logits",
]
