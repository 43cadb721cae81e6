"""Top-k / top-p truncation and token choice (hybridflow.runtime.engines.sampling)."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from hybridflow.runtime.engines.sampling import SamplingParams, choose_tokens, scaled_log_probs, truncate_logits

NEG = float("-inf")


def test_top_k_keeps_exactly_the_k_largest():
    # logits [0, 3, 1, 2]: the two largest are indices 1 (3) and 3 (2).
    lp = torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, 2.0]]), -1)
    out = truncate_logits(lp, top_k=2)
    assert torch.isfinite(out).tolist() == [[False, True, False, True]]
    assert torch.equal(out[0, [1, 3]], lp[0, [1, 3]])


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # probs [0.5, 0.3, 0.15, 0.05]; mass before each in sorted order: 0, 0.5, 0.8, 0.95.
    lp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    keep = lambda p: torch.isfinite(truncate_logits(lp, top_p=p))[0].tolist()
    assert keep(0.7) == [True, True, False, False]     # 0.5 < 0.7 -> also keep the 0.3
    assert keep(0.5) == [True, False, False, False]    # 0.5 alone reaches 0.5
    assert keep(0.81) == [True, True, True, False]     # 0.8 < 0.81
    assert keep(0.01) == [True, False, False, False]   # the most likely token always stays


def test_top_p_applies_to_the_renormalised_top_k():
    # probs [0.4, 0.3, 0.2, 0.1]; top_k=2 leaves [0.4, 0.3] -> renormalised [4/7, 3/7]; top_p 0.5 keeps only 4/7.
    lp = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    assert torch.isfinite(truncate_logits(lp, top_k=2, top_p=0.5))[0].tolist() == [True, False, False, False]
    # without top_k, 0.4 < 0.5 so the 0.3 stays as well
    assert torch.isfinite(truncate_logits(lp, top_p=0.5))[0].tolist() == [True, True, False, False]


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), top_p=st.floats(0.05, 0.99))
def test_top_p_support_is_minimal(seed, top_p):
    # The kept set has mass >= p, and without its least likely member it would have mass < p.
    gen = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(1, 12, generator=gen) * 3, -1)
    kept = torch.isfinite(truncate_logits(lp, top_p=top_p))[0]
    probs = lp[0].exp()
    mass = probs[kept].sum().item()
    assert mass >= top_p - 1e-6
    assert mass - probs[kept].min().item() < top_p + 1e-6


def test_samples_stay_in_the_support():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 20, generator=gen)
    lp = scaled_log_probs(logits.repeat(500, 1), 0.8)
    params = SamplingParams(top_k=3, top_p=0.9)
    tokens = choose_tokens(lp, params, torch.Generator().manual_seed(1)).view(500, 4)
    support = torch.isfinite(truncate_logits(lp[:4], top_k=3, top_p=0.9))
    for row in range(4):
        drawn = set(tokens[:, row].tolist())
        allowed = set(torch.nonzero(support[row]).flatten().tolist())
        assert drawn <= allowed
        assert len(drawn) == len(allowed)  # 500 draws hit every allowed token


def test_top_k_1_is_greedy():
    lp = scaled_log_probs(torch.randn(64, 30, generator=torch.Generator().manual_seed(2)), 1.3)
    sampled = choose_tokens(lp, SamplingParams(top_k=1), torch.Generator().manual_seed(3))
    assert torch.equal(sampled, lp.argmax(-1))
    assert torch.equal(choose_tokens(lp, SamplingParams(greedy=True, top_k=5), None), lp.argmax(-1))


def test_scaled_log_probs_divide_by_temperature():
    logits = torch.tensor([[0.0, math.log(3.0)]])
    # T = 1: softmax [1/4, 3/4]; T -> logits / 0.5 = [0, log 9]: [1/10, 9/10]
    assert torch.allclose(scaled_log_probs(logits, 1.0).exp(), torch.tensor([[0.25, 0.75]]))
    assert torch.allclose(scaled_log_probs(logits, 0.5).exp(), torch.tensor([[0.1, 0.9]]))


def test_params_are_validated():
    with pytest.raises(ValueError):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError):
        SamplingParams(n=0)
