"""FSDP2 data parallelism: the same batch updated by dp=2 (two Ray workers) and by dp=1 gives the same step.

The two ranks each hold half the batch (7 rows: one padding row with an all-zero mask),
compute their losses with the global token counts, and sum their gradients; with
two epochs of one mini-batch and micro-batches of two rows, the loss, the gradient
norm and the new weights must equal those of one TrainEngine on the whole batch
(fp32, up to float rounding: <= 1e-5, and weights within 1% of the learning rate after two
Adam steps, which amplify rounding in near-zero gradients).
"""
from __future__ import annotations

import copy

import pytest
import torch
from ray_testkit import TOKENIZER, compiled_plan, on_pool, prompts, role_specs, tiny_model, train_state

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.control import control_plan
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams, TrainEngine, TrainEngineConfig
from hybridflow.runtime.ray import RayExecutor
from hybridflow.trainer.run_state import role_sections, state_sections

TERMS = [("ppo_clip", 1.0, {}), ("kl_loss", 0.1, {"kl_type": "low_var_kl"}), ("entropy_bonus", 0.01, {})]
CONFIG = dict(lr=1e-2, ppo_epochs=2, micro_batch_size=2)


def _batch():
    engine = HFRolloutEngine(tiny_model(), tokenizer=TOKENIZER, sampling=SamplingParams(max_new_tokens=5, seed=3))
    batch = engine.generate(prompts(0, count=7))
    noise = torch.Generator().manual_seed(5)
    return batch.with_fields(old_log_probs=batch["rollout_log_probs"],
                             ref_log_probs=batch["rollout_log_probs"] - 0.05 * torch.rand(batch["response_mask"].shape, generator=noise),
                             advantages=torch.randn(batch["response_mask"].shape, generator=noise))


@pytest.mark.e2e
def test_dp2_fsdp_update_equals_dp1(ray_cluster):
    graph = ALGORITHMS["rloo"].build(n=1)
    plan = compiled_plan(graph, "colocate", 2)
    assert plan.placement("actor").layout.dp == 2
    batch = _batch()
    single = TrainEngine(tiny_model(), TrainEngineConfig(precision="fp32", **CONFIG))
    with RayExecutor(plan, role_specs(graph, **CONFIG)) as executor:
        (report, _) = [r for r in executor.run_plan(control_plan(plan, "describe", ["actor"])).results["actor.describe"]]
        assert report["engines"]["train"] == "FSDPTrainEngine"  # an FSDPTrainEngine on two ranks
        log_probs = on_pool(executor, "pool0", "logprob", "actor", batch)
        assert (log_probs - single.compute_log_probs(batch)).abs().max() <= 1e-6
        metrics = on_pool(executor, "pool0", "update", "actor", batch, TERMS)
        expected = single.update(batch, TERMS)
        for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm"):
            assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
        state = train_state(executor, "actor")  # full tensors gathered from the shards on rank 0 (an export plan)
    weights = single.module.state_dict()
    assert state["model"].keys() == weights.keys()
    # Adam divides by sqrt(v) + eps: for a weight whose gradient is near eps (a token seen once), a float
    # rounding difference in the gradient moves the step by a sizeable part of lr (1e-2). So the weights
    # get 1% of lr; the gradients themselves are compared through Adam's first moment just below (1e-6).
    assert max(float((state["model"][k] - weights[k]).abs().max()) for k in weights) <= 1e-4
    # The optimizer state uses the plain optimizer's parameter indices: it loads into a dp=1 engine.
    own = single.state_dict()["optimizer"]
    assert state["optimizer"]["state"].keys() == own["state"].keys()
    for index, entry in own["state"].items():
        assert torch.allclose(state["optimizer"]["state"][index]["exp_avg"], entry["exp_avg"], atol=1e-6)
    fresh = TrainEngine(copy.deepcopy(tiny_model()), TrainEngineConfig(precision="fp32", **CONFIG))
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.module.state_dict()[k], state["model"][k]) for k in weights)


@pytest.mark.e2e
def test_dp2_packed_token_budget_update_equals_dp1(ray_cluster):
    """Packed rows, micro-batches of at most 12 tokens and token-balanced shares on two FSDP ranks: the dp=1 step.

    The ranks' update shares (6 10 7 10 and 10 10 7 5 tokens) make 4 and 3 micro-batches, so they agree on 4
    and rank 1 splits its 7+5 one; a mismatch would hang FSDP's collectives (a timeout error)."""
    config = dict(lr=1e-2, ppo_epochs=2, pack_sequences=True, max_tokens_per_micro_batch=12)
    graph = ALGORITHMS["rloo"].build(n=1)
    plan = compiled_plan(graph, "colocate", 2)
    batch = _batch()
    single = TrainEngine(tiny_model(), TrainEngineConfig(precision="fp32", micro_batch_size=2,
                                                         **{k: config[k] for k in ("lr", "ppo_epochs")}))
    with RayExecutor(plan, role_specs(graph, **config)) as executor:
        log_probs = on_pool(executor, "pool0", "logprob", "actor", batch)
        valid = batch["response_mask"].bool()
        assert (log_probs - single.compute_log_probs(batch))[valid].abs().max() <= 1e-5
        metrics = on_pool(executor, "pool0", "update", "actor", batch, TERMS)
    expected = single.update(batch, TERMS)
    for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key


@pytest.mark.e2e
def test_dp2_rollout_rng_state_continues_every_rank(ray_cluster, tmp_path):
    """A data-parallel rollout samples with a seed per rank: its saved state (a checkpoint plan's) holds every rank's
    stream, and restoring it (a restore plan) makes each rank redraw exactly what it drew after the save (rank 1
    too, not only rank 0)."""
    graph = ALGORITHMS["rloo"].build(n=2)
    plan = compiled_plan(graph, "colocate", 2)
    assert plan.placement("actor").layout.dp == 2
    batch = prompts(0, count=4)
    overrides = {"seed": 11, "max_new_tokens": 6}
    save, load = control_plan(plan, "save_state", ["actor"]), control_plan(plan, "load_state", ["actor"])
    with RayExecutor(plan, role_specs(graph)) as executor:
        on_pool(executor, "pool0", "generate", "actor", batch, overrides)
        results = executor.run_plan(save, args={"actor.save_state": str(tmp_path)}).results
        sections, _ = state_sections({"actor.save_state": "actor"}, results)
        assert len(sections["rollout_rng"]["actor"]["ranks"]) == 2
        after_save = on_pool(executor, "pool0", "generate", "actor", batch, overrides)["response_ids"]
        on_pool(executor, "pool0", "generate", "actor", batch, overrides)  # move every stream on
        saved = role_sections(sections, "actor")
        executor.run_plan(load, args={"actor.load_state": {"folder": str(tmp_path), **saved}})
        replayed = on_pool(executor, "pool0", "generate", "actor", batch, overrides)["response_ids"]
    assert torch.equal(replayed, after_save)
