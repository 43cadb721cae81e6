"""PPO clip (asymmetric, dual clip), PPO clip with IS weights, GSPO and the truncated IS weight."""
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hybridflow_ops import gspo, ppo_clip, ppo_clip_is, truncated_is_weight

NAN = float("nan")


def test_ppo_clip_hand_worked_asymmetric():
    # old_log_probs = 0, so r = exp(log_probs); clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28].
    # t0: r = 1.5, A = 1:  max(-1.5, -1.28) = -1.28  (clipped)
    # t1: r = 0.5, A = -1: max(0.5, 0.8)    = 0.8    (clipped)
    # t2: r = 1.1, A = 2:  max(-2.2, -2.2)  = -2.2
    # t3: r = 0.7, A = 1:  max(-0.7, -0.8)  = -0.7   (below the range with A > 0: not clipped)
    # t4: padding (nan log-prob and advantage).
    # token-mean = (-1.28 + 0.8 - 2.2 - 0.7) / 4 = -0.845;  clipfrac = 2/4
    # ppo_kl = mean(old - new) = -(ln 1.5 + ln 0.5 + ln 1.1 + ln 0.7) / 4 = 0.549047 / 4 = 0.137262
    log_probs = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7, 1.0]]))
    log_probs[0, 4] = NAN
    log_probs.requires_grad_(True)
    old = torch.zeros(1, 5)
    adv = torch.tensor([[1.0, -1.0, 2.0, 1.0, NAN]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    out = ppo_clip(log_probs, old, adv, mask, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(out.loss, torch.tensor(-0.845))
    torch.testing.assert_close(out.pg_clipfrac, torch.tensor(0.5))
    torch.testing.assert_close(out.pg_clipfrac_lower, torch.tensor(0.0))
    torch.testing.assert_close(out.ppo_kl, torch.tensor(0.137262), atol=1e-6, rtol=0)
    out.loss.backward()
    # d loss / d log_prob_t = -A_t r_t / 4 where unclipped: t2: -2*1.1/4 = -0.55, t3: -1*0.7/4 = -0.175.
    torch.testing.assert_close(log_probs.grad, torch.tensor([[0.0, 0.0, -0.55, -0.175, 0.0]]))
    assert all(not m.requires_grad and m.dim() == 0 for m in out[1:])


def test_ppo_dual_clip_hand_worked():
    # clip range [0.8, 1.28], dual_clip c = 3.
    # t0: r = 5, A = -1: max(5, 1.2) = 5, then min(5, -c A = 3) = 3   (dual clip)
    # t1: r = 2, A = -1: max(2, 1.2) = 2, min(2, 3) = 2
    # t2: r = 5, A = 1:  max(-5, -1.28) = -1.28 (clipped; dual clip only for A < 0)
    # token-mean = (3 + 2 - 1.28) / 3 = 1.24;  clipfrac = 1/3 (t2);  clipfrac_lower = 1/3 (t0)
    log_probs = torch.log(torch.tensor([[5.0, 2.0, 5.0]]))
    out = ppo_clip(log_probs, torch.zeros(1, 3), torch.tensor([[-1.0, -1.0, 1.0]]), torch.ones(1, 3),
                   clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    torch.testing.assert_close(out.loss, torch.tensor(1.24))
    torch.testing.assert_close(out.pg_clipfrac, torch.tensor(1 / 3))
    torch.testing.assert_close(out.pg_clipfrac_lower, torch.tensor(1 / 3))


def test_ppo_rejects_bad_hyper_parameters():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip(x, x, x, torch.ones(1, 2), dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low"):
        ppo_clip(x, x, x, torch.ones(1, 2), clip_low=1.5)
    with pytest.raises(ValueError, match="valid modes"):
        ppo_clip(x, x, x, torch.ones(1, 2), loss_agg_mode="mean")


@st.composite
def policy_batch(draw, max_b=4, max_r=6):
    b, r = draw(st.integers(1, max_b)), draw(st.integers(1, max_r))

    def matrix(elements):
        return torch.tensor(draw(st.lists(st.lists(elements, min_size=r, max_size=r), min_size=b, max_size=b)))

    log_ratio = matrix(st.floats(-1.5, 1.5))
    old = matrix(st.floats(-6, 0))
    adv = matrix(st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3))
    mask = matrix(st.booleans()).float()
    return old + log_ratio, old, adv, mask


@settings(max_examples=100, deadline=None)
@given(batch=policy_batch(), clip_low=st.floats(0.05, 0.4), clip_high=st.floats(0.05, 0.5), dual=st.sampled_from([None, 3.0]))
def test_ppo_gradient_is_zero_where_ratio_is_clipped_against_the_advantage(batch, clip_low, clip_high, dual):
    new, old, adv, mask = batch
    ratio = torch.exp(new - old)
    # Keep ratios off the clip boundaries, where the gradient is not defined.
    margin = 1e-3
    for bound in (1 - clip_low, 1 + clip_high) + ((dual,) if dual else ()):
        assume(torch.all((ratio - bound).abs() > margin))
    log_probs = new.clone().requires_grad_(True)
    out = ppo_clip(log_probs, old, adv, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual)
    out.loss.backward()
    valid = mask.bool()
    upper = (ratio > 1 + clip_high) & (adv > 0)
    lower = (ratio < 1 - clip_low) & (adv < 0)
    dual_clipped = (adv < 0) & (ratio > dual) if dual else torch.zeros_like(valid)
    zero_grad = upper | lower | dual_clipped | ~valid
    assert torch.all(log_probs.grad[zero_grad] == 0)
    # Elsewhere the surrogate is -A r: gradient -A r / n_tokens (token-mean).
    n_tokens = max(valid.sum().item(), 1)
    expected = -adv * ratio / n_tokens
    torch.testing.assert_close(log_probs.grad[~zero_grad], expected[~zero_grad])


@settings(max_examples=60, deadline=None)
@given(batch=policy_batch(), data=st.data(), mode=st.sampled_from(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]))
def test_policy_losses_ignore_appended_padding(batch, data, mode):
    new, old, adv, mask = batch
    b, r = mask.shape
    extra = data.draw(st.integers(1, 3))
    garbage = data.draw(st.sampled_from([NAN, math.inf, -1e30]))

    def widen(x, fill):
        return torch.cat([x, torch.full((b, extra), fill)], dim=1)

    for loss_fn in (ppo_clip, gspo):
        narrow_lp = new.clone().requires_grad_(True)
        wide_lp = widen(new, garbage).requires_grad_(True)
        base = loss_fn(narrow_lp, old, adv, mask, loss_agg_mode=mode)
        wide = loss_fn(wide_lp, widen(old, garbage), widen(adv, garbage), widen(mask, 0.0), loss_agg_mode=mode)
        for a, c in zip(base, wide):
            torch.testing.assert_close(c, a)
        base.loss.backward()
        wide.loss.backward()
        torch.testing.assert_close(wide_lp.grad[:, :r], narrow_lp.grad)
        assert torch.all(wide_lp.grad[:, r:] == 0)


def test_ppo_clip_is_scales_token_losses_by_detached_weights():
    # Same tokens as the first two of the hand-worked case: losses [-1.28, 0.8], weights [2, 0.5]:
    # token-mean = (-2.56 + 0.4) / 2 = -1.08. Weights are detached: no gradient reaches them.
    log_probs = torch.log(torch.tensor([[1.5, 0.5]]))
    weights = torch.tensor([[2.0, 0.5]], requires_grad=True)
    out = ppo_clip_is(log_probs, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), weights,
                      clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(out.loss, torch.tensor(-1.08))
    assert not out.loss.requires_grad


def test_ppo_clip_is_with_unit_weights_equals_ppo_clip():
    torch.manual_seed(3)
    old = -torch.rand(3, 5) * 3
    new = old + 0.3 * torch.randn(3, 5)
    adv, mask = torch.randn(3, 5), (torch.rand(3, 5) > 0.2).float()
    a = ppo_clip(new, old, adv, mask, dual_clip=3.0)
    c = ppo_clip_is(new, old, adv, mask, torch.ones(3, 5), dual_clip=3.0)
    for x, y in zip(a, c):
        torch.testing.assert_close(x, y)


def test_truncated_is_weight_hand_worked():
    # w = min(exp(old - rollout), cap = 2): exp(0.5) = 1.64872; exp(1) = 2.718 -> 2; exp(-1) = 0.36788; padding -> 0.
    old = torch.tensor([[-1.0, -1.0, -2.0, NAN]], requires_grad=True)
    rollout = torch.tensor([[-1.5, -2.0, -1.0, 0.0]])
    w = truncated_is_weight(old, rollout, torch.tensor([[1.0, 1.0, 1.0, 0.0]]), cap=2.0).is_weights
    torch.testing.assert_close(w, torch.tensor([[math.exp(0.5), 2.0, math.exp(-1.0), 0.0]]))
    assert not w.requires_grad


def test_gspo_hand_worked():
    # clip range [1 - 3e-4, 1 + 4e-4].
    # Seq 0: log-ratios [0.2, -0.1], mean 0.05, s = e^0.05 = 1.051271, A = 1
    #   per token max(-1.051271, -1.0004) = -1.0004 (clipped); token mean -1.0004
    # Seq 1: log-ratios [1e-4, -1e-4] (+ padding), mean 0, s = 1, A = -2: per token 2 (not clipped)
    # seq-mean-token-mean = (-1.0004 + 2) / 2 = 0.4998;  clipfrac = 2/4
    # ppo_kl = -mean(0.2, -0.1, 1e-4, -1e-4) = -0.025
    new = torch.tensor([[0.2, -0.1, 0.0], [1e-4, -1e-4, NAN]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, NAN]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    out = gspo(new, torch.zeros_like(new), adv, mask)
    torch.testing.assert_close(out.loss, torch.tensor(0.4998, dtype=torch.float64))
    torch.testing.assert_close(out.pg_clipfrac, torch.tensor(0.5, dtype=torch.float64))
    torch.testing.assert_close(out.ppo_kl, torch.tensor(-0.025, dtype=torch.float64))


@settings(max_examples=60, deadline=None)
@given(batch=policy_batch(), clip=st.floats(0.01, 0.3))
def test_gspo_gradient_equals_sequence_level_objective(batch, clip):
    # GSPO (eq. 5-7): J = mean_i max(-A_i s_i, -A_i clip(s_i)), s_i = exp(mean_t log-ratio).
    # With one advantage per sequence, the token variant must give the same loss and gradient.
    new, old, adv_tokens, mask = batch
    adv = adv_tokens[:, :1].expand_as(adv_tokens)
    valid = mask.bool()
    assume(valid.any())
    lp_token = new.clone().double().requires_grad_(True)
    lp_seq = new.clone().double().requires_grad_(True)
    out = gspo(lp_token, old.double(), adv.double(), mask.double(), clip_low=clip, clip_high=clip)
    lengths = valid.sum(-1).clamp(min=1)
    s = torch.exp(torch.where(valid, lp_seq - old.double(), 0.0).sum(-1) / lengths)
    a = adv[:, 0].double()
    assume(torch.all((s - (1 - clip)).abs() > 1e-6) and torch.all((s - (1 + clip)).abs() > 1e-6))
    per_seq = torch.maximum(-a * s, -a * s.clamp(1 - clip, 1 + clip))
    reference = torch.where(valid.any(-1), per_seq, 0.0).sum() / valid.any(-1).sum()
    torch.testing.assert_close(out.loss, reference)
    out.loss.backward()
    reference.backward()
    torch.testing.assert_close(lp_token.grad, lp_seq.grad)


def test_policy_losses_do_not_mutate_inputs():
    torch.manual_seed(4)
    tensors = [-torch.rand(2, 4), -torch.rand(2, 4), torch.randn(2, 4), (torch.rand(2, 4) > 0.3).float()]
    copies = [t.clone() for t in tensors]
    ppo_clip(*tensors, dual_clip=3.0)
    gspo(*tensors)
    ppo_clip_is(*tensors, torch.rand(2, 4))
    truncated_is_weight(tensors[0], tensors[1], tensors[3])
    for t, c in zip(tensors, copies):
        assert torch.equal(t, c)
