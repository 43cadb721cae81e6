"""RuleRewardSource: compute_score per sample; dict extras; NaN and other bad scores raise RewardError."""
from __future__ import annotations

import math

import threading

import pytest
import torch

from hybridflow.errors import RewardError
from hybridflow.batch import Batch
from hybridflow.runtime.engines import RuleRewardSource

EOS, PAD = 2, 0


def scored_batch(responses, truths, sources=None, infos=None):
    columns = {"responses": responses, "ground_truth": truths, "data_source": sources or ["arith"] * len(responses)}
    if infos is not None:
        columns["extra_info"] = infos
    # response ids: each response ends with EOS, except those whose text ends with "~" (cut off)
    ids = torch.full((len(responses), 4), PAD)
    mask = torch.zeros(len(responses), 4)
    for i, text in enumerate(responses):
        ids[i, 0], mask[i, 0] = (7 if text.endswith("~") else EOS), 1.0
    return Batch({"response_ids": ids, "response_mask": mask}, columns)


def exact(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def test_float_scores_in_order():
    out = RuleRewardSource(exact).score(scored_batch(["3", "4", "17"], ["3", "5", "17"]))
    assert out.scores.tolist() == [1.0, 0.0, 1.0] and out.scores.dtype == torch.float32
    assert out.extras == {}


def test_arguments_reach_the_function_in_the_standard_order():
    seen = []

    def record(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 0.5

    batch = scored_batch(["a", "b"], ["x", "y"], sources=["s1", "s2"], infos=[{"k": 1}, None])
    RuleRewardSource(record).score(batch)
    assert seen == [("s1", "a", "x", {"k": 1}), ("s2", "b", "y", None)]
    # a three-argument function works too (no extra_info)
    assert RuleRewardSource(lambda ds, s, gt: len(s)).score(batch).scores.tolist() == [1.0, 1.0]


def test_dict_results_keep_extras_per_sample():
    def graded(data_source, solution_str, ground_truth, extra_info=None):
        ok = solution_str == ground_truth
        return {"score": 1.0 if ok else -0.5, "acc": ok} if ok else {"score": -0.5, "reason": "wrong"}

    out = RuleRewardSource(graded).score(scored_batch(["3", "4"], ["3", "5"]))
    assert out.scores.tolist() == [1.0, -0.5]
    assert out.extras == {"acc": [True, None], "reason": [None, "wrong"]}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1.0", None, [1.0]])
def test_bad_scores_raise_reward_error_naming_the_sample(bad):
    def broken(data_source, solution_str, ground_truth, extra_info=None):
        return bad if solution_str == "b" else 1.0

    batch = scored_batch(["a", "b"], ["x", "y"], sources=["ok_src", "bad_src"])
    with pytest.raises(RewardError, match=r"sample 1 \(data_source='bad_src'\)") as err:
        RuleRewardSource(broken).score(batch)
    assert (str(bad) if not isinstance(bad, str) else repr(bad)) in str(err.value)


def test_nan_inside_a_dict_and_missing_score_key():
    batch = scored_batch(["a"], ["x"])
    with pytest.raises(RewardError, match="nan"):
        RuleRewardSource(lambda *a: {"score": math.nan}).score(batch)
    with pytest.raises(RewardError, match="without 'score'"):
        RuleRewardSource(lambda *a: {"value": 1.0}).score(batch)


def test_exceptions_and_missing_columns_are_reward_errors():
    with pytest.raises(RewardError, match="failed on sample 0.*ZeroDivisionError"):
        RuleRewardSource(lambda *a: 1 / 0).score(scored_batch(["a"], ["x"]))
    batch = scored_batch(["a"], ["x"]).drop("ground_truth")
    with pytest.raises(RewardError, match="'ground_truth'"):
        RuleRewardSource(exact).score(batch)


def test_unfinished_responses_get_the_unfinished_score():
    batch = scored_batch(["3", "3~"], ["3", "3~"])  # same text; the second never produced EOS
    source = RuleRewardSource(exact, eos_token_ids=[EOS], unfinished_score=-1.0)
    assert source.score(batch).scores.tolist() == [1.0, -1.0]


def test_decodes_response_ids_when_there_is_no_text(tokenizer):
    ids = torch.tensor([tokenizer.encode("12", add_special_tokens=False) + [tokenizer.eos_token_id, PAD]])
    batch = Batch({"response_ids": ids, "response_mask": torch.tensor([[1.0, 1.0, 1.0, 0.0]])},
                  {"ground_truth": ["12"], "data_source": ["arith"]})
    source = RuleRewardSource(exact, tokenizer=tokenizer, eos_token_ids=[tokenizer.eos_token_id])
    assert source.score(batch).scores.tolist() == [1.0]


def test_a_call_past_timeout_s_is_a_reward_error_and_the_next_call_runs():
    import threading

    release = threading.Event()

    def hangs_on_the_second(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "hang":
            release.wait()  # until the test ends: the call is abandoned, its daemon thread left waiting
        return float(solution_str == ground_truth)

    source = RuleRewardSource(hangs_on_the_second, timeout_s=0.5)
    try:
        with pytest.raises(RewardError, match=r"did not return within reward_timeout_s=0.5 s on sample 1 "
                                              r"\(data_source='arith'\)"):
            source.score(scored_batch(["3", "hang"], ["3", "4"]))
        assert source.score(scored_batch(["3", "4"], ["3", "5"])).scores.tolist() == [1.0, 0.0]  # a fresh thread
    finally:
        release.set()


def test_a_reward_that_needs_the_main_thread_is_told_how_to_get_it():
    import signal

    def uses_signals(data_source, solution_str, ground_truth, extra_info=None):
        signal.signal(signal.SIGALRM, signal.getsignal(signal.SIGALRM))
        return 1.0

    with pytest.raises(RewardError, match="set reward_timeout_s=null to call it there"):
        RuleRewardSource(uses_signals, timeout_s=5).score(scored_batch(["3"], ["3"]))
    assert RuleRewardSource(uses_signals).score(scored_batch(["3"], ["3"])).scores.tolist() == [1.0]

    # called off the main thread (a Ray worker runs its ops on a thread of its concurrency groups): no way to get it
    caught = []

    def score_off_the_main_thread():
        try:
            RuleRewardSource(uses_signals).score(scored_batch(["3"], ["3"]))
        except RewardError as err:
            caught.append(err)

    thread = threading.Thread(target=score_off_the_main_thread)
    thread.start()
    thread.join()
    assert len(caught) == 1 and "this process runs its ops on another (a Ray worker does)" in str(caught[0])
