"""GRPO / Dr.GRPO, RLOO and REINFORCE++-baseline: hand-worked cases and group properties."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import grpo_advantage, reinforce_pp_baseline_advantage, rloo_advantage

# Six responses in three groups with non-contiguous labels: 7 -> {0, 1, 2}, 3 -> {3, 4}, 9 -> {5}.
SCORES = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 5.0])
GROUPS = torch.tensor([7, 7, 7, 3, 3, 9])
MASK = torch.tensor([[1.0, 1.0, 0.0]] * 6)


def test_grpo_hand_worked():
    # Group 7: scores [1, 0, 0], mean 1/3, deviations [2/3, -1/3, -1/3],
    #   unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3, std = 0.57735
    #   A = [0.66667 / 0.57735, -0.33333 / 0.57735, same] = [1.15470, -0.57735, -0.57735]
    # Group 3: scores [1, 2], mean 1.5, var = (0.25 + 0.25) / 1 = 0.5, std = 0.70711 -> A = [-0.70711, 0.70711]
    # Group 9: a single response -> A = 0.
    adv = grpo_advantage(SCORES, GROUPS, MASK, eps=0.0).advantages
    expected = torch.tensor([1.15470, -0.57735, -0.57735, -0.70711, 0.70711, 0.0])
    torch.testing.assert_close(adv[:, 0], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(adv[:, 1], expected, atol=1e-5, rtol=0)
    assert torch.all(adv[:, 2] == 0)  # padding


def test_dr_grpo_hand_worked():
    # Without the std: A = s - mean_g = [2/3, -1/3, -1/3, -0.5, 0.5, 0 (group of one)].
    adv = grpo_advantage(SCORES, GROUPS, MASK, norm_by_std=False).advantages
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, -1 / 3, -1 / 3, -0.5, 0.5, 0.0]))


def test_grpo_eps_bounds_constant_group():
    # A group whose scores are all equal has std 0: A = 0 / (0 + eps) = 0, never nan.
    adv = grpo_advantage(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), torch.ones(2, 2)).advantages
    assert torch.equal(adv, torch.zeros(2, 2))


def test_equal_non_binary_scores_give_exactly_zero():
    # 0.3 is not a float32 grid point: 8 x 0.3 summed and divided by 8 is 0.30000001, one ulp
    # above 0.3 (float32). Without care, (0.3 - 0.30000001) / (0 + 1e-6) = -0.0119 on every row.
    scores, groups, mask = torch.full((8,), 0.3), torch.zeros(8, dtype=torch.long), torch.ones(8, 2)
    assert (scores.sum() / 8).item() != torch.tensor(0.3).item()  # the ulp this test is about
    for op in (grpo_advantage, rloo_advantage, reinforce_pp_baseline_advantage):
        assert torch.equal(op(scores, groups, mask).advantages, torch.zeros(8, 2)), op.__name__


@settings(max_examples=80, deadline=None)
@given(values=st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=1, max_size=5),
       size=st.integers(2, 16), norm_by_std=st.booleans())
def test_groups_of_equal_scores_get_exactly_zero(values, size, norm_by_std):
    # Any float32 score repeated over a group: the advantage is exactly 0 (not an ulp over eps).
    scores = torch.tensor(values, dtype=torch.float32).repeat_interleave(size)
    groups = torch.arange(len(values)).repeat_interleave(size)
    mask = torch.ones(len(scores), 2)
    assert torch.equal(grpo_advantage(scores, groups, mask, norm_by_std=norm_by_std).advantages, torch.zeros_like(mask))
    assert torch.equal(rloo_advantage(scores, groups, mask).advantages, torch.zeros_like(mask))


def test_rloo_hand_worked():
    # A_i = s_i - mean of the others.
    # Group 7: 1 - (0+0)/2 = 1;  0 - (1+0)/2 = -0.5 (twice).   Check: n/(n-1)(s - mean) = 1.5 * 2/3 = 1.
    # Group 3: 1 - 2 = -1;  2 - 1 = 1.   Group 9 (alone): 0.
    adv = rloo_advantage(SCORES, GROUPS, MASK).advantages
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -0.5, -0.5, -1.0, 1.0, 0.0]))


def test_reinforce_pp_baseline_hand_worked():
    # Group 0: scores [1, 3], mean 2 -> centred [-1, 1]; group 1 alone -> 0.
    # Tokens (valid only): row0 [-1, -1], row1 [1], row2 [0, 0]: mean -0.2,
    #   deviations [-0.8, -0.8, 1.2, 0.2, 0.2], unbiased var = 2.8 / 4 = 0.7, std = 0.83666
    #   whitened: -0.8/0.83666 = -0.95618, 1.2/0.83666 = 1.43427, 0.2/0.83666 = 0.23905
    scores = torch.tensor([1.0, 3.0, 2.0])
    groups = torch.tensor([0, 0, 1])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    adv = reinforce_pp_baseline_advantage(scores, groups, mask).advantages
    expected = torch.tensor([[-0.95618, -0.95618], [1.43427, 0.0], [0.23905, 0.23905]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


@st.composite
def grouped_scores(draw):
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    labels = draw(st.lists(st.integers(-50, 50), min_size=len(sizes), max_size=len(sizes), unique=True))
    # Scores on a grid of quarters keep sums exact in float32.
    quarter = st.integers(-16, 16).map(lambda k: k / 4)
    scores, groups = [], []
    for label, size in zip(labels, sizes):
        scores += draw(st.lists(quarter, min_size=size, max_size=size))
        groups += [label] * size
    order = draw(st.permutations(range(len(scores))))  # groups interleaved in the batch
    return torch.tensor([scores[i] for i in order]), torch.tensor([groups[i] for i in order])


@settings(max_examples=80, deadline=None)
@given(batch=grouped_scores(), norm_by_std=st.booleans())
def test_grpo_advantages_sum_to_zero_within_each_group(batch, norm_by_std):
    scores, groups = batch
    mask = torch.ones(len(scores), 2)
    adv = grpo_advantage(scores, groups, mask, norm_by_std=norm_by_std).advantages[:, 0]
    for label in groups.unique():
        assert abs(adv[groups == label].sum().item()) < 1e-4


@settings(max_examples=80, deadline=None)
@given(batch=grouped_scores(), norm_by_std=st.booleans(), shift=st.integers(-20, 20).map(lambda k: k / 4), data=st.data())
def test_grpo_unchanged_by_constant_added_to_a_group(batch, norm_by_std, shift, data):
    scores, groups = batch
    mask = torch.ones(len(scores), 3)
    target = data.draw(st.sampled_from(groups.unique().tolist()))
    shifted = torch.where(groups == target, scores + shift, scores)
    before = grpo_advantage(scores, groups, mask, norm_by_std=norm_by_std).advantages
    after = grpo_advantage(shifted, groups, mask, norm_by_std=norm_by_std).advantages
    torch.testing.assert_close(after, before, atol=1e-4, rtol=0)


@settings(max_examples=60, deadline=None)
@given(batch=grouped_scores())
def test_rloo_matches_leave_one_out_loop(batch):
    scores, groups = batch
    adv = rloo_advantage(scores, groups, torch.ones(len(scores), 1)).advantages[:, 0]
    for i in range(len(scores)):
        others = [scores[j].item() for j in range(len(scores)) if j != i and groups[j] == groups[i]]
        expected = scores[i].item() - sum(others) / len(others) if others else 0.0
        assert math.isclose(adv[i].item(), expected, abs_tol=1e-5)


@settings(max_examples=60, deadline=None)
@given(batch=grouped_scores(), data=st.data())
def test_group_advantages_zero_at_padding_and_equal_across_valid_tokens(batch, data):
    scores, groups = batch
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=len(scores), max_size=len(scores))))
    for op in (grpo_advantage, rloo_advantage):
        adv = op(scores, groups, mask.float()).advantages
        assert torch.all(adv[~mask] == 0)
        for row in range(len(scores)):
            valid_values = adv[row][mask[row]]
            assert torch.all(valid_values == valid_values[:1])  # one value per response, on every valid token


def test_group_ops_reject_wrong_score_shape():
    with pytest.raises(ValueError, match="one entry per response"):
        grpo_advantage(torch.zeros(3), torch.zeros(2, dtype=torch.int64), torch.ones(2, 4))


def test_group_ops_do_not_mutate_inputs():
    scores, groups, mask = SCORES.clone(), GROUPS.clone(), MASK.clone()
    for op in (grpo_advantage, rloo_advantage, reinforce_pp_baseline_advantage):
        op(scores, groups, mask)
    assert torch.equal(scores, SCORES) and torch.equal(groups, GROUPS) and torch.equal(mask, MASK)
