"""Rule rewards: hand-worked responses, tricky inputs, and the data_source dispatch."""
from __future__ import annotations

import functools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridflow_ops.rewards import RULE_REWARDS, arithmetic, countdown, default_compute_score, format_reward, gsm8k


# ---------------------------------------------------------------- arithmetic

@pytest.mark.parametrize("response, truth, expected", [
    ("42", 42, 1.0),
    (" 42\n", "42", 1.0),        # surrounding whitespace is stripped
    ("-7", -7, 1.0),             # negatives carry a leading '-'
    ("7", -7, 0.0),
    ("0", 0, 1.0),
    ("-0", 0, 0.0),              # not the digits of 0
    ("042", 42, 0.0),            # leading zero: not exactly the digits
    ("+42", 42, 0.0),
    ("42.", 42, 0.0),
    ("4 2", 42, 0.0),
    ("42 is the answer", 42, 0.0),
    ("43", 42, 0.0),
    ("", 42, 0.0),
    ("\u0664\u0662", 42, 0.0),   # Arabic-Indic digits are not ASCII digits
])
def test_arithmetic_exact_integer(response, truth, expected):
    assert arithmetic.compute_score("arithmetic", response, truth) == expected


def test_arithmetic_rejects_a_non_integer_ground_truth():
    with pytest.raises(ValueError, match="integer"):
        arithmetic.compute_score("arithmetic", "1", "one")


@given(a=st.integers(-10**6, 10**6), b=st.integers(-10**6, 10**6))
def test_arithmetic_property_right_sum_scores_one_and_off_by_one_scores_zero(a, b):
    assert arithmetic.compute_score("arithmetic", f"{a + b}", a + b) == 1.0
    assert arithmetic.compute_score("arithmetic", f"{a + b + 1}", a + b) == 0.0


@pytest.mark.parametrize("response, expected", [
    ("7", 0.0), (" 7\n", 0.0), ("", 0.0), ("12", 1.0), ("18", 1.0), ("123", 1.0), ("7 ", 0.0), ("-1", 1.0),
])
def test_long_answer_cost_is_one_for_more_than_one_character(response, expected):
    # a cost, not a reward: the ground truth does not matter (a correct "12" costs 1, a wrong "3" costs 0)
    assert arithmetic.long_answer_cost("arithmetic", response, "12") == expected
    assert arithmetic.long_answer_cost("arithmetic", response, "3") == expected


# ---------------------------------------------------------------- gsm8k

@pytest.mark.parametrize("response, truth, expected", [
    ("3 + 4 = 7 apples.\n#### 7", "7", 1.0),
    ("The total is 1,234 dollars.\n#### 1,234", "1234", 1.0),  # commas removed
    ("#### $1,234.", "1,234", 1.0),                           # '$' allowed, trailing '.' ignored
    ("#### 72.00", "72", 1.0),                                # equal as decimals
    ("#### -5", -5, 1.0),
    ("#### 5\nwait, no.\n#### 6", "6", 1.0),                  # the LAST '####' counts
    ("#### 6\nwait, no.\n#### 5", "6", 0.0),                  # well formed but wrong -> format_score 0.0
    ("The answer is 7.", "7", 0.0),                           # no '####'
    ("#### seven", "7", 0.0),                                 # '####' not followed by a number
    ("#### 7\n####", "7", 0.0),                               # the last '####' has no number
])
def test_gsm8k(response, truth, expected):
    assert gsm8k.compute_score("openai/gsm8k", response, truth) == expected


def test_gsm8k_format_score_only_for_a_well_formed_wrong_answer():
    score = functools.partial(gsm8k.compute_score, format_score=0.1)
    assert score("gsm8k", "#### 8", "7") == 0.1
    assert score("gsm8k", "8", "7") == 0.0
    assert score("gsm8k", "#### 7", "7") == 1.0


def test_gsm8k_ground_truth_may_be_a_whole_solution():
    truth = "Natalia sold 48/2 = 24 clips in May.\nAltogether she sold 48+24 = 72 clips.\n#### 72"
    assert gsm8k.compute_score("gsm8k", "... #### 72", truth) == 1.0
    with pytest.raises(ValueError, match="ground_truth"):
        gsm8k.compute_score("gsm8k", "#### 72", "seventy-two")


# ---------------------------------------------------------------- countdown

GT = {"target": 24, "numbers": [4, 6, 1, 1]}


@pytest.mark.parametrize("response, expected", [
    ("<think>4*6=24</think>\n<answer>4*6*1*1</answer>", 1.0),  # all numbers, right value
    ("<answer> (4 * 6) / (1 * 1) </answer>", 1.0),             # whitespace and parentheses
    ("Let me see.\n4*6\n", 1.0),                                # no <answer>: the last non-empty line
    ("<answer>4*6</answer>", 1.0),                               # numbers may be left unused
    ("<answer>1+1</answer><answer>4*6</answer>", 1.0),           # the last block counts
    ("<answer>(4+6)*1</answer>", 0.1),                           # well formed, value 10: format_score
    ("<answer>6*4*1*1*1</answer>", 0.0),                         # 1 used three times, given twice
    ("<answer>6*6-12</answer>", 0.0),                            # 6 reused, 12 not given
    ("<answer>4/(1-1)</answer>", 0.0),                           # division by zero
    ("<answer>__import__('os').system('true')</answer>", 0.0),   # injection: rejected, never run
    ("<answer>(lambda: 24)()</answer>", 0.0),
    ("<answer>4*6 = 24</answer>", 0.0),                          # '=' is not allowed
    ("<answer>-4+6*1</answer>", 0.0),                            # no unary minus
    ("<answer>4**1*6</answer>", 0.0),                            # no power
    ("<answer>6//1*4</answer>", 0.0),                            # no floor division
    ("<answer>4.0*6</answer>", 0.0),                             # integers only
    ("<answer>04*6</answer>", 0.0),                              # leading zero: not a Python int literal
    ("<answer>4*6)</answer>", 0.0),                              # unbalanced
    ("<answer></answer>", 0.0),
    ("", 0.0),
    ("<answer>" + "(" * 200 + "4" + ")" * 200 + "*6</answer>", 0.0),  # too long to consider
])
def test_countdown(response, expected):
    assert countdown.compute_score("countdown", response, GT) == expected


def test_countdown_value_within_tolerance_and_json_ground_truth():
    # 1/3 * 3 * 8 = 8 exactly with fractions (floats would give 7.999...)
    truth = json.dumps({"target": 8, "numbers": [1, 3, 3, 8]})
    assert countdown.compute_score("countdown", "<answer>1/3*3*8</answer>", truth) == 1.0
    assert countdown.compute_score("countdown", "<answer>8/3</answer>", truth, format_score=0.5) == 0.5


def test_countdown_duplicate_given_numbers_may_each_be_used_once():
    truth = {"target": 9, "numbers": [3, 3, 5]}
    assert countdown.compute_score("countdown", "3*3", truth) == 1.0
    assert countdown.compute_score("countdown", "3*3*3", truth) == 0.0


def test_countdown_malformed_ground_truth_is_named():
    with pytest.raises(ValueError, match="target"):
        countdown.compute_score("countdown", "1+1", {"numbers": [1, 1]})


@given(numbers=st.lists(st.integers(1, 100), min_size=2, max_size=5))
def test_countdown_property_sum_of_the_numbers_reaches_their_sum(numbers):
    truth = {"target": sum(numbers), "numbers": numbers}
    assert countdown.compute_score("countdown", "+".join(map(str, numbers)), truth) == 1.0
    wrong = {"target": sum(numbers) + 1, "numbers": numbers}
    assert countdown.compute_score("countdown", "+".join(map(str, numbers)), wrong) == 0.1
    reused = "+".join(map(str, numbers + [max(numbers) + 1]))  # a number not given
    assert countdown.compute_score("countdown", reused, truth) == 0.0


# ---------------------------------------------------------------- format

@pytest.mark.parametrize("response, expected", [
    ("<think>2+2 is 4</think><answer>4</answer>", 1.0),
    ("  <think>\nmulti\nline\n</think>\n\n<answer>4</answer>\n", 1.0),
    ("<think></think><answer></answer>", 1.0),
    ("<answer>4</answer>", 0.0),                                         # no think block
    ("<answer>4</answer><think>x</think>", 0.0),                         # wrong order
    ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0),       # repeated answer
    ("<think>a<think>b</think></think><answer>c</answer>", 0.0),         # nested think
    ("<think>a</think> so <answer>b</answer>", 0.0),                     # text between blocks
    ("<think>a</think><answer>b</answer> trailing", 0.0),
])
def test_format_think_answer(response, expected):
    assert format_reward.compute_score("any", response, None) == expected


def test_format_custom_pattern():
    assert format_reward.compute_score("any", "Answer: 5", None, pattern=r"Answer: -?\d+") == 1.0
    assert format_reward.compute_score("any", "Answer: five", None, pattern=r"Answer: -?\d+") == 0.0


# ---------------------------------------------------------------- dispatch

@pytest.mark.parametrize("source, response, truth", [
    ("arithmetic", "12", "12"),
    ("gsm8k", "#### 12", "12"),
    ("openai/gsm8k", "#### 12", "12"),
    ("countdown", "<answer>3*4</answer>", {"target": 12, "numbers": [3, 4]}),
])
def test_default_compute_score_dispatches_by_data_source(source, response, truth):
    assert default_compute_score(source, response, truth) == 1.0
    assert RULE_REWARDS[source](source, response, truth) == 1.0


def test_unknown_data_source_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"'lighteval/MATH'.*arithmetic, countdown, gsm8k, openai/gsm8k"):
        default_compute_score("lighteval/MATH", "x", "y")
