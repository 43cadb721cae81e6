"""Safe-RLHF through the trainer: a cost source of its own, and the Lagrange multiplier as run state."""
from __future__ import annotations

import json

import pytest

from hybridflow.errors import ConfigError
from hybridflow.trainer import PPOTrainer, SafeRLHFTrainer
from hybridflow_ops.rewards.arithmetic import long_answer_cost

COST_FN = "hybridflow_ops.rewards.arithmetic:long_answer_cost"


def _safe_config(fast_config, **kw):
    settings = dict(cost_fn=COST_FN, cost_limit=0.1, lagrange_lambda=0.2, lambda_lr=0.5, max_steps=4, save_freq=4)
    settings.update(kw)
    return fast_config(**settings)


def test_cost_role_scores_with_cost_fn_and_lambda_follows_the_mean_cost(fast_config, tmp_path):
    trainer = SafeRLHFTrainer(config=_safe_config(fast_config))
    history = trainer.train()
    # the cost role has its own source; the reward role keeps the reward
    assert trainer.describe("cost")[0]["reward_fn"] is long_answer_cost
    assert trainer.describe("reward")[0]["reward_fn"] is not long_answer_cost
    # each step ran with the lambda the previous step's mean cost gave: max(0, lambda + 0.5 * (cost - 0.1))
    lambdas = [m["safe/lagrange_lambda"] for m in history]
    assert lambdas[0] == 0.2
    for before, after, metrics in zip(lambdas, lambdas[1:], history):
        assert after == max(0.0, before + 0.5 * (metrics["critic/costs/mean"] - 0.1))
    assert len(set(lambdas)) > 1  # it moved
    # the checkpoint holds the value the next step would run with
    state = json.loads((trainer.last_checkpoint / "trainer_state.json").read_text())
    last = history[-1]
    assert state["algorithm_state"] == {"lagrange_lambda": max(0.0, lambdas[-1] + 0.5 * (last["critic/costs/mean"] - 0.1))}


def test_cost_model_name_scores_costs_with_a_model(fast_config, tiny_model_dir):
    from hybridflow.runtime.engines import RewardModel

    trainer = SafeRLHFTrainer(config=_safe_config(fast_config, cost_model_name=tiny_model_dir, max_steps=1, save_freq=0))
    with pytest.warns(UserWarning, match="no trained score head"):  # a new score head on the tiny causal LM
        (metrics,) = trainer.train()
    assert trainer.describe("cost")[0]["engines"]["reward"] == RewardModel.__name__
    assert trainer.describe("reward")[0]["reward_fn"].__name__ == "default_compute_score"  # the rule reward
    assert metrics["critic/costs/mean"] != metrics["critic/score/mean"]


def test_safe_rlhf_without_a_cost_source_names_the_fields(fast_config):
    with pytest.raises(ConfigError, match="cost role \\('cost'\\) but no cost source: set cost_fn .* or cost_model_name"):
        SafeRLHFTrainer(config=fast_config()).train()
    with pytest.raises(ConfigError, match="cost_fn 'hybridflow_ops.rewards.arithmetic:no_such' cannot be loaded"):
        SafeRLHFTrainer(config=fast_config(cost_fn="hybridflow_ops.rewards.arithmetic:no_such")).train()


def test_cost_fields_on_an_algorithm_without_a_cost_are_reported(fast_config, caplog):
    trainer = PPOTrainer(config=fast_config(cost_fn=COST_FN, cost_limit=0.3))
    with caplog.at_level("WARNING", logger="hybridflow.trainer"):
        trainer.build_graph()
    assert "ppo has no attribute for cost_limit; these config fields are ignored" in caplog.text
    assert "ppo has no cost role; the config field cost_fn is ignored" in caplog.text
