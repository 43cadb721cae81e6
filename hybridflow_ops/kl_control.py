"""The adaptive KL coefficient of Ziegler et al. 2019, as a pure update rule."""
from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["KLCoefUpdate", "adaptive_kl_coef"]

PROPORTIONAL_ERROR_CLIP = 0.2


class KLCoefUpdate(NamedTuple):
    kl_coef: float
    error: float


def adaptive_kl_coef(kl_coef: float, current_kl: float, *, target_kl: float, horizon: int, n_steps: int = 1) -> KLCoefUpdate:
    """One step of the proportional controller that steers the measured KL towards ``target_kl``.

    Scalars in, scalars out (a 0-d tensor ``current_kl`` is read with ``float``).

        e      = clip(current_kl / target_kl - 1, -0.2, 0.2)
        beta' = beta * (1 + e * n_steps / horizon)                  (Ziegler et al. 2019)

    ``n_steps`` is the number of samples (or steps) since the last update and ``horizon``
    the controller's time constant: with ``n_steps / horizon = K_beta`` this is the paper's
    ``beta_{t+1} = beta_t (1 + K_beta e_t)`` (they use ``K_beta = 0.1``). The error is
    clipped, so one update moves ``beta`` by at most ``20% * n_steps / horizon``; the state
    ``beta`` is the caller's to keep (e.g. checkpointed run state), this function keeps none.
    Returns the new coefficient and the clipped error ``e``.
    Reference: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", arXiv 1909.08593.
    """
    current_kl, kl_coef = float(current_kl), float(kl_coef)
    if target_kl <= 0 or horizon <= 0 or n_steps < 0:
        raise ValueError(f"need target_kl > 0, horizon > 0 and n_steps >= 0; got {target_kl}, {horizon}, {n_steps}")
    if n_steps > horizon / PROPORTIONAL_ERROR_CLIP:
        raise ValueError(f"n_steps / horizon = {n_steps / horizon} > 5 could drive the coefficient negative; lengthen the horizon")
    if not math.isfinite(current_kl) or kl_coef < 0:
        raise ValueError(f"current_kl must be finite and kl_coef >= 0, got {current_kl}, {kl_coef}")
    error = min(max(current_kl / target_kl - 1.0, -PROPORTIONAL_ERROR_CLIP), PROPORTIONAL_ERROR_CLIP)
    return KLCoefUpdate(kl_coef * (1.0 + error * n_steps / horizon), error)
