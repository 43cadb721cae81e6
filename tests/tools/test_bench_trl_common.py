"""tools/bench_trl/common.py: the reward and greedy evaluation that both sides of tools/bench_vs_trl.py use
must equal hybridflow's own (RuleRewardSource with unfinished_score=0, Trainer.validate's greedy score)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hybridflow.data import create_tiny_model_dir, load_causal_lm, load_tokenizer, make_prompt_batch
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams
from hybridflow.runtime.engines.rule_reward import RuleRewardSource
from hybridflow_ops.rewards import default_compute_score
from tool_module import load_file

COMMON = Path(__file__).resolve().parents[2] / "tools" / "bench_trl" / "common.py"


@pytest.fixture(scope="module")
def common():
    return load_file(COMMON, "bench_trl_common")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return create_tiny_model_dir(tmp_path_factory.mktemp("tiny"), task="arithmetic", seed=3, hidden=32, layers=1,
                                 heads=2, kv_heads=1)


def test_rows_are_the_builtin_task(common):
    ours = [(r["prompt"], r["ground_truth"]) for r in make_arithmetic_rows()]
    assert [(r["prompt"], r["ground_truth"]) for r in common.arithmetic_rows()] == ours


def test_exact_sum_score_equals_hybridflow_reward(common, model_dir):
    tok = load_tokenizer(model_dir)
    eos, pad, bos = tok.eos_token_id, tok.pad_token_id, tok.bos_token_id
    digit = {c: tok.convert_tokens_to_ids(c) for c in "0123456789 "}
    # (valid response tokens, ground truth): right answer, wrong, no EOS (cut), a <pad> / <bos> sampled
    # inside, a space around the answer, EOS alone, two EOS (the first ends it)
    cases = [([digit["7"], eos], "7"), ([digit["1"], digit["2"], eos], "12"), ([digit["7"], eos], "8"),
             ([digit["1"], digit["2"], digit["3"]], "12"), ([digit["7"]], "7"), ([pad, digit["7"], eos], "7"),
             ([digit["7"], pad, eos], "7"), ([bos, digit["7"], eos], "7"), ([digit[" "], digit["7"], eos], "7"),
             ([eos], "0")]
    width = 3
    ids = torch.full((len(cases), width), pad)
    mask = torch.zeros((len(cases), width))
    for i, (row, _) in enumerate(cases):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1.0
    source = RuleRewardSource(default_compute_score, tokenizer=tok, eos_token_ids=(eos,), unfinished_score=0.0)
    batch = {"response_ids": ids, "response_mask": mask, "ground_truth": [t for _, t in cases],
             "data_source": ["arithmetic"] * len(cases)}
    ours = source.score(batch).scores.tolist()
    theirs = [common.exact_sum_score(row, truth, tok, eos) for row, truth in cases]
    assert theirs == ours
    assert ours[:3] == [1.0, 1.0, 0.0] and ours[5:8] == [0.0, 0.0, 0.0]  # a sampled <pad> / <bos> scores 0


def test_greedy_responses_equal_the_rollout_engines(common, model_dir):
    tok, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    rows = make_arithmetic_rows()
    engine = HFRolloutEngine(model, tokenizer=tok, sampling=SamplingParams(max_new_tokens=3, greedy=True))
    greedy = engine.generate(make_prompt_batch(rows, tok))
    ours = [ids[mask > 0].tolist() for ids, mask in zip(greedy["response_ids"], greedy["response_mask"])]
    assert common.greedy_responses(model, tok, common.arithmetic_rows(), 3) == ours
    source = RuleRewardSource(default_compute_score, tokenizer=tok, eos_token_ids=(tok.eos_token_id,),
                              unfinished_score=0.0)
    score = float(source.score(greedy).scores.mean())
    assert common.greedy_accuracy(model, tok, common.arithmetic_rows(), 3) == pytest.approx(score)


def test_trl_runner_reseeds_with_hybridflows_rollout_stream_seed():
    # the TRL runner cannot import hybridflow, so its reseed="rollout" variant writes stream_seed out again:
    # both must give the seed that hybridflow's rollout sampler gets, or the variant tests another stream
    from hybridflow.trainer.seeds import stream_seed

    sys.path.insert(0, str(COMMON.parent))
    runner = load_file(COMMON.parent / "trl_runner.py", "bench_trl_runner")
    assert [runner.rollout_stream_seed(s) for s in (0, 1, 7, 12345)] == [stream_seed(s, "rollout") for s in (0, 1, 7, 12345)]


def test_stop_logits_spread_lengths_over_the_budget(common):
    """A random tiny model made to stop after about half the budget: hybridflow's decode samples that (never <pad>)."""
    from hybridflow.data.tiny import make_tiny_model
    from hybridflow.runtime.engines.decode import decode

    budget = 16
    p = common.spread_stop_probability(budget)
    assert (1 - (1 - p) ** budget) / p == pytest.approx(budget / 2, rel=1e-6)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=64, layers=2, heads=4, kv_heads=2, seed=1).eval()
    common.set_stop_logits(model, eos_id=2, pad_id=0, budget=budget)
    ids = torch.tensor([[5, 6, 7, 8]])
    out = decode(model, ids, torch.ones_like(ids), SamplingParams(n=400, max_new_tokens=budget), eos_token_ids=[2],
                 pad_token_id=0, generator=torch.Generator().manual_seed(0))
    lengths = out.response_mask.sum(1)
    assert 0.4 * budget < float(lengths.mean()) < 0.6 * budget  # geometric: sd ~5, standard error ~0.25
    assert (lengths < budget / 4).any() and (lengths == budget).any()  # spread over the budget
    ended = out.response_ids[torch.arange(400), (lengths.long() - 1)]
    assert not (out.response_ids[out.response_mask.bool()] == 0).any()  # <pad> is never sampled
    assert (ended[lengths < budget] == 2).all()  # rows that stopped early stopped at EOS
