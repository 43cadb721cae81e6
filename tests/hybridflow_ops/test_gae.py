"""GAE: a hand-worked case, a slow reference loop, and padding / gamma=lam=1 properties."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import gae

NAN = float("nan")


def test_gae_hand_worked_with_trailing_and_inner_padding():
    # gamma = 0.9, lam = 0.5, so gamma * lam = 0.45.
    # Row 0: valid t = 0, 1; t = 2 is padding (garbage 7 / nan there).
    #   t=1 (last valid, next value 0): delta = 1 + 0.9*0 - 0.2 = 0.8            A1 = 0.8
    #   t=0: delta = 0 + 0.9*0.2 - 0.5 = -0.32;  A0 = -0.32 + 0.45*0.8 = 0.04
    #   returns = A + V = [0.54, 1.0, 0 (pad)]
    # Row 1: valid t = 0, 2; t = 1 is padding and must be skipped.
    #   t=2: delta = 2 + 0 - 1.0 = 1.0                                          A2 = 1.0
    #   t=0: next valid is t=2: delta = 1 + 0.9*1.0 - 0.4 = 1.5;  A0 = 1.5 + 0.45*1.0 = 1.95
    #   returns = [2.35, 0 (pad), 2.0]
    rewards = torch.tensor([[0.0, 1.0, 7.0], [1.0, NAN, 2.0]])
    values = torch.tensor([[0.5, 0.2, NAN], [0.4, NAN, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    out = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.04, 0.8, 0.0], [1.95, 0.0, 1.0]]))
    torch.testing.assert_close(out.returns, torch.tensor([[0.54, 1.0, 0.0], [2.35, 0.0, 2.0]]))


def slow_gae(rewards, values, mask, gamma, lam):
    """Reference: plain Python loops over batch and time, padding skipped."""
    b, r = len(rewards), len(rewards[0])
    adv = [[0.0] * r for _ in range(b)]
    for i in range(b):
        valid_t = [t for t in range(r) if mask[i][t]]
        running, next_value = 0.0, 0.0
        for t in reversed(valid_t):
            delta = rewards[i][t] + gamma * next_value - values[i][t]
            running = delta + gamma * lam * running
            adv[i][t] = running
            next_value = values[i][t]
    ret = [[adv[i][t] + values[i][t] if mask[i][t] else 0.0 for t in range(r)] for i in range(b)]
    return adv, ret


@st.composite
def token_batch(draw, max_b=4, max_r=7):
    b = draw(st.integers(1, max_b))
    r = draw(st.integers(1, max_r))
    floats = st.floats(-5, 5, allow_nan=False, width=32)
    rewards = draw(st.lists(st.lists(floats, min_size=r, max_size=r), min_size=b, max_size=b))
    values = draw(st.lists(st.lists(floats, min_size=r, max_size=r), min_size=b, max_size=b))
    mask = draw(st.lists(st.lists(st.booleans(), min_size=r, max_size=r), min_size=b, max_size=b))
    return rewards, values, mask


@settings(max_examples=80, deadline=None)
@given(batch=token_batch(), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0))
def test_gae_matches_slow_reference_loop(batch, gamma, lam):
    rewards, values, mask = batch
    expected_adv, expected_ret = slow_gae(rewards, values, mask, gamma, lam)
    out = gae(torch.tensor(rewards, dtype=torch.float64), torch.tensor(values, dtype=torch.float64),
              torch.tensor(mask, dtype=torch.float64), gamma=gamma, lam=lam)
    torch.testing.assert_close(out.advantages, torch.tensor(expected_adv, dtype=torch.float64))
    torch.testing.assert_close(out.returns, torch.tensor(expected_ret, dtype=torch.float64))


@settings(max_examples=80, deadline=None)
@given(batch=token_batch())
def test_gae_with_gamma_lam_one_is_reward_to_go_minus_value(batch):
    rewards, values, mask = batch
    rw, vl, mk = (torch.tensor(x, dtype=torch.float64) for x in (rewards, values, mask))
    out = gae(rw, vl, mk, gamma=1.0, lam=1.0)
    # Reward-to-go over valid tokens: reverse cumulative sum of the masked rewards.
    to_go = (rw * mk).flip(-1).cumsum(-1).flip(-1)
    expected = (to_go - vl) * mk
    torch.testing.assert_close(out.advantages, expected)
    torch.testing.assert_close(out.returns, to_go * mk)


@settings(max_examples=60, deadline=None)
@given(batch=token_batch(), data=st.data())
def test_gae_ignores_inserted_padding_with_garbage(batch, data):
    rewards, values, mask = (torch.tensor(x, dtype=torch.float64) for x in batch)
    base = gae(rewards, values, mask, gamma=0.97, lam=0.9)
    # Insert masked columns at random places, holding nan / inf / huge values.
    positions = data.draw(st.lists(st.integers(0, rewards.shape[1]), min_size=1, max_size=4))
    garbage = data.draw(st.sampled_from([NAN, math.inf, -math.inf, 1e30]))
    keep = list(range(rewards.shape[1]))
    for p in sorted(positions, reverse=True):
        keep.insert(p, -1)
    index = torch.tensor([k if k >= 0 else 0 for k in keep])
    is_new = torch.tensor([k < 0 for k in keep])

    def widen(x, fill):
        return torch.where(is_new, torch.full_like(x[:, index], fill), x[:, index])

    out = gae(widen(rewards, garbage), widen(values, garbage), widen(mask, 0.0), gamma=0.97, lam=0.9)
    torch.testing.assert_close(out.advantages[:, ~is_new], base.advantages)
    torch.testing.assert_close(out.returns[:, ~is_new], base.returns)
    assert torch.all(out.advantages[:, is_new] == 0) and torch.all(out.returns[:, is_new] == 0)


def test_gae_does_not_mutate_inputs():
    torch.manual_seed(0)
    rewards, values = torch.randn(3, 5), torch.randn(3, 5)
    mask = (torch.rand(3, 5) > 0.3).float()
    copies = [t.clone() for t in (rewards, values, mask)]
    gae(rewards, values, mask, gamma=0.9, lam=0.8)
    for original, copy in zip((rewards, values, mask), copies):
        assert torch.equal(original, copy)


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="values of shape"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
