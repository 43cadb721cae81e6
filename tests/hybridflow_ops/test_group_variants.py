"""GPG, OPO and pass@k advantages: hand-worked values, brute-force references and reductions to GRPO."""
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import gpg_advantage, grpo_advantage, opo_advantage, passk_advantage

F64 = torch.float64


def test_gpg_advantage_hand_worked():
    # Groups {1, 0}, {1, 1}, {0.5}: B = 5; only group 0 carries a signal, M = 3, alpha = 5 / 2 = 2.5.
    # A = 2.5 * (s - 0.5) = [1.25, -1.25] in group 0, 0 elsewhere (last token of response 0 is padding).
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5], dtype=F64)
    index = torch.tensor([0, 0, 1, 1, 2])
    mask = torch.tensor([[1.0, 0.0]] + [[1.0, 1.0]] * 4, dtype=F64)
    adv = gpg_advantage(scores, index, mask).advantages
    torch.testing.assert_close(adv, torch.tensor([[1.25, 0.0], [-1.25, -1.25], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=F64))
    # With norm_by_std: group 0's unbiased std is sqrt(0.5) = 0.707107 -> 2.5 * 0.5 / 0.707108 = 1.767765
    adv = gpg_advantage(scores, index, mask, norm_by_std=True).advantages
    torch.testing.assert_close(adv[0, 0], torch.tensor(1.767765, dtype=F64), atol=1e-5, rtol=0)


def test_gpg_advantage_without_uninformative_groups_is_dr_grpo():
    scores = torch.tensor([1.0, 0.0, 0.3, 0.9], dtype=F64)
    index, mask = torch.tensor([0, 0, 1, 1]), torch.ones(4, 3, dtype=F64)
    torch.testing.assert_close(gpg_advantage(scores, index, mask).advantages,
                               grpo_advantage(scores, index, mask, norm_by_std=False).advantages)


def test_opo_advantage_hand_worked():
    # Group 0: scores [1, 0, 0], lengths [1, 3, 2]: b = (1 * 1) / 6 = 1/6, A = [5/6, -1/6, -1/6]. Group 1: one response -> 0.
    scores = torch.tensor([1.0, 0.0, 0.0, 0.7], dtype=F64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=F64)
    adv = opo_advantage(scores, torch.tensor([3, 3, 3, 8]), mask).advantages
    expected = torch.tensor([[5 / 6, 0, 0], [-1 / 6] * 3, [-1 / 6, -1 / 6, 0], [0, 0, 0]], dtype=F64)
    torch.testing.assert_close(adv, expected)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.integers(1, 5))
def test_opo_with_equal_lengths_is_the_group_mean_baseline(seed, length):
    gen = torch.Generator().manual_seed(seed)
    scores, index = torch.rand(6, generator=gen, dtype=F64), torch.tensor([0, 0, 0, 1, 1, 1])
    mask = torch.zeros(6, 6, dtype=F64)
    mask[:, :length] = 1.0
    torch.testing.assert_close(opo_advantage(scores, index, mask).advantages,
                               grpo_advantage(scores, index, mask, norm_by_std=False).advantages)


def test_passk_advantage_hand_worked():
    # N = 4, one success, k = 2: R = 1 - C(3,2)/C(4,2) = 0.5, sigma = 0.5;
    # A_pos = (1 - 0.5) / 0.5 = 1;  A_neg = (1 - 0.5 - C(2,1)/C(3,1)) / 0.5 = (0.5 - 2/3) / 0.5 = -1/3.
    adv = passk_advantage(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64), torch.zeros(4, dtype=torch.long),
                          torch.ones(4, 1, dtype=F64), k=2).advantages
    torch.testing.assert_close(adv, torch.tensor([[1.0], [-1 / 3], [-1 / 3], [-1 / 3]], dtype=F64))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 7), data=st.data())
def test_passk_advantage_equals_the_k_subset_expectation(n, data):
    k = data.draw(st.integers(1, n))
    scores = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)), dtype=F64)
    subsets = list(itertools.combinations(range(n), k))
    mean_pass = sum(max(scores[list(s)]).item() for s in subsets) / len(subsets)
    sigma = math.sqrt(mean_pass * (1 - mean_pass))
    expected = []
    for i in range(n):
        with_i = [s for s in subsets if i in s]
        share = sum(max(scores[list(s)]).item() for s in with_i) / len(with_i)
        expected.append((share - mean_pass) / sigma if sigma > 0 else 0.0)
    adv = passk_advantage(scores, torch.zeros(n, dtype=torch.long), torch.ones(n, 1, dtype=F64), k=k).advantages
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected, dtype=F64))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_pass_at_1_is_grpo_with_the_biased_std(data):
    scores = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=6, max_size=6)), dtype=F64)
    index = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = passk_advantage(scores, index, torch.ones(6, 1, dtype=F64), k=1).advantages[:, 0]
    groups = scores.view(2, 3)
    std = groups.std(dim=1, unbiased=False, keepdim=True)
    expected = torch.where(std > 0, (groups - groups.mean(1, keepdim=True)) / std.clamp(min=1e-12), torch.zeros_like(groups))
    torch.testing.assert_close(adv, expected.flatten())


def test_passk_advantage_rejects_non_binary_scores_and_small_groups():
    mask = torch.ones(4, 1)
    with pytest.raises(ValueError, match="binary"):
        passk_advantage(torch.tensor([0.5, 1.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long), mask, k=2)
    with pytest.raises(ValueError, match="at least k = 4"):
        passk_advantage(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), mask, k=4)
    # A group of one gets 0 and does not trip the size check.
    adv = passk_advantage(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 1, 1, 1]), mask, k=2).advantages
    assert adv[0, 0].item() == 0.0
