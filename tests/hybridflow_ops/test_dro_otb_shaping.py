"""DRO, the optimal token baseline, DAPO's overlong penalty and uniform-group filter: hand-worked cases and properties."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import dro, get_op, optimal_token_baseline_advantage, overlong_penalty, reinforce, uniform_group_filter

NAN = float("nan")
F64 = torch.float64
LN = math.log


def test_dro_hand_worked():
    # l = -A lp + beta/2 (lp - old)^2, beta = 0.1, token-mean over 3 valid tokens
    # (0,0): A=1, lp=ln .5, old=ln .5:   0.693147 + 0                          = 0.693147
    # (0,1): A=1, lp=ln .25, old=ln .5:  1.386294 + 0.05 * 0.693147^2 = +0.024023 = 1.410317
    # (1,0): A=-2, lp=ln .8, old=0:     -0.446287 + 0.05 * 0.223144^2 = +0.002490 = -0.443798
    # loss = 1.659666 / 3 = 0.553222;  dl/dlp = (-A + beta (lp - old)) / 3
    lp = torch.tensor([[LN(0.5), LN(0.25), NAN], [LN(0.8), NAN, NAN]], dtype=F64, requires_grad=True)
    old = torch.tensor([[LN(0.5), LN(0.5), NAN], [0.0, NAN, NAN]], dtype=F64)
    adv = torch.tensor([[1.0, 1.0, NAN], [-2.0, NAN, NAN]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=F64)
    out = dro(lp, old, adv, mask, beta=0.1)
    torch.testing.assert_close(out.loss, torch.tensor(0.553222, dtype=F64), atol=1e-6, rtol=0)
    out.loss.backward()
    expected = torch.tensor([[-1.0, -1.0 - 0.0693147, 0.0], [2.0 - 0.0223144, 0.0, 0.0]], dtype=F64) / 3
    torch.testing.assert_close(lp.grad, expected, atol=1e-6, rtol=0)
    # ppo_kl = mean(old - lp) over valid tokens = (0 + 0.693147 + 0.223144) / 3
    torch.testing.assert_close(out.ppo_kl, torch.tensor(0.916291 / 3, dtype=F64), atol=1e-6, rtol=0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), beta=st.floats(0.0, 2.0))
def test_dro_on_policy_is_reinforce_and_padding_is_ignored(seed, beta):
    g = torch.Generator().manual_seed(seed)
    lp, adv = -torch.rand(3, 5, generator=g, dtype=F64), torch.randn(3, 5, generator=g, dtype=F64)
    mask = (torch.rand(3, 5, generator=g) > 0.3).to(F64)
    mask[:, 0] = 1.0
    # on-policy the penalty is 0: loss and gradient are REINFORCE's with the same aggregation
    a, b = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    ours, theirs = dro(a, lp, adv, mask, beta=beta), reinforce(b, adv, mask, loss_agg_mode="token-mean")
    torch.testing.assert_close(ours.loss, theirs.loss)
    ours.loss.backward(), theirs.loss.backward()
    torch.testing.assert_close(a.grad, b.grad)
    # padding: garbage there changes nothing
    old = lp - 0.3 * torch.rand(3, 5, generator=g, dtype=F64)
    junk = torch.where(mask.bool(), old, torch.full_like(old, NAN))
    torch.testing.assert_close(dro(lp, junk, adv, mask, beta=beta).loss, dro(lp, old, adv, mask, beta=beta).loss)


def test_dro_rejects_negative_beta_and_is_registered_as_a_loss():
    with pytest.raises(ValueError, match="beta"):
        dro(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), beta=-1.0)
    spec = get_op("dro")
    assert spec.kind == "loss" and spec.input_names == ("old_log_probs", "advantages", "response_mask")
    assert spec.vanishes_with is None  # the penalty has a gradient where A = 0


def _otb_case():
    # group 0: response 0 (2 tokens, score 1), response 1 (1 token, score 0); group 5: one response alone
    scores = torch.tensor([1.0, 0.0, 1.0], dtype=F64)
    group = torch.tensor([0, 0, 5])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]], dtype=F64)
    old = torch.tensor([[LN(0.5), LN(0.5)], [LN(0.25), NAN], [LN(0.9), LN(0.9)]], dtype=F64)
    spi = torch.tensor([[0.5, 0.5], [0.25, NAN], [0.82, 0.82]], dtype=F64)
    return scores, group, mask, old, spi


def test_optimal_token_baseline_hand_worked():
    # energies e = 1 - 2 pi + sum pi^2: response 0: 1 - 1 + 0.5 = 0.5 per token -> W = [0.5, 1.0]
    #                                   response 1: 1 - 0.5 + 0.25 = 0.75        -> W = [0.75]
    # B_0 = (1 * 0.5 + 0 * 0.75) / 1.25 = 0.4;  B_1 = (1 * 1.0) / 1.0 = 1 (only response 0 runs at t = 1)
    # A: response 0 = [1 - 0.4, 1 - 1] = [0.6, 0];  response 1 = [0 - 0.4, pad 0];  group of one: [0, 0]
    out = optimal_token_baseline_advantage(*_otb_case()).advantages
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.0], [-0.4, 0.0], [0.0, 0.0]], dtype=F64), atol=1e-7, rtol=0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_optimal_token_baseline_properties(seed):
    g = torch.Generator().manual_seed(seed)
    b, r = 6, 4
    scores = torch.randint(0, 2, (b,), generator=g).to(F64)
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    lengths = torch.randint(1, r + 1, (b,), generator=g)
    mask = (torch.arange(r) < lengths.unsqueeze(-1)).to(F64)
    old = torch.log(torch.rand(b, r, generator=g, dtype=F64) * 0.9 + 0.05)
    spi = old.exp().square() + 0.1 * torch.rand(b, r, generator=g, dtype=F64)
    out = optimal_token_baseline_advantage(scores, group, mask, old, spi).advantages
    # padding is 0 and what lies there does not matter
    assert (out[mask == 0] == 0).all()
    junk = lambda x: torch.where(mask.bool(), x, torch.full_like(x, NAN))
    torch.testing.assert_close(optimal_token_baseline_advantage(scores, group, mask, junk(old), junk(spi)).advantages, out)
    # permuting the responses permutes the advantages
    perm = torch.randperm(b, generator=g)
    torch.testing.assert_close(optimal_token_baseline_advantage(scores[perm], group[perm], mask[perm], old[perm], spi[perm]).advantages, out[perm])
    # with equal lengths and equal energies everywhere the baseline is the group mean (Dr.GRPO's advantage)
    full = torch.ones(b, r, dtype=F64)
    flat = optimal_token_baseline_advantage(scores, group, full, torch.full((b, r), LN(0.5), dtype=F64),
                                            torch.full((b, r), 0.5, dtype=F64), eps=0.0).advantages
    means = torch.stack([scores[:3].mean()] * 3 + [scores[3:].mean()] * 3)
    torch.testing.assert_close(flat, (scores - means).unsqueeze(-1).expand(b, r))


def test_overlong_penalty_hand_worked():
    # R = 4, max_length 4, cache 2: lengths 1, 2, 3, 4 -> ramp (2 - L) / 2 = 0.5 (no bonus: 0), 0, -0.5, -1
    mask = (torch.arange(4) < torch.tensor([[1], [2], [3], [4]])).float()
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0])
    torch.testing.assert_close(overlong_penalty(scores, mask, cache_length=2).scores, torch.tensor([1.0, 1.0, -0.5, 0.0]))
    # max_length 3, cache 1: length 3 -> (2 - 3) / 1 = -1; length 4 > 3 -> -1; penalty 0.5 halves it
    torch.testing.assert_close(overlong_penalty(scores, mask, max_length=3, cache_length=1, penalty=0.5).scores,
                               torch.tensor([1.0, 1.0, -0.5, 0.5]))
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(scores, mask, cache_length=5)


def test_uniform_group_filter_hand_worked_and_whole_groups():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.3, 0.3])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3, 7, 7])
    keep = uniform_group_filter(scores, group, torch.ones(9, 2)).keep
    # group 0 all 1, group 2 all 0, group 3 alone, group 7 all 0.3: dropped; group 1 mixed: kept
    assert keep.tolist() == [False, False, True, True, False, False, False, False, False]
    assert keep.dtype == torch.bool


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_uniform_group_filter_keeps_exactly_groups_with_a_signal(seed):
    g = torch.Generator().manual_seed(seed)
    group = torch.randint(0, 4, (12,), generator=g)
    scores = torch.randint(0, 2, (12,), generator=g).float()
    keep = uniform_group_filter(scores, group, torch.ones(12, 3)).keep
    for label in group.unique():
        rows = group == label
        assert bool((keep[rows] == keep[rows][0]).all())  # a group is kept or dropped whole
        assert bool(keep[rows][0]) == (len(set(scores[rows].tolist())) > 1)
