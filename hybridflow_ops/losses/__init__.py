"""Loss ops (policy, value, entropy, KL) and the loss aggregation modes.

Importing this package registers the loss ops ``ppo_clip``,
``gspo``, ``gmpo``, ``cispo``, ``reinforce``, ``gpg``, ``clip_cov``, ``kl_cov``,
``sapo``, ``dro``, ``dppo_tv``, ``dppo_kl``, ``kl_loss``, ``value_clip``, ``entropy_bonus``,
the ``<loss>_is`` variant of each policy-gradient loss (:mod:`.is_weighted`: ``ppo_clip_is``,
``gspo_is``, ...) and the compute op ``truncated_is_weight``.
"""
from .aggregate import LOSS_AGG_MODES, aggregate_loss, count_seqs, count_tokens
from .covariance import ClipCovLoss, KLCovLoss, clip_cov, kl_cov, token_covariance
from .entropy import EntropyLoss, entropy_bonus, entropy_from_logits
from .gmpo import GMPOLoss, gmpo
from .kl_loss import KLLoss, kl_loss
from .nll import NLLLoss, nll
from .policy import GSPOLoss, ISWeights, PolicyLoss, gspo, ppo_clip, truncated_is_weight
from .reinforce import CISPOLoss, DROLoss, PGLoss, cispo, dro, gpg, reinforce
from .trust_region import DPPOLoss, SAPOLoss, binary_kl, dppo_kl, dppo_tv, sapo
from .value import ValueLoss, value_clip
from .is_weighted import (
    IS_WEIGHTED_LOSSES, cispo_is, clip_cov_is, dppo_kl_is, dppo_tv_is, dro_is, gmpo_is, gpg_is, gspo_is, is_weighted_name,
    kl_cov_is, ppo_clip_is, reinforce_is, sapo_is,
)

__all__ = [
    "LOSS_AGG_MODES", "aggregate_loss", "count_seqs", "count_tokens",
    "EntropyLoss", "entropy_bonus", "entropy_from_logits",
    "KLLoss", "kl_loss", "NLLLoss", "nll",
    "GSPOLoss", "ISWeights", "PolicyLoss", "gspo", "ppo_clip", "ppo_clip_is", "truncated_is_weight",
    "ValueLoss", "value_clip",
    "ClipCovLoss", "KLCovLoss", "clip_cov", "kl_cov", "token_covariance", "GMPOLoss", "gmpo",
    "CISPOLoss", "DROLoss", "PGLoss", "cispo", "dro", "gpg", "reinforce",
    "DPPOLoss", "SAPOLoss", "binary_kl", "dppo_kl", "dppo_tv", "sapo",
    "IS_WEIGHTED_LOSSES", "is_weighted_name", "cispo_is", "clip_cov_is", "dppo_kl_is", "dppo_tv_is", "dro_is", "gmpo_is",
    "gpg_is", "gspo_is", "kl_cov_is", "reinforce_is", "sapo_is",
]
