"""REINFORCE++ and ReMax: hand-worked cases and a return-to-go reference loop."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import reinforce_pp_advantage, remax_advantage
from hybridflow_ops.advantages import discounted_returns

NAN = float("nan")


def test_reinforce_pp_hand_worked():
    # gamma = 0.5. Row 0 all valid: G2 = 1, G1 = 0 + 0.5*1 = 0.5, G0 = 0 + 0.5*0.5 = 0.25.
    # Row 1, t = 1 padding (skipped): G2 = 1, G0 = 0.5 + 0.5*1 = 1.0.
    # Whitening over valid returns {0.25, 0.5, 1, 1, 1}: mean 0.75,
    #   deviations [-0.5, -0.25, 0.25, 0.25, 0.25], unbiased var = 0.5 / 4 = 0.125, std = 0.35355
    #   A = [-1.41421, -0.70711, 0.70711 | 0.70711, 0 (pad), 0.70711]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, NAN, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    out = reinforce_pp_advantage(rewards, mask, gamma=0.5)
    torch.testing.assert_close(out.returns, torch.tensor([[0.25, 0.5, 1.0], [1.0, 0.0, 1.0]]))
    expected = torch.tensor([[-1.41421, -0.70711, 0.70711], [0.70711, 0.0, 0.70711]])
    torch.testing.assert_close(out.advantages, expected, atol=1e-4, rtol=0)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(), b=st.integers(1, 4), r=st.integers(1, 6), gamma=st.floats(0.0, 1.0),
)
def test_discounted_returns_match_slow_loop(data, b, r, gamma):
    rewards = data.draw(st.lists(st.lists(st.floats(-3, 3), min_size=r, max_size=r), min_size=b, max_size=b))
    mask = data.draw(st.lists(st.lists(st.booleans(), min_size=r, max_size=r), min_size=b, max_size=b))
    expected = [[0.0] * r for _ in range(b)]
    for i in range(b):
        running = 0.0
        for t in reversed(range(r)):
            if mask[i][t]:  # padding is skipped: it neither adds nor discounts
                running = rewards[i][t] + gamma * running
                expected[i][t] = running
    got = discounted_returns(torch.tensor(rewards, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64), gamma=gamma)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))


def test_reinforce_pp_advantages_are_whitened_over_valid_tokens():
    torch.manual_seed(1)
    rewards = torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.3).float()
    mask[:, 0] = 1
    adv = reinforce_pp_advantage(rewards, mask, gamma=0.9).advantages
    valid = adv[mask.bool()]
    assert abs(valid.mean().item()) < 1e-5 and abs(valid.std().item() - 1.0) < 1e-4


def test_remax_hand_worked():
    # A = score - greedy score on valid tokens: row 0: 1 - 0.25 = 0.75; row 1: 0.5 - 1 = -0.5.
    scores, baseline = torch.tensor([1.0, 0.5]), torch.tensor([0.25, 1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = remax_advantage(scores, baseline, mask)
    expected = torch.tensor([[0.75, 0.75, 0.0], [-0.5, 0.0, 0.0]])
    torch.testing.assert_close(out.advantages, expected)
    torch.testing.assert_close(out.returns, expected)
    assert scores.tolist() == [1.0, 0.5] and baseline.tolist() == [0.25, 1.0]
