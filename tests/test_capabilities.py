"""hybridflow.capabilities: the runtime's facts the compiler predicts with, one definition each, and the tables
on both sides keyed by exactly its names."""
from __future__ import annotations

from hybridflow import capabilities as cap
from hybridflow.compiler.engine import TRAIN_ENGINES
from hybridflow.compiler.rollout_engines import ROLLOUT_ENGINE_COSTS
from hybridflow.runtime.engines.registry import ROLLOUT_ENGINES
from hybridflow.runtime.engines.shared_prompt import MIN_SAVED_POSITIONS, min_saved_positions
from hybridflow.runtime.weight_sync import DEFAULT_BUCKET_BYTES
from hybridflow.trainer.config import PPOConfig


def test_the_runtime_builds_and_the_cost_model_prices_the_same_rollout_engines():
    assert tuple(ROLLOUT_ENGINES) == tuple(ROLLOUT_ENGINE_COSTS) == cap.ROLLOUT_ENGINE_NAMES
    assert cap.DEFAULT_ROLLOUT_ENGINE in cap.ROLLOUT_ENGINE_NAMES
    assert PPOConfig().rollout_engine == cap.DEFAULT_ROLLOUT_ENGINE


def test_the_runtime_runs_train_engines_the_cost_model_knows():
    assert set(cap.RUNTIME_TRAIN_ENGINES) <= set(TRAIN_ENGINES)


def test_the_runtime_uses_the_figures_the_compiler_predicts_with():
    assert DEFAULT_BUCKET_BYTES == cap.WEIGHT_SYNC_BUCKET_BYTES == 256 * 2**20
    assert MIN_SAVED_POSITIONS == cap.SHARED_PROMPT_MIN_SAVED
    # ceil(64 * 256 / hidden): 64 at width 256, 16 at 1024, 256 at 64, 22 at 768 (16384 / 768 = 21.3)
    assert [min_saved_positions(h) for h in (None, 256, 1024, 64, 768)] == [64, 64, 16, 256, 22]
    assert [cap.shared_prompt_threshold(64, h) for h in (None, 256, 1024, 64, 768)] == [64, 64, 16, 256, 22]
