"""KL estimators, the `kl` op, KL-in-reward shaping and score placement."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import kl_in_reward, kl_penalty, masked_kl, score_to_token_rewards

NAN = float("nan")
LN2 = math.log(2.0)


def test_estimators_hand_worked():
    # Token 0: p = 0.5, q = 0.25 -> x = log p - log q = ln 2 = 0.693147
    #   k1 = 0.693147; abs = 0.693147; k2 = 0.5 * 0.480453 = 0.240227; k3 = e^-x + x - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # Token 1: p = 0.25, q = 0.5 -> x = -ln 2
    #   k1 = -0.693147; abs = 0.693147; k2 = 0.240227; k3 = 2 - 0.693147 - 1 = 0.306853
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    logq = torch.log(torch.tensor([[0.25, 0.5]]))
    expected = {
        "k1": [LN2, -LN2], "kl": [LN2, -LN2], "abs": [LN2, LN2],
        "k2": [0.240227, 0.240227], "mse": [0.240227, 0.240227],
        "k3": [0.193147, 0.306853], "low_var_kl": [0.193147, 0.306853],
    }
    for kl_type, values in expected.items():
        torch.testing.assert_close(kl_penalty(logp, logq, kl_type=kl_type), torch.tensor([values]), atol=1e-6, rtol=0)


def test_k3_is_clamped():
    # x = -30: log q - log p = 30, clamped to 20 -> e^20 - 20 - 1 is huge -> clamped to 10.
    # x = +30: log q - log p = -30 -> -20 -> e^-20 + 20 - 1 = 19.000000002 -> clamped to 10.
    logp = torch.tensor([-30.0, 30.0])
    out = kl_penalty(logp, torch.zeros(2), kl_type="k3")
    assert out.tolist() == [10.0, 10.0]


def test_unknown_kl_type_names_valid_ones():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(torch.zeros(2), torch.zeros(2), kl_type="k4")


@settings(max_examples=100, deadline=None)
@given(x=st.lists(st.floats(-25, 25), min_size=1, max_size=20))
def test_k3_is_nonnegative(x):
    logp = torch.tensor(x)
    assert torch.all(kl_penalty(logp, torch.zeros_like(logp), kl_type="k3") >= 0)
    assert torch.all(kl_penalty(torch.zeros_like(logp), logp, kl_type="k3") >= 0)


@settings(max_examples=50, deadline=None)
@given(
    p_logits=st.lists(st.floats(-2, 2), min_size=2, max_size=6),
    q_shift=st.lists(st.floats(-2, 2), min_size=6, max_size=6),
    seed=st.integers(0, 2**31 - 1),
)
def test_k1_and_k3_sample_means_approach_true_kl(p_logits, q_shift, seed):
    # Sample tokens from p; E_p[k1] = E_p[k3] = KL(p || q) exactly.  With n samples the
    # sample mean has standard error sqrt(Var_p[k] / n); allow 5 standard errors.
    n = 20_000
    logp_all = torch.log_softmax(torch.tensor(p_logits, dtype=torch.float64), -1)
    logq_all = torch.log_softmax(logp_all + torch.tensor(q_shift[: len(p_logits)], dtype=torch.float64), -1)
    p = logp_all.exp()
    true_kl = (p * (logp_all - logq_all)).sum().item()
    tokens = torch.multinomial(p, n, replacement=True, generator=torch.Generator().manual_seed(seed))
    logp, logq = logp_all[tokens], logq_all[tokens]
    for kl_type in ("k1", "k3"):
        per_value = kl_penalty(logp_all, logq_all, kl_type=kl_type)
        variance = (p * (per_value - true_kl) ** 2).sum().item()
        tolerance = 5 * math.sqrt(variance / n) + 1e-9
        estimate = kl_penalty(logp, logq, kl_type=kl_type).mean().item()
        assert abs(estimate - true_kl) <= tolerance, (kl_type, estimate, true_kl, tolerance)


def test_kl_op_is_zero_at_padding_even_with_nan():
    old = torch.tensor([[-1.0, NAN]])
    ref = torch.tensor([[-1.5, -math.inf]])
    mask = torch.tensor([[1.0, 0.0]])
    # Valid token: x = -1 + 1.5 = 0.5, k3 = e^-0.5 + 0.5 - 1 = 0.106531; padding -> 0.
    out = masked_kl(old, ref, mask, kl_type="k3").kl
    torch.testing.assert_close(out, torch.tensor([[math.exp(-0.5) + 0.5 - 1, 0.0]]))


def test_score_to_token_rewards_last_valid_token():
    # Row 0: last valid t = 1; row 1: inner padding, last valid t = 2; row 2: no valid token -> all 0.
    scores = torch.tensor([3.0, -1.0, 5.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    out = score_to_token_rewards(scores, mask).token_rewards
    assert out.tolist() == [[0.0, 3.0, 0.0], [0.0, 0.0, -1.0], [0.0, 0.0, 0.0]]


def test_kl_in_reward_hand_worked():
    # kl_coef = 0.1, k1 = old - ref.
    # Row 0: k1 = [-1+1.5, -2+2, -3+2] = [0.5, 0, -1]; rewards = [-0.05, 0, 0.1 + 2 (score at last)] = [-0.05, 0, 2.1]
    # Row 1: only t = 0 valid: k1 = 0.5; rewards = [-0.05 + (-1), 0, 0] = [-1.05, 0, 0]
    scores = torch.tensor([2.0, -1.0])
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, NAN, 7.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-1.0, 0.0, NAN]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    out = kl_in_reward(scores, old, ref, mask, kl_coef=0.1, kl_type="k1")
    torch.testing.assert_close(out.token_rewards, torch.tensor([[-0.05, 0.0, 2.1], [-1.05, 0.0, 0.0]]))
    torch.testing.assert_close(out.kl, torch.tensor([[0.5, 0.0, -1.0], [0.5, 0.0, 0.0]]))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), b=st.integers(1, 4), r=st.integers(1, 6), extra=st.integers(1, 4),
       kl_type=st.sampled_from(["k1", "abs", "k2", "k3"]))
def test_kl_in_reward_ignores_appended_padding(data, b, r, extra, kl_type):
    floats = st.floats(-5, 0, allow_nan=False)
    old = torch.tensor(data.draw(st.lists(st.lists(floats, min_size=r, max_size=r), min_size=b, max_size=b)))
    ref = torch.tensor(data.draw(st.lists(st.lists(floats, min_size=r, max_size=r), min_size=b, max_size=b)))
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=r, max_size=r), min_size=b, max_size=b))).float()
    scores = torch.tensor(data.draw(st.lists(st.floats(-3, 3), min_size=b, max_size=b)))
    base = kl_in_reward(scores, old, ref, mask, kl_coef=0.05, kl_type=kl_type).token_rewards
    pad = torch.full((b, extra), NAN)
    wide = kl_in_reward(scores, torch.cat([old, pad], 1), torch.cat([ref, -pad.abs()], 1),
                        torch.cat([mask, torch.zeros(b, extra)], 1), kl_coef=0.05, kl_type=kl_type).token_rewards
    torch.testing.assert_close(wide[:, :r], base)
    assert torch.all(wide[:, r:] == 0)


def test_straight_through_estimators_have_their_value_and_k2_gradient():
    # Token 0: x = ln 2: k1+ = 0.693147, k3+ = 0.193147, abs+ = 0.693147; token 1: x = -ln 2: -0.693147, 0.306853, 0.693147.
    # The gradient w.r.t. log p is k2's, d(0.5 x^2)/dx = x = [ln 2, -ln 2], whatever the estimator.
    logq = torch.log(torch.tensor([[0.25, 0.5]]))
    values = {"k1+": [LN2, -LN2], "kl+": [LN2, -LN2], "abs+": [LN2, LN2], "k3+": [0.193147, 0.306853], "low_var_kl+": [0.193147, 0.306853]}
    for kl_type, expected in values.items():
        logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_(True)
        out = kl_penalty(logp, logq, kl_type=kl_type)
        torch.testing.assert_close(out.detach(), torch.tensor([expected]), atol=1e-6, rtol=0)
        out.sum().backward()
        torch.testing.assert_close(logp.grad, torch.tensor([[LN2, -LN2]]), atol=1e-6, rtol=0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_k1_plus_loss_gradient_is_unbiased_for_the_kl_gradient(seed):
    # Exact expectation over a 4-token vocabulary: E_{y~p}[grad k1+(y)] = grad KL(p || q), while E_p[grad k1] = 0.
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_(True)
    logq = torch.log_softmax(torch.randn(4, generator=gen, dtype=torch.float64), -1)
    logp = torch.log_softmax(logits, -1)
    p = logp.exp().detach()
    (true_grad,) = torch.autograd.grad((logp.exp() * (logp - logq)).sum(), logits, retain_graph=True)
    for kl_type, expected in (("k1+", true_grad), ("k1", torch.zeros(4, dtype=torch.float64))):
        (grad,) = torch.autograd.grad((p * kl_penalty(logp, logq, kl_type=kl_type)).sum(), logits, retain_graph=True)
        torch.testing.assert_close(grad, expected)
