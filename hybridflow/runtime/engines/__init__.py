"""Engines: the model-level workhorses the role workers host.

- :class:`TrainEngine` (``train.py``): a module + AdamW; ``update`` from registered loss ops,
  ``compute_log_probs`` / ``compute_values``; weights for sync via ``named_weights``.
- :class:`HFRolloutEngine` (``rollout_hf.py``): KV-cached sampling with transformers models,
  :class:`SamplingParams` (``sampling.py``); ``update_weights`` for weight sync.
- ``VLLMRolloutEngine`` (``rollout_vllm.py``, needs vLLM; imported on use): vLLM's ``LLM`` with
  in-place weight updates.
- the protocols the runtime uses them through (``protocols.py``: :class:`RolloutEngine`,
  :class:`TrainEngineProtocol`) and the rollout engines by name (``registry.py``: ``hf``, ``vllm``).
- :class:`ValueModel` (``critic.py``): a causal-LM backbone with a value head.
- :class:`RewardModel` (``reward_model.py``) and :class:`RuleRewardSource` (``rule_reward.py``):
  reward sources whose ``score(batch)`` returns a :class:`RewardOutput`.
"""
from __future__ import annotations

from .critic import ValueModel
from .lm_logprobs import response_log_probs
from .loss_terms import LOSS_METRIC_NAMES, LossTerm
from .optim import TrainEngineConfig, lr_factor
from .protocols import RolloutEngine, TrainEngineProtocol
from .registry import ROLLOUT_ENGINES, RolloutBuild, build_rollout
from .reward_model import RewardModel
from .rollout_hf import HFRolloutEngine
from .rule_reward import RewardOutput, RuleRewardSource
from .sampling import SamplingParams
from .train import TrainEngine

__all__ = [
    "TrainEngine", "TrainEngineConfig", "LossTerm", "LOSS_METRIC_NAMES", "lr_factor", "response_log_probs",
    "HFRolloutEngine", "SamplingParams", "RolloutEngine", "TrainEngineProtocol", "ROLLOUT_ENGINES", "RolloutBuild",
    "build_rollout",
    "ValueModel",
    "RewardModel", "RuleRewardSource", "RewardOutput",
]
