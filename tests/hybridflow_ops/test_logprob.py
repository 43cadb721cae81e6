"""Chunked token log-probs against the naive ``log_softmax(h @ W.T).gather``."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import token_logprobs_from_hidden, token_logprobs_from_logits

torch.set_num_threads(1)


def naive(logits: torch.Tensor, ids: torch.Tensor):
    """The reference: full log-softmax in the logits' dtype, then gather."""
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, ids[..., None]).squeeze(-1), entropy


def make(b=3, t=5, h=16, v=37, dtype=torch.float32, seed=0, bias=False):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, h, generator=gen, dtype=dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=gen, dtype=dtype) / math.sqrt(h)).requires_grad_()
    bias_t = torch.randn(v, generator=gen, dtype=dtype).requires_grad_() if bias else None
    ids = torch.randint(0, v, (b, t), generator=gen)
    return hidden, weight, bias_t, ids


def grads(outputs, upstream, inputs):
    return torch.autograd.grad(outputs, [x for x in inputs if x is not None], upstream)


# ---------------------------------------------------------------- hand-worked

def test_hand_worked_two_token_vocab():
    # logits (0, ln 3): p = (1/4, 3/4). Token 1: log p = ln(3/4) = -0.28768.
    # entropy = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.34657 + 0.21576 = 0.56233.
    # d log p_1 / dz = onehot - p = (-1/4, 1/4).
    logits = torch.tensor([[[0.0, math.log(3.0)]]], requires_grad=True)
    out = token_logprobs_from_logits(logits, torch.tensor([[1]]), with_entropy=True)
    assert out.log_probs.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert out.entropy.item() == pytest.approx(0.5623351, abs=1e-6)
    out.log_probs.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[[-0.25, 0.25]]]))


def test_hand_worked_entropy_gradient():
    # Uniform over 2 tokens: H = ln 2 and dH/dz_j = -p_j (log p_j + H) = -1/2 (-ln 2 + ln 2) = 0.
    # logits (0, ln 3): dH/dz_0 = -1/4 (ln 1/4 + 0.56233) = 0.20599, dH/dz_1 = -0.20599.
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)]]], requires_grad=True)
    out = token_logprobs_from_logits(logits, torch.tensor([[0, 0]]), with_entropy=True)
    out.entropy.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[[0.0, 0.0], [0.2059929, -0.2059929]]]))


# ---------------------------------------------------------------- fused lm_head vs naive

@pytest.mark.parametrize("chunk_size", [1, 4, 7, 15, 1024])  # 15 rows in all: 4 and 7 do not divide it
@pytest.mark.parametrize("bias", [False, True])
def test_hidden_matches_naive_forward_and_grads(chunk_size, bias):
    hidden, weight, bias_t, ids = make(bias=bias)
    out = token_logprobs_from_hidden(hidden, weight, ids, bias=bias_t, chunk_size=chunk_size, with_entropy=True)
    logits = hidden @ weight.T + (bias_t if bias else 0.0)
    ref_lp, ref_ent = naive(logits, ids)
    torch.testing.assert_close(out.log_probs, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy, ref_ent, atol=1e-5, rtol=0)
    g = torch.randn_like(ref_lp)
    inputs = (hidden, weight, bias_t)
    for got, want in zip(grads(out.log_probs, g, inputs), grads(ref_lp, g, inputs)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_hidden_grads_through_log_probs_and_entropy_together():
    hidden, weight, bias_t, ids = make(seed=1, bias=True)
    out = token_logprobs_from_hidden(hidden, weight, ids, bias=bias_t, chunk_size=4, with_entropy=True,
                                     temperature=0.7)
    ref_lp, ref_ent = naive((hidden @ weight.T + bias_t) / 0.7, ids)
    g_lp, g_ent = torch.randn_like(ref_lp), torch.randn_like(ref_lp)
    loss, ref_loss = (out.log_probs * g_lp + out.entropy * g_ent).sum(), (ref_lp * g_lp + ref_ent * g_ent).sum()
    inputs = [hidden, weight, bias_t]
    for got, want in zip(torch.autograd.grad(loss, inputs), torch.autograd.grad(ref_loss, inputs)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_gradcheck_float64_with_entropy(temperature):
    hidden, weight, bias_t, ids = make(b=2, t=3, h=4, v=5, dtype=torch.float64, bias=True)

    def fn(h, w, b):
        return tuple(token_logprobs_from_hidden(h, w, ids, bias=b, chunk_size=4, with_entropy=True,
                                                temperature=temperature))
    assert torch.autograd.gradcheck(fn, (hidden, weight, bias_t))


def test_gradcheck_entropy_only_and_log_probs_only():
    hidden, weight, _, ids = make(b=1, t=5, h=3, v=6, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda h, w: token_logprobs_from_hidden(h, w, ids, chunk_size=2, with_entropy=True).entropy, (hidden, weight))
    assert torch.autograd.gradcheck(
        lambda h, w: token_logprobs_from_hidden(h, w, ids, chunk_size=2).log_probs, (hidden, weight))


def test_frozen_weight_gets_no_grad_and_inputs_are_untouched():
    hidden, weight, _, ids = make()
    weight = weight.detach()
    before = (hidden.detach().clone(), weight.clone(), ids.clone())
    out = token_logprobs_from_hidden(hidden, weight, ids, chunk_size=4)
    out.log_probs.sum().backward()
    assert weight.grad is None and hidden.grad is not None
    for now, then in zip((hidden.detach(), weight, ids), before):
        assert torch.equal(now, then)


def test_bfloat16_inputs_computed_in_float32():
    hidden, weight, _, ids = make(dtype=torch.bfloat16, v=50)
    out = token_logprobs_from_hidden(hidden, weight, ids, chunk_size=4, with_entropy=True)
    assert out.log_probs.dtype == torch.float32 and out.entropy.dtype == torch.float32
    # reference: the same bf16 values, upcast once, everything in float32
    h32, w32 = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    ref_lp, ref_ent = naive(h32 @ w32.T, ids)
    torch.testing.assert_close(out.log_probs, ref_lp.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.entropy, ref_ent.detach(), atol=1e-5, rtol=1e-5)
    g = torch.randn_like(ref_lp)
    gh, gw = torch.autograd.grad(out.log_probs, (hidden, weight), g)
    rh, rw = torch.autograd.grad(ref_lp, (h32, w32), g)
    assert gh.dtype == gw.dtype == torch.bfloat16
    torch.testing.assert_close(gh.float(), rh.to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(gw.float(), rw.to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)


def test_forward_saves_nothing_of_size_rows_times_vocab():
    # The point of the op: autograd keeps no (b*t, v) tensor alive between forward and backward.
    hidden, weight, _, ids = make(b=4, t=8, h=4, v=64)
    big = hidden.shape[0] * hidden.shape[1] * weight.shape[0]

    def largest_saved(fn):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda x: sizes.append(x.numel()) or x, lambda x: x):
            fn()
        return max(sizes)
    assert largest_saved(lambda: naive(hidden @ weight.T, ids)) >= big  # the reference does (the check can fail)
    assert largest_saved(lambda: token_logprobs_from_hidden(hidden, weight, ids, chunk_size=8,
                                                            with_entropy=True)) < big


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 6), h=st.integers(1, 8), v=st.integers(2, 40),
       chunk_size=st.integers(1, 20), seed=st.integers(0, 2**16), temperature=st.sampled_from([1.0, 0.5, 2.0]))
def test_property_matches_naive_over_random_shapes(b, t, h, v, chunk_size, seed, temperature):
    hidden, weight, _, ids = make(b=b, t=t, h=h, v=v, seed=seed)
    out = token_logprobs_from_hidden(hidden, weight, ids, chunk_size=chunk_size, with_entropy=True,
                                     temperature=temperature)
    ref_lp, ref_ent = naive(hidden @ weight.T / temperature, ids)
    torch.testing.assert_close(out.log_probs, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.entropy, ref_ent, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(ref_lp)
    for got, want in zip(grads(out.log_probs, g, (hidden, weight)), grads(ref_lp, g, (hidden, weight))):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- from logits

@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
def test_logits_matches_naive(chunk_size):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, 37, generator=gen, requires_grad=True)
    ids = torch.randint(0, 37, (3, 5), generator=gen)
    out = token_logprobs_from_logits(logits, ids, chunk_size=chunk_size, with_entropy=True, temperature=0.8)
    ref_lp, ref_ent = naive(logits / 0.8, ids)
    torch.testing.assert_close(out.log_probs, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy, ref_ent, atol=1e-5, rtol=0)
    g_lp, g_ent = torch.randn_like(ref_lp), torch.randn_like(ref_lp)
    got, = torch.autograd.grad((out.log_probs * g_lp + out.entropy * g_ent).sum(), logits)
    want, = torch.autograd.grad((ref_lp * g_lp + ref_ent * g_ent).sum(), logits)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_logits_gradcheck_float64():
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[0, 4, 2], [1, 1, 3]])
    assert torch.autograd.gradcheck(
        lambda x: tuple(token_logprobs_from_logits(x, ids, chunk_size=4, with_entropy=True)), (logits,))


def test_logits_bfloat16_gives_float32_results_and_bfloat16_grad():
    logits = torch.randn(2, 3, 11).to(torch.bfloat16).requires_grad_()
    ids = torch.tensor([[0, 4, 2], [1, 10, 3]])
    out = token_logprobs_from_logits(logits, ids, chunk_size=2)
    ref_lp, _ = naive(logits.detach().float(), ids)
    assert out.log_probs.dtype == torch.float32
    torch.testing.assert_close(out.log_probs, ref_lp, atol=1e-6, rtol=1e-6)
    out.log_probs.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_masked_vocabulary_entries_give_zero_probability_not_nan():
    # -inf logits (a masked vocabulary): p = 0 there, entropy over the rest: (0, 0, -inf) -> ln 2.
    logits = torch.tensor([[[0.0, 0.0, -math.inf]]], requires_grad=True)
    out = token_logprobs_from_logits(logits, torch.tensor([[1]]), with_entropy=True)
    assert out.log_probs.item() == pytest.approx(-math.log(2.0))
    assert out.entropy.item() == pytest.approx(math.log(2.0))
    (out.log_probs + out.entropy).sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[[-0.5, 0.5, 0.0]]]))


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("kwargs, match", [
    ({"chunk_size": 0}, "chunk_size"),
    ({"temperature": 0.0}, "temperature"),
])
def test_bad_hyper_parameters_are_named(kwargs, match):
    hidden, weight, _, ids = make()
    with pytest.raises(ValueError, match=match):
        token_logprobs_from_hidden(hidden, weight, ids, **kwargs)


def test_bad_token_ids_are_named():
    hidden, weight, _, ids = make(v=37)
    with pytest.raises(ValueError, match=r"\[0, 37\)"):
        token_logprobs_from_hidden(hidden, weight, ids + 37)
    with pytest.raises(ValueError, match="must match"):
        token_logprobs_from_hidden(hidden, weight, ids[:, :2])
    with pytest.raises(ValueError, match="same h"):
        token_logprobs_from_hidden(hidden, weight[:, :3], ids)
    with pytest.raises(ValueError, match="integer"):
        token_logprobs_from_logits(torch.zeros(3, 5, 37), ids.float())
