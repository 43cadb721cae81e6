"""Advantage estimators: GAE, GRPO / Dr.GRPO, RLOO, REINFORCE++ (and its baseline variant), ReMax.

Importing this package registers the ops ``gae``, ``grpo_advantage``,
``rloo_advantage``, ``reinforce_pp_advantage``,
``reinforce_pp_baseline_advantage``, ``remax_advantage``, ``gpg_advantage``,
``opo_advantage``, ``passk_advantage``, ``optimal_token_baseline_advantage``,
``overlong_penalty`` and ``uniform_group_filter``.
"""
from .gae import GAEResult, gae
from .group import Advantages, GroupStats, group_stats, grpo_advantage, reinforce_pp_baseline_advantage, rloo_advantage
from .group_variants import gpg_advantage, opo_advantage, passk_advantage
from .reinforce_pp import ReinforcePPResult, discounted_returns, reinforce_pp_advantage
from .remax import ReMaxResult, remax_advantage
from .shaping import GroupFilter, ShapedScores, overlong_penalty, uniform_group_filter
from .token_baseline import optimal_token_baseline_advantage, token_gradient_energy

__all__ = [
    "GAEResult", "gae",
    "Advantages", "GroupStats", "group_stats", "grpo_advantage", "rloo_advantage", "reinforce_pp_baseline_advantage",
    "ReinforcePPResult", "discounted_returns", "reinforce_pp_advantage",
    "ReMaxResult", "remax_advantage",
    "gpg_advantage", "opo_advantage", "passk_advantage",
    "GroupFilter", "ShapedScores", "overlong_penalty", "uniform_group_filter",
    "optimal_token_baseline_advantage", "token_gradient_energy",
]
