"""Rejection by k1/k2/k3 (token, sequence sum, mean, max), chained rejection, sequence-level IcePop, AReaL's decoupled weight."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import chained_rejection_mask, decoupled_is_weight, icepop_is_weight, kl_rejection_mask, ppo_clip_is
from hybridflow_ops.rollout_rejection import parse_criteria

F64 = torch.float64
LN2 = math.log(2.0)
NAN = float("nan")


def _pair(log_r, mask):
    """Rollout log-probs of -1 and old log-probs -1 + log r (NaN at padding, which must never matter)."""
    log_r, mask = torch.tensor(log_r, dtype=F64), torch.tensor(mask, dtype=F64)
    rollout = torch.full_like(log_r, -1.0)
    old = torch.where(mask.bool(), rollout + log_r, torch.full_like(log_r, NAN))
    return old, rollout, mask


def test_k3_token_rejection_worked_in_the_docstring():
    # log r = (0, ln 2, -ln 2): k3 = r - 1 - log r = (0, 1 - ln 2 = 0.3069, -0.5 + ln 2 = 0.1931); high 0.2 drops token 1.
    old, rollout, mask = _pair([[0.0, LN2, -LN2]], [[1, 1, 1]])
    out = kl_rejection_mask(old, rollout, mask, level="token", estimator="k3", high=0.2)
    assert out.response_mask.tolist() == [[1.0, 0.0, 1.0]]
    assert out.rejected_token_frac.item() == pytest.approx(1 / 3) and out.rejected_seq_frac.item() == 1.0


def test_sequence_levels_hand_worked():
    # Row 0: log r = (0.2, 0.2)     k1 = (-0.2, -0.2) sum -0.4 mean -0.2; k2 = (0.02, 0.02) sum 0.04 max 0.02
    # Row 1: log r = (0.1, -0.5, 0) k1 = (-0.1, 0.5, 0) sum 0.4 mean 0.1333; k2 = (0.005, 0.125, 0) sum 0.13 max 0.125
    old, rollout, mask = _pair([[0.2, 0.2, 0.0], [0.1, -0.5, 0.0]], [[1, 1, 0], [1, 1, 1]])
    rows = lambda out: [bool(r.any()) for r in out.response_mask]  # noqa: E731
    # seq_sum k1, band [e^-0.3, e^0.5] on exp(sum k1): row 0 (-0.4) out, row 1 (0.4) in.
    assert rows(kl_rejection_mask(old, rollout, mask, level="seq_sum", estimator="k1", low=math.exp(-0.3), high=math.exp(0.5))) == [False, True]
    # seq_mean k1, band [e^-0.25, e^0.1]: row 0 (-0.2) in, row 1 (0.1333) out.
    assert rows(kl_rejection_mask(old, rollout, mask, level="seq_mean", estimator="k1", low=math.exp(-0.25), high=math.exp(0.1))) == [True, False]
    # seq_sum k2 <= 0.1: row 0 (0.04) in, row 1 (0.13) out; seq_max k2 <= 0.1: the same rows.
    assert rows(kl_rejection_mask(old, rollout, mask, level="seq_sum", estimator="k2", high=0.1)) == [True, False]
    assert rows(kl_rejection_mask(old, rollout, mask, level="seq_max", estimator="k2", high=0.1)) == [True, False]
    # seq_mean k2 <= 0.03: row 0 mean 0.02 in, row 1 mean 0.13 / 3 = 0.0433 out.
    out = kl_rejection_mask(old, rollout, mask, level="seq_mean", estimator="k2", high=0.03)
    assert out.response_mask.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert out.rejected_seq_frac.item() == 0.5 and out.rejected_token_frac.item() == pytest.approx(3 / 5)


def _reference_keep(log_r, mask, level, estimator, low, high):
    """The rule of the module docstring, one response and one token at a time."""
    keep = torch.zeros_like(mask, dtype=torch.bool)
    for i in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        values = {}
        for t in valid:
            x = max(-20.0, min(20.0, float(log_r[i, t])))
            values[t] = {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1.0 - x}[estimator]
        if level != "token" and valid:
            vals = list(values.values())
            stat = {"seq_sum": sum(vals), "seq_mean": sum(vals) / len(vals), "seq_max": max(vals)}[level]
            values = {t: stat for t in valid}
        for t, s in values.items():
            keep[i, t] = math.log(low) <= s <= math.log(high) if estimator == "k1" else s <= high
    return keep


@pytest.mark.parametrize("level", ["token", "seq_sum", "seq_mean", "seq_max"])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_matches_a_slow_reference(level, estimator, seed):
    if level == "seq_max" and estimator == "k1":
        return
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(5, 7, generator=gen) > 0.3).to(F64)
    mask[-1] = 0.0  # an empty response
    log_r = torch.randn(5, 7, generator=gen, dtype=F64) * 0.4
    rollout = -torch.rand(5, 7, generator=gen, dtype=F64) * 2
    old = rollout + log_r
    low, high = (0.7, 1.6) if estimator == "k1" else (None, 0.08)
    out = kl_rejection_mask(old, rollout, mask, level=level, estimator=estimator, low=low, high=high)
    expected = _reference_keep(log_r, mask, level, estimator, 1 / high if low is None else low, high) & mask.bool()
    assert torch.equal(out.response_mask.bool(), expected)
    assert set(out.response_mask.unique().tolist()) <= {0.0, 1.0}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), high=st.floats(1.0, 4.0))
def test_masks_are_zero_one_below_the_input_and_on_policy_keeps_everything(seed, high):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).to(F64)
    rollout = -torch.rand(4, 6, generator=gen, dtype=F64) * 3
    old = rollout + torch.randn(4, 6, generator=gen, dtype=F64)
    for level in ("token", "seq_sum", "seq_mean", "seq_max"):
        for estimator in ("k1", "k2", "k3"):
            if (level, estimator) == ("seq_max", "k1"):
                continue
            out = kl_rejection_mask(old, rollout, mask, level=level, estimator=estimator, high=high).response_mask
            assert set(out.unique().tolist()) <= {0.0, 1.0} and bool((out <= mask).all())
            same = kl_rejection_mask(rollout, rollout, mask, level=level, estimator=estimator, high=high).response_mask
            assert torch.equal(same, mask)  # log r = 0: every estimator is 0, inside every band


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_a_chained_mask_is_the_product_of_its_criteria(seed):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(6, 5, generator=gen) > 0.2).to(F64)
    rollout = -torch.rand(6, 5, generator=gen, dtype=F64) * 3
    old = rollout + torch.randn(6, 5, generator=gen, dtype=F64) * 0.4
    criteria = "token_k1=0.6_1.5, seq_mean_k3=0.05, seq_max_k2=0.2"
    chained = chained_rejection_mask(old, rollout, mask, criteria=criteria).response_mask
    product = mask.clone()
    for level, estimator, low, high in parse_criteria(criteria):
        product = product * kl_rejection_mask(old, rollout, mask, level=level, estimator=estimator, low=low, high=high).response_mask
    assert torch.equal(chained, product)


@pytest.mark.parametrize("kwargs, message", [
    (dict(level="seq", estimator="k1", high=2.0), "unknown rejection level"),
    (dict(level="token", estimator="k4", high=2.0), "unknown KL estimator"),
    (dict(level="token", estimator="k3"), "needs an upper bound"),
    (dict(level="token", estimator="k2", low=0.5, high=2.0), "takes only an upper bound"),
    (dict(level="seq_max", estimator="k1", high=2.0), "seq_max with k1"),
    (dict(level="token", estimator="k1", low=3.0, high=2.0), "0 < low <= high"),
])
def test_bad_criteria_are_named(kwargs, message):
    old, rollout, mask = _pair([[0.0]], [[1]])
    with pytest.raises(ValueError, match=message):
        kl_rejection_mask(old, rollout, mask, **kwargs)


def test_bad_criteria_strings_are_named():
    old, rollout, mask = _pair([[0.0]], [[1]])
    for text in ("token_k1", "k3=0.1", "token_k3=abc"):
        with pytest.raises(ValueError, match="cannot read rejection criterion"):
            chained_rejection_mask(old, rollout, mask, criteria=text)


def test_sequence_icepop_hand_worked():
    # Row 0: log k = (ln 2, 0): geometric mean sqrt 2 = 1.4142 in [0.5, 5]; product 2 in [0.5, 5].
    # Row 1: log k = (ln 8, ln 8): geometric mean 8 > 5 -> 0; product 64 -> 0.
    # Row 2: log k = (ln 4, ln 2): geometric mean 2.828 in; product 8 > 5 out.
    old, rollout, mask = _pair([[LN2, 0.0], [3 * LN2, 3 * LN2], [2 * LN2, LN2]], [[1, 1], [1, 1], [1, 1]])
    gm = icepop_is_weight(old, rollout, mask, level="sequence").is_weights
    torch.testing.assert_close(gm, torch.tensor([[2 ** 0.5] * 2, [0.0] * 2, [8 ** 0.5] * 2], dtype=F64))
    prod = icepop_is_weight(old, rollout, mask, level="sequence", statistic="product").is_weights
    torch.testing.assert_close(prod, torch.tensor([[2.0] * 2, [0.0] * 2, [0.0] * 2], dtype=F64))
    only_mask = icepop_is_weight(old, rollout, mask, level="sequence", keep_ratio=False).is_weights
    torch.testing.assert_close(only_mask, torch.tensor([[1.0] * 2, [0.0] * 2, [1.0] * 2], dtype=F64))
    with pytest.raises(ValueError, match="level"):
        icepop_is_weight(old, rollout, mask, level="seq")


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), level=st.sampled_from(["token", "sequence"]))
def test_icepop_and_decoupled_weights_are_one_on_policy(seed, level):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(3, 5, generator=gen) > 0.3).to(F64)
    logp = -torch.rand(3, 5, generator=gen, dtype=F64) * 3
    torch.testing.assert_close(icepop_is_weight(logp, logp.clone(), mask, level=level).is_weights, mask)
    torch.testing.assert_close(decoupled_is_weight(logp, logp.clone(), mask, cap=2.0).is_weights, mask)


def test_decoupled_weight_drops_above_the_cap():
    # u = pi_prox / mu = (2, 0.5, 8): cap 5 drops the third token (AReaL drops, it does not truncate).
    old, rollout, mask = _pair([[LN2, -LN2, 3 * LN2]], [[1, 1, 1]])
    torch.testing.assert_close(decoupled_is_weight(old, rollout, mask, cap=5.0).is_weights, torch.tensor([[2.0, 0.5, 0.0]], dtype=F64))
    torch.testing.assert_close(decoupled_is_weight(old, rollout, mask).is_weights, torch.tensor([[2.0, 0.5, 8.0]], dtype=F64))
    with pytest.raises(ValueError, match="cap must be >= 1"):
        decoupled_is_weight(old, rollout, mask, cap=0.5)


def test_decoupled_ppo_equals_areal_objective_in_a_slow_loop():
    # AReaL eq. 5: loss = -mean_t (pi_prox / mu) min(r A, clip(r, 1 - eps, 1 + eps) A), r = pi_theta / pi_prox.
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(3, 4, dtype=F64)
    mask[2, 3] = 0.0
    behaviour = -torch.rand(3, 4, generator=gen, dtype=F64) * 2 - 0.1
    proximal = behaviour + torch.randn(3, 4, generator=gen, dtype=F64) * 0.3
    theta = proximal + torch.randn(3, 4, generator=gen, dtype=F64) * 0.3
    adv = torch.randn(3, 4, generator=gen, dtype=F64)
    weights = decoupled_is_weight(proximal, behaviour, mask).is_weights
    loss = ppo_clip_is(theta, proximal, adv, mask, weights, clip_low=0.2, clip_high=0.2).loss
    terms = []
    for i in range(3):
        for t in range(4):
            if mask[i, t]:
                u = math.exp(proximal[i, t] - behaviour[i, t])
                r = math.exp(theta[i, t] - proximal[i, t])
                a = float(adv[i, t])
                terms.append(-u * min(r * a, max(0.8, min(1.2, r)) * a))
    assert loss.item() == pytest.approx(sum(terms) / len(terms), abs=1e-12)
