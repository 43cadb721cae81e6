"""Clip-Cov, KL-Cov, SAPO and DPPO (TV / KL): hand-worked values and the properties their papers state."""
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import clip_cov, dppo_kl, dppo_tv, kl_cov, ppo_clip, sapo
from hybridflow_ops.losses import binary_kl, token_covariance

F64 = torch.float64
# One row, four tokens, on-policy (r = 1). mean logp = -2, mean A = 0, so
# cov = (logp + 2) * A = [1 * 3, -1 * 1, 0 * -2, 0 * -2] = [3, -1, 0, 0].
LOGP = [[-1.0, -3.0, -2.0, -2.0]]
ADV = [[3.0, 1.0, -2.0, -2.0]]


def test_token_covariance_hand_worked():
    cov = token_covariance(torch.tensor(LOGP), torch.tensor(ADV), torch.ones(1, 4, dtype=torch.bool))
    torch.testing.assert_close(cov, torch.tensor([[3.0, -1.0, 0.0, 0.0]]))


def test_clip_cov_hand_worked():
    # Candidates: cov in (1, 5) and not PPO-clipped -> token 0 only; n = max(1, floor(2e-4 * 4)) = 1.
    # Token 0's value stays in the loss, its gradient is detached:
    # loss = token-mean(-A r) = -(3 + 1 - 2 - 2) / 4 = 0 (same as PPO);  grad = -A / 4 except token 0.
    log_probs = torch.tensor(LOGP, dtype=F64, requires_grad=True)
    adv, mask = torch.tensor(ADV, dtype=F64), torch.ones(1, 4, dtype=F64)
    out = clip_cov(log_probs, log_probs.detach(), adv, mask)
    torch.testing.assert_close(out.loss, ppo_clip(log_probs, log_probs.detach(), adv, mask).loss)
    torch.testing.assert_close(out.cov_clipfrac, torch.tensor(0.25, dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[0.0, -0.25, 0.5, 0.5]], dtype=F64))


def test_clip_cov_never_picks_a_token_the_ppo_clip_already_zeroed():
    # Token 0 with r = 1.5 > 1.2 and A > 0 is clipped by PPO, so it is no candidate; nothing else is in (1, 5).
    log_probs = torch.tensor(LOGP, dtype=F64)
    old = log_probs - torch.tensor([[math.log(1.5), 0.0, 0.0, 0.0]], dtype=F64)
    out = clip_cov(log_probs, old, torch.tensor(ADV, dtype=F64), torch.ones(1, 4, dtype=F64))
    assert out.cov_clipfrac.item() == 0.0 and out.pg_clipfrac.item() == 0.25


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), draw_seed=st.integers(0, 100))
def test_clip_cov_detaches_the_requested_number_of_candidates_reproducibly(seed, draw_seed):
    gen = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(4, 8, generator=gen, dtype=F64) * 6).requires_grad_(True)
    adv, mask = torch.randn(4, 8, generator=gen, dtype=F64) * 3, torch.ones(4, 8, dtype=F64)
    kw = dict(clip_cov_ratio=0.125, clip_cov_lb=-1e9, clip_cov_ub=1e9, seed=draw_seed)
    out = clip_cov(lp, lp.detach(), adv, mask, **kw)
    # Every on-policy token is a candidate: floor(0.125 * 32) = 4 are detached, whatever the seed.
    assert round(out.cov_clipfrac.item() * 32) == 4
    out.loss.backward()
    zeroed = (lp.grad == 0) & (adv != 0)
    assert int(zeroed.sum()) == 4
    lp2 = lp.detach().clone().requires_grad_(True)
    clip_cov(lp2, lp.detach(), adv, mask, **kw).loss.backward()
    assert torch.equal(lp2.grad, lp.grad)


def test_clip_cov_is_not_row_separable():
    # A zero-advantage row moves mean(logp) from -2 to -6: row 0's covariances become [15, 3, -8, -8]
    # and token 1 (cov 3) is detached instead of token 0. So an engine must not drop such rows.
    lp = torch.tensor([LOGP[0], [-10.0] * 4], dtype=F64, requires_grad=True)
    adv = torch.tensor([ADV[0], [0.0] * 4], dtype=F64)
    clip_cov(lp, lp.detach(), adv, torch.ones(2, 4, dtype=F64), global_tokens=4).loss.backward()
    torch.testing.assert_close(lp.grad[0], torch.tensor([-0.75, 0.0, 0.5, 0.5], dtype=F64))


def test_kl_cov_hand_worked():
    # k = max(1, floor(0.25 * 4)) = 1: token 0 (cov 3). Its log-ratio is 0.1 (r = e^0.1 = 1.105171), others 0.
    # l = [-3 * 1.105171 + 0.1, -1, 2, 2] = [-3.215513, -1, 2, 2];  token-mean = -0.215513 / 4 = -0.053878
    # grad token 0 = (-3 * 1.105171 + 1) / 4 = -0.578878;  others -A / 4.
    log_probs = torch.tensor(LOGP, dtype=F64, requires_grad=True)
    old = log_probs.detach() - torch.tensor([[0.1, 0.0, 0.0, 0.0]], dtype=F64)
    out = kl_cov(log_probs, old, torch.tensor(ADV, dtype=F64), torch.ones(1, 4, dtype=F64), kl_cov_ratio=0.25)
    torch.testing.assert_close(out.loss, torch.tensor(-0.053878, dtype=F64), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.cov_klfrac, torch.tensor(0.25, dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-0.578878, -0.25, 0.5, 0.5]], dtype=F64), atol=1e-6, rtol=0)


def test_kl_cov_does_not_vanish_with_the_advantage():
    # Row 1 has A = 0, but mean(A) = 1 and mean(logp) = -3, so its token 0 has cov (-9 + 3)(0 - 1) = 6,
    # the largest: it is penalised and gets the gradient kl_coef * sign(0.3) / 4 = 0.25.
    lp = torch.tensor([[-1.0, -1.0], [-9.0, -1.0]], dtype=F64, requires_grad=True)
    old = lp.detach() - torch.tensor([[0.0, 0.0], [0.3, 0.0]], dtype=F64)
    adv = torch.tensor([[2.0, 2.0], [0.0, 0.0]], dtype=F64)
    kl_cov(lp, old, adv, torch.ones(2, 2, dtype=F64), kl_cov_ratio=0.25).loss.backward()
    torch.testing.assert_close(lp.grad[1], torch.tensor([0.25, 0.0], dtype=F64))


def test_sapo_hand_worked():
    # tau_pos = 1, tau_neg = 2; f(r) = (4 / tau) sigmoid(tau (r - 1)).
    # t0: r = 1, A = 1:  f = 4 * 0.5 = 2, l = -2;  dl/dlogp = -A f'(1) r = -1 (f'(1) = 4 s (1 - s) = 1)
    # t1: r = e^0.5 = 1.648721, A = -1: s = sigmoid(2 * 0.648721) = 0.785404, f = 2 s = 1.570808, l = 1.570808
    #     dl/dlogp = -A * 4 s (1 - s) * r = 0.674301 * 1.648721 = 1.111531
    # seq-mean-token-mean = (-2 + 1.570808) / 2 = -0.214596;  grad = [-1, 1.111531] / 2
    log_probs = torch.tensor([[0.0, 0.5]], dtype=F64, requires_grad=True)
    out = sapo(log_probs, torch.zeros(1, 2, dtype=F64), torch.tensor([[1.0, -1.0]], dtype=F64), torch.ones(1, 2, dtype=F64),
               tau_pos=1.0, tau_neg=2.0)
    torch.testing.assert_close(out.loss, torch.tensor(-0.214596, dtype=F64), atol=1e-6, rtol=0)
    out.loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-0.5, 0.555765]], dtype=F64), atol=1e-6, rtol=0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), tau_pos=st.floats(0.1, 5.0), tau_neg=st.floats(0.1, 5.0))
def test_sapo_on_policy_gradient_equals_the_unclipped_surrogate(seed, tau_pos, tau_neg):
    # f'(1) = 1 for every tau: at r = 1 SAPO's gradient is PPO's (no token is clipped at r = 1).
    gen = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(3, 4, generator=gen, dtype=F64) * 3).requires_grad_(True)
    ref = lp.detach().clone().requires_grad_(True)
    adv, mask = torch.randn(3, 4, generator=gen, dtype=F64), (torch.rand(3, 4, generator=gen) > 0.3).to(F64)
    sapo(lp, lp.detach(), adv, mask, tau_pos=tau_pos, tau_neg=tau_neg).loss.backward()
    ppo_clip(ref, ref.detach(), adv, mask, loss_agg_mode="seq-mean-token-mean").loss.backward()
    torch.testing.assert_close(lp.grad, ref.grad)


# Old probability mu, new probability p, advantage: see the hand-worked cases below.
MU = [[0.5, 0.5, 0.5, 0.5, 0.01, 0.9]]
P = [[0.7, 0.6, 0.3, 0.7, 0.05, 0.99]]
A6 = [[1.0, 1.0, -1.0, -1.0, 1.0, 1.0]]


def _dppo(fn):
    log_probs = torch.log(torch.tensor(P, dtype=F64)).requires_grad_(True)
    out = fn(log_probs, torch.log(torch.tensor(MU, dtype=F64)), torch.tensor(A6, dtype=F64), torch.ones(1, 6, dtype=F64))
    out.loss.backward()
    return out, log_probs.grad


def test_dppo_tv_hand_worked():
    # p - mu = [0.2, 0.1, -0.2, 0.2, 0.04, 0.09], r = p / mu = [1.4, 1.2, 0.6, 1.4, 5, 1.1]
    # t0: A > 0, +0.2 > 0.15 -> masked;  t2: A < 0, -0.2 < -0.15 -> masked;  t3 moves against A: kept;
    # t4: r = 5 (PPO would clip it) but p moved by 0.04 only: kept.
    # l = [0, -1.2, 0, 1.4, -5, -1.1];  token-mean = -5.9 / 6 = -0.983333;  maskfrac 2 / 6
    out, grad = _dppo(dppo_tv)
    torch.testing.assert_close(out.loss, torch.tensor(-5.9 / 6, dtype=F64))
    torch.testing.assert_close(out.pg_maskfrac, torch.tensor(2 / 6, dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1.2, 0.0, 1.4, -5.0, -1.1]], dtype=F64) / 6)


def test_binary_kl_hand_worked():
    # mu = 0.5, p = 0.7: 0.5 ln(0.5/0.7) + 0.5 ln(0.5/0.3) = 0.5 (-0.336472 + 0.510826) = 0.087177
    # mu = 0.9, p = 0.99: 0.9 ln(0.9/0.99) + 0.1 ln(0.1/0.01) = -0.085779 + 0.230259 = 0.144479
    d = binary_kl(torch.log(torch.tensor([0.5, 0.9], dtype=F64)), torch.log(torch.tensor([0.7, 0.99], dtype=F64)))
    torch.testing.assert_close(d, torch.tensor([0.087177, 0.144479], dtype=F64), atol=1e-6, rtol=0)
    assert binary_kl(torch.tensor([-0.5]), torch.tensor([-0.5])).abs().item() < 1e-7


def test_dppo_kl_hand_worked():
    # Binary KL = [0.0872, 0.0204, 0.0872, 0.0872, 0.0247, 0.1445] against delta = 0.05:
    # t0 (up, A > 0) and t2 (down, A < 0) masked as with TV; t5 (mu 0.9 -> p 0.99, only +0.09 in TV) is now
    # masked too: the same absolute move is a larger divergence near p = 1.
    # l = [0, -1.2, 0, 1.4, -5, 0];  token-mean = -4.8 / 6 = -0.8;  maskfrac 3 / 6
    out, grad = _dppo(dppo_kl)
    torch.testing.assert_close(out.loss, torch.tensor(-0.8, dtype=F64))
    torch.testing.assert_close(out.pg_maskfrac, torch.tensor(0.5, dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1.2, 0.0, 1.4, -5.0, 0.0]], dtype=F64) / 6)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_dppo_with_wide_thresholds_is_the_unclipped_surrogate(seed):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 4, generator=gen, dtype=F64) * 3
    lp = (old + torch.randn(3, 4, generator=gen, dtype=F64) * 0.5).requires_grad_(True)
    adv, mask = torch.randn(3, 4, generator=gen, dtype=F64), (torch.rand(3, 4, generator=gen) > 0.3).to(F64)
    for fn in (dppo_tv, dppo_kl):
        out = fn(lp, old, adv, mask, delta_low=1e3, delta_high=1e3)
        ratio = torch.exp(lp - old)
        expected = torch.where(mask.bool(), -adv * ratio, torch.zeros_like(ratio)).sum() / mask.sum().clamp(min=1)
        torch.testing.assert_close(out.loss, expected)
        assert out.pg_maskfrac.item() == 0.0
