"""Training with ``rollout_engine: vllm``, for real (markers ``vllm`` and ``e2e``; ``make test-vllm`` runs them).

The model is a tiny Llama with head_dim 32 (vLLM's CPU attention refuses the default tiny model's 16).
The reward is the arithmetic *cost* rule (longer answers score more), so that every step has
non-zero advantages and an update that the next weight sync must carry into vLLM.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not importable in this environment; `make test-vllm` runs these tests in .venv-vllm")

from hybridflow.algorithms import GRPOTrainer  # noqa: E402
from hybridflow.trainer.metrics import JsonlTracker  # noqa: E402

from run_testkit import StopAt, learned, sampled_log_prob_gap  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from hybridflow.data import create_tiny_model_dir

    return str(create_tiny_model_dir(tmp_path_factory.mktemp("models") / "llama", arch="llama", hidden=64, heads=2,
                                     kv_heads=1, seed=0))


def _config(fast_config, llama_dir, out, **kw):
    settings = dict(actor_model_name=llama_dir, output_dir=str(out), max_steps=4, rollout_batch_size=4, n_samples=4,
                    max_response_length=4, actor_lr=5e-3, rollout_engine="vllm",
                    rollout_engine_options={"max_model_len": 64, "kv_cache_gib": 1},
                    reward_fn="hybridflow_ops.rewards.arithmetic:long_answer_cost", calibrate=False)
    settings.update(kw)
    return fast_config(**settings)


def test_grpo_with_vllm_rollouts_trains_and_vllm_follows_every_update(fast_config, llama_dir, tmp_path):
    trainer = GRPOTrainer(config=_config(fast_config, llama_dir, tmp_path / "run", max_steps=3))
    history = trainer.train()
    assert trainer.plan.placement("actor").rollout_engine == "vllm"
    assert not any(op.reuse for op in trainer.plan.ops)  # vLLM's log-probs are never taken for the actor's
    assert len(history) == 3 and all(torch.isfinite(torch.tensor(m["actor/pg_loss"])) for m in history)
    assert any(abs(m["actor/pg_loss"]) > 0 for m in history)
    # the rollout engine is vLLM (as its worker reports), and after a weight sync it samples from the trained weights
    assert [r["engines"].get("rollout") for r in trainer.describe("actor")] == ["VLLMRolloutEngine"]
    assert sampled_log_prob_gap(trainer, trainer.train_rows[:8], n=2, max_new_tokens=4, seed=3) < 1e-4


def test_a_vllm_run_resumes_bit_for_bit(fast_config, llama_dir, tmp_path):
    full = GRPOTrainer(config=_config(fast_config, llama_dir, tmp_path / "full", save_freq=2)).train()
    with pytest.raises(KeyboardInterrupt):  # killed while logging step 3, after step 2's checkpoint
        GRPOTrainer(config=_config(fast_config, llama_dir, tmp_path / "cut", save_freq=2),
                    trackers=[JsonlTracker(tmp_path / "cut" / "metrics.jsonl"), StopAt(3)]).train()
    resumed_trainer = GRPOTrainer(config=_config(fast_config, llama_dir, tmp_path / "cut", save_freq=2))
    resumed = resumed_trainer.train()
    assert resumed_trainer.resumed_from.name == "step_00000002"
    assert len(resumed) == 2
    for step, (a, b) in enumerate(zip(full[2:], resumed), start=3):
        assert learned(a) == learned(b), f"step {step} differs"


def test_grpo_with_vllm_rollouts_on_ray_one_step_off_policy(fast_config, llama_dir, tmp_path):
    """executor=ray, placement=split, staleness=1: vLLM samples in the generation pool's slot, a Ray actor whose
    process is in the slots' torch.distributed world (vLLM's worker then runs in a process of its own)."""
    out = tmp_path / "ray"
    trainer = GRPOTrainer(config=_config(fast_config, llama_dir, out, max_steps=3, executor="ray", placement="split",
                                         staleness=1, allow_uncorrected_staleness=True, cpu_slots=2, val_samples=1))
    try:
        history = trainer.train()
        actor = trainer.plan.placement("actor")
        assert actor.rollout_engine == "vllm" and actor.generation_pool not in (None, actor.pool)
        assert [m["rollout/staleness"] for m in history] == [0.0, 1.0, 1.0]  # step 1 on-policy, then one update old
        assert all(torch.isfinite(torch.tensor(m["actor/pg_loss"])) for m in history)
        assert any(abs(m["actor/pg_loss"]) > 1e-6 for m in history)
        assert all(m["weight_sync/actor/mb"] > 0 for m in history)  # every step's weights went over to the vLLM pool
        # after a weight sync, vLLM (on the generation pool) samples from the trained weights
        assert sampled_log_prob_gap(trainer, trainer.train_rows[:4], n=2, max_new_tokens=4, seed=3) < 1e-4
        # the staging folder in /dev/shm is gone once vLLM has read it (ray.kill leaves no clean-up to do)
        (report,) = [r for r in trainer.describe("actor") if r["engines"].get("rollout")]
        assert report["rollout_folder"] and not Path(report["rollout_folder"]).exists()
    finally:
        trainer.executor.shutdown()
