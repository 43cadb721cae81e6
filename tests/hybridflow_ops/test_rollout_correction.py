"""Rollout correction: sequence-level IS, IcePop, batch-normalised IS weights, sequence rejection."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import icepop_is_weight, normalize_is_weight, sequence_is_weight, sequence_rejection_mask

NAN = float("nan")
F64 = torch.float64
# Row 0: log k = [0.2, 0.3] -> sum 0.5, mean 0.25.  Row 1: log k = [1.0, -0.2, 0.5] -> sum 1.3, mean 0.433333.
# Row 2: log k = [-2.0] (+ padding).
OLD = [[-1.0, -1.0, NAN], [-0.5, -2.0, -1.0], [-3.0, NAN, NAN]]
ROLLOUT = [[-1.2, -1.3, 0.0], [-1.5, -1.8, -1.5], [-1.0, 0.0, 0.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]


def _pair():
    return torch.tensor(OLD, dtype=F64), torch.tensor(ROLLOUT, dtype=F64), torch.tensor(MASK, dtype=F64)


def test_sequence_is_weight_hand_worked():
    # w = min(exp(sum log k), 2): e^0.5 = 1.648721; e^1.3 = 3.669297 -> 2; e^-2 = 0.135335
    old, rollout, mask = _pair()
    w = sequence_is_weight(old.requires_grad_(True), rollout, mask, cap=2.0).is_weights
    expected = torch.tensor([[math.exp(0.5)] * 2 + [0.0], [2.0] * 3, [math.exp(-2.0), 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(w, expected)
    assert not w.requires_grad


def test_icepop_is_weight_hand_worked():
    # k = [e^0.2, e^0.3 | e^1, e^-0.2, e^0.5 | e^-2] = [1.2214, 1.3499 | 2.7183, 0.8187, 1.6487 | 0.1353]
    # bounds [0.5, 2]: row 1 token 0 (2.718 > 2) and row 2 token 0 (0.135 < 0.5) are masked.
    old, rollout, mask = _pair()
    w = icepop_is_weight(old, rollout, mask, low=0.5, high=2.0).is_weights
    k = torch.exp(torch.tensor([[0.2, 0.3, 0.0], [1.0, -0.2, 0.5], [-2.0, 0.0, 0.0]], dtype=F64))
    keep = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(w, torch.where(keep, k, torch.zeros_like(k)))
    only_mask = icepop_is_weight(old, rollout, mask, low=0.5, high=2.0, keep_ratio=False).is_weights
    torch.testing.assert_close(only_mask, keep.to(F64))
    with pytest.raises(ValueError, match="low <= 1 <= high"):
        icepop_is_weight(old, rollout, mask, low=1.5)


def test_normalize_is_weight_hand_worked():
    # Weights [2, 4 | 1, 1, 1 | 3] (+ padding holding garbage).
    # token:    mean over 6 valid tokens = 12 / 6 = 2              -> [1, 2 | .5, .5, .5 | 1.5]
    # sequence: per-sequence means [3, 1, 3], their mean = 7 / 3   -> w * 3 / 7
    w = torch.tensor([[2.0, 4.0, NAN], [1.0, 1.0, 1.0], [3.0, math.inf, 0.0]], dtype=F64)
    mask = torch.tensor(MASK, dtype=F64)
    token = normalize_is_weight(w, mask).is_weights
    torch.testing.assert_close(token, torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.5, 0.5], [1.5, 0.0, 0.0]], dtype=F64))
    seq = normalize_is_weight(w, mask, level="sequence").is_weights
    torch.testing.assert_close(seq, torch.tensor([[6 / 7, 12 / 7, 0.0], [3 / 7] * 3, [9 / 7, 0.0, 0.0]], dtype=F64))
    # Nothing valid: returned unchanged (0 at padding), not nan.
    assert torch.equal(normalize_is_weight(w, torch.zeros_like(mask)).is_weights, torch.zeros_like(w))


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), level=st.sampled_from(["token", "sequence"]), scale=st.floats(0.01, 100.0))
def test_normalized_weights_average_to_one_and_ignore_the_scale(seed, level, scale):
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(4, 5, generator=gen, dtype=F64) * 3 + 0.01
    mask = (torch.rand(4, 5, generator=gen) > 0.3).to(F64)
    mask[0, 0] = 1.0
    out = normalize_is_weight(w, mask, level=level).is_weights
    valid = mask.bool()
    if level == "token":
        torch.testing.assert_close(out[valid].mean(), torch.tensor(1.0, dtype=F64))
    else:
        per_seq = torch.stack([out[i][valid[i]].mean() for i in range(4) if valid[i].any()])
        torch.testing.assert_close(per_seq.mean(), torch.tensor(1.0, dtype=F64))
    torch.testing.assert_close(normalize_is_weight(scale * w, mask, level=level).is_weights, out)


def test_sequence_rejection_mask_hand_worked():
    # geometric mean rho = [e^0.25, e^0.433333, e^-2] = [1.284, 1.542, 0.135]; bounds [0.5, 1.5]:
    # rows 1 and 2 are rejected. product rho = [e^0.5, e^1.3, e^-2] = [1.649, 3.669, 0.135]: with
    # bounds [0.1, 2] only row 1 is.
    old, rollout, mask = _pair()
    out = sequence_rejection_mask(old, rollout, mask, low=0.5, high=1.5)
    torch.testing.assert_close(out.response_mask, torch.tensor([[1.0, 1.0, 0.0], [0.0] * 3, [0.0] * 3], dtype=F64))
    torch.testing.assert_close(out.rejected_frac, torch.tensor(2 / 3, dtype=F64))
    out = sequence_rejection_mask(old, rollout, mask, low=0.1, high=2.0, statistic="product")
    torch.testing.assert_close(out.response_mask, torch.tensor([[1.0, 1.0, 0.0], [0.0] * 3, [1.0, 0.0, 0.0]], dtype=F64))
    with pytest.raises(ValueError, match="geometric_mean, product"):
        sequence_rejection_mask(old, rollout, mask, statistic="max")


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_on_policy_rollouts_are_neither_reweighted_nor_rejected(seed):
    # mu = pi_old: every ratio is 1, so weights are 1 on valid tokens and nothing is rejected.
    gen = torch.Generator().manual_seed(seed)
    lp = -torch.rand(3, 4, generator=gen, dtype=F64) * 5
    mask = (torch.rand(3, 4, generator=gen) > 0.3).to(F64)
    for weight in (sequence_is_weight(lp, lp, mask), icepop_is_weight(lp, lp, mask)):
        torch.testing.assert_close(weight.is_weights, mask)
    assert torch.equal(sequence_rejection_mask(lp, lp, mask, low=1.0, high=1.0).response_mask, mask)
