"""Every policy-gradient loss takes IS weights (its ``<loss>_is`` op): hand-worked cases and properties."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hybridflow_ops as ops
from hybridflow_ops import IS_WEIGHTED_LOSSES, get_op
from hybridflow_ops.registry import OpRegistryError, register_op, unregister_op

F64 = torch.float64
# Losses whose per-token loss depends on nothing but the token (and its row's advantage): for them, weighting by
# a 0/1 indicator is the same as masking the other tokens out while keeping the token count of the full mask.
TOKEN_LOCAL = ("ppo_clip", "cispo", "reinforce", "gpg", "dro", "sapo", "dppo_tv", "dppo_kl")
ATTRS = {"kl_cov": {"kl_cov_ratio": 0.2}, "clip_cov": {"clip_cov_ratio": 0.2}}


def _batch(seed, b=4, r=6):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, r, generator=gen) > 0.25).to(F64)
    mask[:, 0] = 1.0
    old = -torch.rand(b, r, generator=gen, dtype=F64) * 2 - 0.05
    log_probs = old + torch.randn(b, r, generator=gen, dtype=F64) * 0.3
    adv = torch.randn(b, 1, generator=gen, dtype=F64).expand(b, r).contiguous()
    return log_probs, old, adv, mask


def _args(name, log_probs, old, adv, mask):
    inputs = {"log_probs": log_probs, "old_log_probs": old, "advantages": adv, "response_mask": mask}
    spec = get_op(name)
    return [inputs[f.name] for f in spec.model_inputs + spec.inputs]


def _loss_and_grad(name, log_probs, old, adv, mask, weights=None, **attrs):
    lp = log_probs.clone().requires_grad_(True)
    args = _args(name, lp, old, adv, mask) + ([] if weights is None else [weights])
    loss = get_op(name if weights is None else f"{name}_is")(*args, **ATTRS.get(name, {}), **attrs).loss
    (grad,) = torch.autograd.grad(loss, lp)
    return loss, grad


def test_every_policy_gradient_loss_has_an_is_variant_declared_a_correction():
    plain = {s.name for s in ops.list_ops("loss")
             if s.policy_gradient and not s.name.endswith("_is") and s.fn.__module__.startswith("hybridflow_ops.")}
    assert plain == set(IS_WEIGHTED_LOSSES)
    for name in IS_WEIGHTED_LOSSES:
        base, weighted = get_op(name), get_op(f"{name}_is")
        assert weighted.input_names == base.input_names + ("is_weights",)
        assert weighted.attrs == base.attrs and weighted.policy_gradient and weighted.correction
        assert weighted.ratio_input == base.ratio_input and weighted.vanishes_with == base.vanishes_with


@pytest.mark.parametrize("name", IS_WEIGHTED_LOSSES)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_unit_weights_change_nothing(name, seed):
    log_probs, old, adv, mask = _batch(seed)
    loss, grad = _loss_and_grad(name, log_probs, old, adv, mask)
    loss_w, grad_w = _loss_and_grad(name, log_probs, old, adv, mask, weights=mask.clone())
    torch.testing.assert_close(loss_w, loss)
    torch.testing.assert_close(grad_w, grad)


@pytest.mark.parametrize("name", TOKEN_LOCAL)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_a_zero_one_weight_is_masking_with_the_full_token_count(name, seed):
    log_probs, old, adv, mask = _batch(seed)
    keep = (torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed + 1)) > 0.4).to(F64) * mask
    loss_w, grad_w = _loss_and_grad(name, log_probs, old, adv, mask, weights=keep, loss_agg_mode="token-mean")
    loss_m, grad_m = _loss_and_grad(name, log_probs, old, adv, keep, loss_agg_mode="token-mean",
                                    global_tokens=float(mask.sum()))
    torch.testing.assert_close(loss_w, loss_m)
    torch.testing.assert_close(grad_w, grad_m)


@pytest.mark.parametrize("name", [n for n in IS_WEIGHTED_LOSSES if n != "gmpo"])
def test_the_weight_multiplies_each_token_loss(name):
    # token-sum: the loss is sum_t w_t l_t, so doubling one token's weight adds that token's weighted loss again.
    log_probs, old, adv, mask = _batch(3)
    weights = torch.full_like(mask, 0.5) * mask
    doubled = weights.clone()
    doubled[1, 0] = 1.0
    single = torch.zeros_like(mask)
    single[1, 0] = 0.5
    base, _ = _loss_and_grad(name, log_probs, old, adv, mask, weights=weights, loss_agg_mode="token-sum")
    more, _ = _loss_and_grad(name, log_probs, old, adv, mask, weights=doubled, loss_agg_mode="token-sum")
    alone, _ = _loss_and_grad(name, log_probs, old, adv, mask, weights=single, loss_agg_mode="token-sum")
    torch.testing.assert_close(more - base, alone)


def test_weights_are_detached():
    log_probs, old, adv, mask = _batch(0)
    for name in IS_WEIGHTED_LOSSES:
        weights = (mask * 0.7).requires_grad_(True)
        args = _args(name, log_probs.clone().requires_grad_(True), old, adv, mask) + [weights]
        loss = get_op(f"{name}_is")(*args, **ATTRS.get(name, {})).loss
        loss.backward()
        assert weights.grad is None, name


def test_ppo_clip_is_hand_worked():
    # One token: r = pi / pi_old = e^0.1 = 1.10517, A = 1, clip 0.2 -> unclipped; l = -1.10517; w = 0.5 -> -0.55259.
    lp, old = torch.tensor([[-1.0]], dtype=F64), torch.tensor([[-1.1]], dtype=F64)
    out = ops.ppo_clip_is(lp, old, torch.ones(1, 1, dtype=F64), torch.ones(1, 1, dtype=F64), torch.full((1, 1), 0.5, dtype=F64))
    assert out.loss.item() == pytest.approx(-0.5 * math.exp(0.1), abs=1e-12)


def test_reinforce_is_hand_worked():
    # l = -w A log pi = -0.5 * 2 * log 0.5 = 0.693147 (one token, seq-mean-token-sum over one response).
    lp = torch.tensor([[math.log(0.5)]], dtype=F64)
    out = ops.reinforce_is(lp, torch.full((1, 1), 2.0, dtype=F64), torch.ones(1, 1, dtype=F64), torch.full((1, 1), 0.5, dtype=F64))
    assert out.loss.item() == pytest.approx(math.log(2.0), abs=1e-12)


def test_gmpo_is_weights_enter_the_geometric_mean():
    # One response, 2 tokens, pi = pi_old (ratios 1), A = 1: L = -1 * 1. Weights (4, 1): geometric mean 2 -> L = -2.
    # Weights (4, 0): a zeroed token drives the geometric mean to (4 * 1e-10)^(1/2) = 2e-5.
    lp = torch.log(torch.tensor([[0.5, 0.25]], dtype=F64))
    adv, mask = torch.ones(1, 2, dtype=F64), torch.ones(1, 2, dtype=F64)
    assert ops.gmpo(lp, lp, adv, mask).loss.item() == pytest.approx(-1.0)
    assert ops.gmpo_is(lp, lp, adv, mask, torch.tensor([[4.0, 1.0]], dtype=F64)).loss.item() == pytest.approx(-2.0)
    zeroed = ops.gmpo_is(lp, lp, adv, mask, torch.tensor([[4.0, 0.0]], dtype=F64)).loss.item()
    assert zeroed == pytest.approx(-math.sqrt(4.0 * (1e-10)), rel=1e-6)


def test_is_weights_of_the_wrong_shape_are_refused():
    log_probs, old, adv, mask = _batch(0)
    with pytest.raises(ValueError, match="is_weights of shape"):
        ops.gspo_is(log_probs, old, adv, mask, mask[:, :3])


def test_registry_optional_trailing_tensors():
    def op_with_optional(x, mask, extra=None, *, scale=1.0):
        return (x * scale if extra is None else x * extra,)

    try:
        register_op("test_opt_plain", inputs=("x: float32[B]", "mask: float32[B]"), outputs=("y: float32[B]",))(op_with_optional)
        register_op("test_opt_full", inputs=("x: float32[B]", "mask: float32[B]", "extra: float32[B]"),
                    outputs=("y: float32[B]",))(op_with_optional)
        assert get_op("test_opt_plain").attrs == ("scale",) and get_op("test_opt_full").input_names[-1] == "extra"
        with pytest.raises(OpRegistryError, match="positional"):  # one declared field too few
            register_op("test_opt_bad", inputs=("x: float32[B]",), outputs=("y: float32[B]",))(op_with_optional)

        def not_none_default(x, extra=1.0):
            return (x,)

        with pytest.raises(OpRegistryError, match="default to None"):
            register_op("test_opt_bad", inputs=("x: float32[B]",), outputs=("y: float32[B]",))(not_none_default)
    finally:
        for name in ("test_opt_plain", "test_opt_full", "test_opt_bad"):
            unregister_op(name)
