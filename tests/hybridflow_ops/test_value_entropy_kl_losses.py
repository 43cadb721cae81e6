"""Value clip loss, entropy from logits, the entropy bonus and the KL loss."""
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import entropy_bonus, entropy_from_logits, kl_loss, value_clip

NAN = float("nan")


def test_value_clip_hand_worked():
    # clip_range = 0.2.
    # t0: V_old = 1, pred 1.5 -> V_clip = 1.2; R = 2: (1.5-2)^2 = 0.25, (1.2-2)^2 = 0.64 -> 0.5*0.64 = 0.32 (clipped)
    # t1: V_old = 1, pred 0.9 (inside the range) -> both (0.9-0)^2 = 0.81 -> 0.405
    # t2: V_old = 0, pred -0.1 -> both 0.01 -> 0.005
    # t3: padding.
    # token-mean = (0.32 + 0.405 + 0.005) / 3 = 0.243333;  vf_clipfrac = 1/3;  vpred_mean = (1.5 + 0.9 - 0.1) / 3
    preds = torch.tensor([[1.5, 0.9, -0.1, NAN]], requires_grad=True)
    values = torch.tensor([[1.0, 1.0, 0.0, NAN]])
    returns = torch.tensor([[2.0, 0.0, 0.0, math.inf]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = value_clip(preds, values, returns, mask, clip_range=0.2)
    torch.testing.assert_close(out.loss, torch.tensor(0.73 / 3))
    torch.testing.assert_close(out.vf_clipfrac, torch.tensor(1 / 3))
    torch.testing.assert_close(out.vpred_mean, torch.tensor(2.3 / 3))
    out.loss.backward()
    # t0 takes the clipped branch (no gradient); t1: (0.9 - 0) / 3 = 0.3; t2: -0.1 / 3; padding 0.
    torch.testing.assert_close(preds.grad, torch.tensor([[0.0, 0.3, -0.1 / 3, 0.0]]))


def test_entropy_from_logits_hand_worked():
    # [0, 0]: uniform over 2 -> ln 2 = 0.693147.
    # [0, ln 3]: p = [1/4, 3/4] -> -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335
    # [1000, 1000, -inf]: no overflow, the banned token contributes 0 -> ln 2.
    # [1e4, 0]: all mass on one token -> 0.
    logits = torch.tensor([[[0.0, 0.0, -math.inf], [0.0, math.log(3.0), -math.inf]],
                           [[1000.0, 1000.0, -math.inf], [1e4, 0.0, -math.inf]]])
    out = entropy_from_logits(logits)
    assert out.shape == (2, 2)
    torch.testing.assert_close(out, torch.tensor([[math.log(2), 0.562335], [math.log(2), 0.0]]), atol=1e-6, rtol=0)


@settings(max_examples=50, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 4), v=st.integers(2, 10), scale=st.floats(0.1, 30), seed=st.integers(0, 10_000))
def test_entropy_from_logits_matches_definition_and_has_finite_gradient(b, t, v, scale, seed):
    logits = (torch.randn(b, t, v, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale).requires_grad_(True)
    out = entropy_from_logits(logits)
    p = torch.softmax(logits.detach(), -1)
    expected = -(p * torch.log(p.clamp(min=1e-300))).sum(-1)
    torch.testing.assert_close(out.detach(), expected)
    assert torch.all(out >= -1e-12) and torch.all(out <= math.log(v) + 1e-9)
    out.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_from_logits_bfloat16_is_computed_in_float32():
    out = entropy_from_logits(torch.zeros(1, 1, 4, dtype=torch.bfloat16))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[math.log(4)]]))


def test_entropy_bonus_hand_worked():
    # Entropies [1, 3 | 2, pad]; token-mean = 6/3 = 2; loss = -2 (the term's weight scales it, not the op).
    entropy = torch.tensor([[1.0, 3.0], [2.0, NAN]], requires_grad=True)
    out = entropy_bonus(entropy, torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    torch.testing.assert_close(out.loss, torch.tensor(-2.0))
    torch.testing.assert_close(out.entropy, torch.tensor(2.0))
    out.loss.backward()
    torch.testing.assert_close(entropy.grad, torch.tensor([[-1 / 3, -1 / 3], [-1 / 3, 0.0]]))


def test_kl_loss_hand_worked():
    # k3 with x = log_probs - ref: row 0: x = 0.5 -> e^-0.5 + 0.5 - 1 = 0.106531; x = 0 -> 0.
    # Row 1: x = -ln 2 -> 2 - ln 2 - 1 = 0.306853; padding ignored.
    # seq-mean-token-mean = ((0.106531 + 0) / 2 + 0.306853) / 2 = 0.180059 (the loss; a term's weight scales it)
    log_probs = torch.tensor([[-1.0, -2.0], [math.log(0.25), NAN]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0], [math.log(0.5), 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = kl_loss(log_probs, ref, mask, kl_type="low_var_kl", loss_agg_mode="seq-mean-token-mean")
    torch.testing.assert_close(out.loss, torch.tensor(0.180059), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.kl, torch.tensor((0.106531 + 0.306853) / 3), atol=1e-6, rtol=0)
    out.loss.backward()
    assert torch.isfinite(log_probs.grad).all() and log_probs.grad[1, 1] == 0
