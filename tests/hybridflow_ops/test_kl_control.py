"""The adaptive KL coefficient (Ziegler et al. 2019)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import adaptive_kl_coef


def test_adaptive_kl_coef_hand_worked():
    # beta = 0.1, target 0.1, n_steps / horizon = 256 / 10000 = 0.0256.
    # KL 0.11: e = 0.1                  -> 0.1 * (1 + 0.1 * 0.0256) = 0.100256
    # KL 0.12: e = 0.2 (at the clip)    -> 0.1 * 1.00512 = 0.100512;  KL 1.0: e = 9, clipped to 0.2 -> same
    # KL 0.05: e = -0.5, clipped -0.2   -> 0.1 * 0.99488 = 0.099488
    kw = dict(target_kl=0.1, horizon=10_000, n_steps=256)
    for kl, beta, err in ((0.11, 0.100256, 0.1), (0.12, 0.100512, 0.2), (1.0, 0.100512, 0.2), (0.05, 0.099488, -0.2)):
        out = adaptive_kl_coef(0.1, kl, **kw)
        assert out.kl_coef == pytest.approx(beta, abs=1e-12) and out.error == pytest.approx(err, abs=1e-12)
    assert adaptive_kl_coef(0.1, torch.tensor(0.11), **kw).kl_coef == pytest.approx(0.100256, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(beta=st.floats(0.0, 10.0), kl=st.floats(0.0, 100.0), target=st.floats(1e-3, 10.0),
       horizon=st.integers(1, 100_000), frac=st.floats(0.0, 5.0))
def test_adaptive_kl_coef_moves_towards_the_target_by_at_most_the_clip(beta, kl, target, horizon, frac):
    n_steps = int(frac * horizon)
    out = adaptive_kl_coef(beta, kl, target_kl=target, horizon=horizon, n_steps=n_steps)
    assert out.kl_coef >= 0
    assert abs(out.kl_coef - beta) <= 0.2 * beta * n_steps / horizon + 1e-12
    if kl > target:
        assert out.kl_coef >= beta
    if kl < target:
        assert out.kl_coef <= beta
    assert adaptive_kl_coef(beta, target, target_kl=target, horizon=horizon, n_steps=n_steps).kl_coef == pytest.approx(beta)


def test_adaptive_kl_coef_rejects_bad_arguments():
    with pytest.raises(ValueError, match="horizon"):
        adaptive_kl_coef(0.1, 0.1, target_kl=0.1, horizon=0)
    with pytest.raises(ValueError, match="negative"):
        adaptive_kl_coef(0.1, 0.1, target_kl=0.1, horizon=10, n_steps=60)
