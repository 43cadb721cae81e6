"""REINFORCE, GPG, CISPO and GMPO: hand-worked values and the properties their papers state."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import cispo, gmpo, gpg, ppo_clip, reinforce

NAN = float("nan")
F64 = torch.float64


def test_reinforce_and_gpg_hand_worked():
    # l = -A log pi:  row 0: -1 * ln 0.5 = 0.693147, -1 * ln 0.25 = 1.386294;  row 1: 2 * ln 0.8 = -0.446287
    # REINFORCE, seq-mean-token-sum: (2.079442 - 0.446287) / 2 = 0.816577;  grad -A / 2
    # GPG, token-mean:               (2.079442 - 0.446287) / 3 = 0.544385;  grad -A / 3
    lp = torch.log(torch.tensor([[0.5, 0.25, 1.0], [0.8, 1.0, 1.0]], dtype=F64))
    lp[0, 2] = lp[1, 1] = lp[1, 2] = NAN
    adv = torch.tensor([[1.0, 1.0, NAN], [-2.0, NAN, NAN]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=F64)
    for fn, value, n in ((reinforce, 0.816577, 2), (gpg, 0.544385, 3)):
        log_probs = lp.clone().requires_grad_(True)
        out = fn(log_probs, adv, mask)
        torch.testing.assert_close(out.loss, torch.tensor(value, dtype=F64), atol=1e-6, rtol=0)
        out.loss.backward()
        torch.testing.assert_close(log_probs.grad, torch.tensor([[-1.0, -1.0, 0.0], [2.0, 0.0, 0.0]], dtype=F64) / n)


def test_gpg_is_reinforce_with_token_mean():
    torch.manual_seed(0)
    lp, adv, mask = -torch.rand(3, 5), torch.randn(3, 5), (torch.rand(3, 5) > 0.3).float()
    torch.testing.assert_close(gpg(lp, adv, mask).loss, reinforce(lp, adv, mask, loss_agg_mode="token-mean").loss)


def test_cispo_hand_worked():
    # old = 0 so r = exp(log_probs) = [1.5, 0.5, 1.1]; defaults: no lower bound, upper 1 + 0.28.
    # w = sg[min(r, 1.28)] = [1.28, 0.5, 1.1];  A = [1, -1, 2]
    # l = -w A log pi: -1.28 * ln 1.5 = -0.518995; -0.5 * -1 * ln 0.5 = -0.346574; -1.1 * 2 * ln 1.1 = -0.209682
    # token-mean = -1.075251 / 3 = -0.358417;  grad = -w A / 3 = [-0.426667, 0.166667, -0.733333]
    # PPO would give token 0 (r > 1 + eps, A > 0) zero gradient; CISPO keeps it, weighted by the clipped ratio.
    log_probs = torch.log(torch.tensor([[1.5, 0.5, 1.1]], dtype=F64)).requires_grad_(True)
    out = cispo(log_probs, torch.zeros(1, 3, dtype=F64), torch.tensor([[1.0, -1.0, 2.0]], dtype=F64), torch.ones(1, 3, dtype=F64))
    torch.testing.assert_close(out.loss, torch.tensor(-0.358417, dtype=F64), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.pg_clipfrac, torch.tensor(1 / 3, dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-1.28, 0.5, -2.2]], dtype=F64) / 3)
    with pytest.raises(ValueError, match="clip_low"):
        cispo(log_probs, log_probs, log_probs, torch.ones(1, 3), clip_low=1.5)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), clip_low=st.floats(0.0, 1.0), clip_high=st.floats(0.0, 0.5))
def test_cispo_gradient_is_clipped_weight_times_reinforce_gradient_on_every_token(seed, clip_low, clip_high):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 4, generator=gen, dtype=F64) * 3
    new = (old + torch.randn(3, 4, generator=gen, dtype=F64)).requires_grad_(True)
    adv = torch.randn(3, 4, generator=gen, dtype=F64)
    mask = (torch.rand(3, 4, generator=gen) > 0.3).to(F64)
    cispo(new, old, adv, mask, clip_low=clip_low, clip_high=clip_high).loss.backward()
    weight = torch.exp(new.detach() - old).clamp(1 - clip_low, 1 + clip_high)
    expected = torch.where(mask.bool(), -weight * adv / mask.sum().clamp(min=1), torch.zeros_like(adv))
    torch.testing.assert_close(new.grad, expected)


def test_gmpo_hand_worked():
    # Log-space clip range [-0.4, 0.4].
    # Seq 0: x = [0.5, -0.1], A = 1 (> 0: c = min(x, clip x)) -> c = [0.4, -0.1], mean 0.15, L0 = -e^0.15 = -1.161834
    # Seq 1: x = [-0.6, 0.2] (+ pad), A = -2 (< 0: c = max(x, clip x)) -> c = [-0.4, 0.2], mean -0.1, L1 = 2 e^-0.1 = 1.809675
    # seq-mean-token-mean = (L0 + L1) / 2 = 0.323920;  clipfrac = 2 / 4
    # grad: dL_i/dx_t = -A_i e^{mean} / |o_i| on unclipped tokens, 0 on clipped ones; then / 2 sequences:
    #   seq 0 token 1: -1.161834 / 2 / 2 = -0.290459;  seq 1 token 1: 1.809675 / 2 / 2 = 0.452419
    log_probs = torch.tensor([[0.5, -0.1, NAN], [-0.6, 0.2, NAN]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, NAN], [-2.0, -2.0, NAN]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=F64)
    out = gmpo(log_probs, torch.zeros(2, 3, dtype=F64), adv, mask)
    torch.testing.assert_close(out.loss, torch.tensor(0.323920, dtype=F64), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.pg_clipfrac, torch.tensor(0.5, dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[0.0, -0.290459, 0.0], [0.0, 0.452419, 0.0]], dtype=F64),
                               atol=1e-6, rtol=0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), a=st.floats(-3, 3).filter(lambda v: abs(v) > 1e-3))
def test_gmpo_inside_the_clip_range_is_the_geometric_mean_of_the_ratios(seed, a):
    # Within [-0.4, 0.4] nothing is clipped: L = -A (prod_t r_t)^(1/n), value and gradient.
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(1, 5, generator=gen, dtype=F64) - 0.5) * 0.7
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 1.0]], dtype=F64)
    lp, ref = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = gmpo(lp, torch.zeros_like(x), torch.full_like(x, a), mask)
    ratios = torch.exp(ref[mask.bool()])
    expected = -a * ratios.prod() ** (1 / 4)
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    expected.backward()
    torch.testing.assert_close(lp.grad, torch.where(mask.bool(), ref.grad, torch.zeros_like(x)))


def test_gmpo_one_token_sequences_equal_ppo_clip_with_log_space_bounds():
    # |o| = 1: the geometric mean is the ratio itself, so GMPO is PPO's clip with range [e^-0.4, e^0.4].
    torch.manual_seed(1)
    x = torch.randn(6, 1, dtype=F64) * 0.6
    adv, mask = torch.randn(6, 1, dtype=F64), torch.ones(6, 1, dtype=F64)
    lo, hi = 1 - math.exp(-0.4), math.exp(0.4) - 1
    torch.testing.assert_close(gmpo(x, torch.zeros_like(x), adv, mask).loss,
                               ppo_clip(x, torch.zeros_like(x), adv, mask, clip_low=lo, clip_high=hi, loss_agg_mode="seq-mean-token-mean").loss)
