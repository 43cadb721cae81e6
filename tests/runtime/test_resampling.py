"""Dynamic sampling at run time: the selection rule, the padding, the ops a round repeats, and whole local iterations."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow import PPOConfig
from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.plan import PlanOp
from hybridflow.data import create_tiny_model_dir, load_causal_lm, make_prompt_batch
from hybridflow.batch import Batch
from hybridflow.runtime.engines.lm_logprobs import response_log_probs
from hybridflow.runtime.resampling import ResampleRun, Round, concat_padded, select_groups
from hybridflow.trainer import Trainer


def _round(groups, keep):
    groups, keep = np.asarray(groups), np.asarray(keep, dtype=bool)
    return Round({}, keep, groups)


def test_select_groups_kept_first_in_round_order_then_dropped_latest_first():
    # round 0: groups 0 (kept), 1 (dropped); round 1: groups 0 (dropped), 1 (kept), 2 (kept)
    rounds = [_round([0, 0, 1, 1], [1, 1, 0, 0]), _round([0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 1, 1])]
    assert select_groups(rounds, 2) == [(0, 0), (1, 1)]                # full: cut to the target
    assert select_groups(rounds, 3) == [(0, 0), (1, 1), (1, 2)]
    assert select_groups(rounds, 5) == [(0, 0), (1, 1), (1, 2), (1, 0), (0, 1)]  # short: dropped, latest round first


def test_concat_padded_left_pads_prompts_and_right_pads_the_rest():
    a = Batch({"prompt_ids": torch.tensor([[7, 8]]), "response_ids": torch.tensor([[1, 2, 3]])})
    b = Batch({"prompt_ids": torch.tensor([[5, 6, 9]]), "response_ids": torch.tensor([[4]])})
    out = concat_padded([a, b])
    assert out["prompt_ids"].tolist() == [[0, 7, 8], [5, 6, 9]]
    assert out["response_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]


def _op(name, deps=(), node=None, kind="node"):
    return PlanOp(name=name, kind=kind, role="actor", pool="pool0" if kind != "node" or node != "f" else None,
                  node=node if kind == "node" else None, deps=deps)


def test_round_ops_are_the_body_and_what_lies_between_and_the_rest_waits():
    graph = ALGORITHMS["dapo"].build(n=2)
    ops = [_op("sync", kind="weight_sync"), _op("actor.generate", ("sync",), "actor.generate"),
           _op("kv.offload", ("actor.generate",), kind="offload"), _op("reward.score", ("kv.offload",), "reward.score"),
           _op("uniform_group_filter", ("reward.score", "actor.generate"), "uniform_group_filter"),
           _op("actor.logprob", ("actor.generate",), "actor.logprob"),
           _op("actor.update", ("actor.logprob", "uniform_group_filter"), "actor.update"), _op("unrelated")]
    run = ResampleRun.start(graph, ops, {}, None)
    assert [op.name for op in run.body_ops] == ["actor.generate", "kv.offload", "reward.score", "uniform_group_filter"]
    assert run.held == {"actor.logprob", "actor.update"}  # the weight sync before the body and 'unrelated' run as usual
    assert ResampleRun.start(ALGORITHMS["grpo"].build(), ops, {}, None) is None


def _env(groups, scores, rows_tag):
    g = torch.tensor(groups)
    rollout = Batch({"group_index": g, "response_mask": torch.ones(len(g), 2), "tag": torch.full((len(g),), rows_tag)})
    s = Batch({"scores": torch.tensor(scores, dtype=torch.float32)})
    keep = Batch({"keep": torch.tensor([len(set(np.asarray(scores)[np.asarray(groups) == x])) > 1 for x in groups])})
    return {"actor.generate": rollout, "reward.score": s, "uniform_group_filter": keep}


def test_filter_done_repeats_until_full_and_merges_relabelled_aligned_rows():
    graph = ALGORITHMS["dapo"].build(n=2, max_rounds=3)
    inputs = {"prompts": Batch({"prompt_ids": torch.zeros(2, 1, dtype=torch.int64)})}
    asked = []
    run = ResampleRun(graph.resample[0], graph, body_ops=["body"], held=set(), inputs=inputs,
                      refill=lambda k: asked.append(k) or inputs)
    env, metrics = _env([0, 0, 1, 1], [1.0, 1.0, 0.0, 1.0], 1), {}
    assert run.filter_done(env, metrics) == ["body"] and asked == [2]  # 1 of 2 groups kept: another round
    env.update(_env([0, 0, 1, 1], [0.0, 1.0, 0.5, 0.5], 2))
    assert run.filter_done(env, metrics) == [] and run.finished       # round 2 keeps group 0: full
    # the final batch: round 1's group 1, then round 2's group 0, relabelled 0 and 1, rows aligned across nodes
    assert env["actor.generate"]["tag"].tolist() == [1, 1, 2, 2]
    assert env["actor.generate"]["group_index"].tolist() == [0, 0, 1, 1]
    assert env["reward.score"]["scores"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert env["uniform_group_filter"]["keep"].all()
    assert metrics == {"dynamic_sampling/rounds": 2.0, "dynamic_sampling/extra_rounds": 1.0,
                       "dynamic_sampling/dropped_group_frac": 0.5, "dynamic_sampling/filled_frac": 1.0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(create_tiny_model_dir(tmp_path_factory.mktemp("resample") / "tiny", seed=0))


def _trainer(tiny, tmp_path, reward, **overrides):
    config = PPOConfig(actor_model_name=tiny, output_dir=str(tmp_path), max_steps=1, rollout_batch_size=4, n_samples=4,
                       max_response_length=3, actor_lr=2e-3, val_samples=1, trackers=("jsonl",), progress_bar=False,
                       num_threads=1, **overrides)
    trainer = Trainer(config, algorithm="dapo")
    trainer.set_reward_model(reward)
    trainer.prepare()
    return trainer


def _prompt_batch(trainer, rows):
    cfg = trainer.config
    return make_prompt_batch(rows, trainer.tokenizer, max_prompt_length=cfg.max_prompt_length,
                             apply_chat_template=cfg.apply_chat_template)


def _iteration(trainer):
    prompts, asked = _prompt_batch(trainer, trainer.loader.next_batch()), []

    def refill(k):
        asked.append(k)
        return {"prompts": _prompt_batch(trainer, trainer.loader.next_batch())}

    return trainer.executor.run_iteration({"prompts": prompts}, refill=refill), asked


def _by_parity(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2)


def test_local_iteration_fills_the_batch_with_aligned_informative_groups(tiny, tmp_path):
    trainer = _trainer(tiny, tmp_path, _by_parity)
    result, asked = _iteration(trainer)
    m, env = result.metrics, result.env
    rollout, scores, keep = env["actor.generate"], env["reward.score"]["scores"], env["uniform_group_filter"]["keep"]
    rounds = m["dynamic_sampling/rounds"]
    assert 1 <= rounds <= 3 and asked == list(range(2, int(rounds) + 1))
    assert m["dynamic_sampling/extra_rounds"] == rounds - 1
    assert len(rollout) == 16 and rollout["group_index"].tolist() == [g for g in range(4) for _ in range(4)]
    for g in range(4):  # the filter's verdict and the scores still belong to the same rows
        group_scores = scores[rollout["group_index"] == g]
        assert bool(keep[rollout["group_index"] == g].all()) == (len(set(group_scores.tolist())) > 1)
    assert m["dynamic_sampling/filled_frac"] == keep.float().mean().item()
    # the merged rollout is still what the policy sampled: its log-probs recomputed from the (padded) rows agree
    model = load_causal_lm(tiny).eval()
    with torch.no_grad():
        fresh = response_log_probs(model, rollout["prompt_ids"], rollout["prompt_mask"], rollout["response_ids"],
                                   rollout["response_mask"]).log_probs
    mask = rollout["response_mask"].bool()
    assert ((fresh - rollout["rollout_log_probs"]).abs()[mask]).max() < 1e-4
    assert abs(m["actor/ppo_kl"]) < 1e-5 and m["actor/pg_clipfrac"] == 0.0  # the update saw the rows it was given


def test_local_iteration_with_no_signal_runs_every_round_and_keeps_the_latest_groups(tiny, tmp_path):
    # every response scores 1 (cut-off ones too): no group has a signal
    trainer = _trainer(tiny, tmp_path, lambda data_source, solution_str, ground_truth, extra_info=None: 1.0,
                       unfinished_score=None)
    result, asked = _iteration(trainer)
    m = result.metrics
    assert asked == [2, 3] and m["dynamic_sampling/rounds"] == 3.0
    assert m["dynamic_sampling/dropped_group_frac"] == 1.0 and m["dynamic_sampling/filled_frac"] == 0.0
    assert len(result.env["actor.generate"]) == 16  # topped up to the full size with the last round's groups
