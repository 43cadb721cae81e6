"""Engines: the model-level workhorses the role workers host.

- :class:`TrainEngine` (``train.py``): a module + AdamW; ``update`` from registered loss ops,
  ``compute_log_probs`` / ``compute_values``; weights for sync via ``named_weights``.
- :class:`HFRolloutEngine` (``rollout_hf.py``): KV-cached sampling with transformers models,
  :class:`SamplingParams` (``sampling.py``); ``load_weights`` for weight sync.
- :class:`ValueModel` (``critic.py``): a causal-LM backbone with a value head.
- :class:`RewardModel` (``reward_model.py``) and :class:`RuleRewardSource` (``rule_reward.py``):
  reward sources whose ``score(batch)`` returns a :class:`RewardOutput`.
"""
from __future__ import annotations

from .critic import ValueModel
from .lm_logprobs import response_log_probs
from .loss_terms import LOSS_METRIC_NAMES, LossTerm
from .optim import TrainEngineConfig, lr_factor
from .reward_model import RewardModel
from .rollout_hf import HFRolloutEngine
from .rule_reward import RewardOutput, RuleRewardSource
from .sampling import SamplingParams
from .train import TrainEngine

__all__ = [
    "TrainEngine", "TrainEngineConfig", "LossTerm", "LOSS_METRIC_NAMES", "lr_factor", "response_log_probs",
    "HFRolloutEngine", "SamplingParams",
    "ValueModel",
    "RewardModel", "RuleRewardSource", "RewardOutput",
]
