"""Per-token KL estimators between two policies, and KL-in-reward shaping.

The estimators take log-probabilities of the *sampled* tokens under the policy
``p`` (``log_probs``) and the reference ``q`` (``ref_log_probs``) and estimate
``KL(p || q)`` when the tokens are sampled from ``p`` (J. Schulman,
"Approximating KL Divergence", 2020). With ``x = log p - log q``:

- ``k1`` (alias ``kl``):         ``x``                      unbiased, high variance, can be negative
- ``abs``:                       ``|x|``
- ``k2`` (alias ``mse``):        ``0.5 x^2``                biased, low variance, >= 0
- ``k3`` (alias ``low_var_kl``): ``exp(-x) + x - 1``        unbiased, low variance, >= 0

For ``k3`` the log-ratio is clamped to ``[-20, 20]`` before ``exp`` and the
result to ``[-10, 10]``, as verl's ``low_var_kl`` does, so a single token with
a vanishing reference probability cannot blow up the loss.

Straight-through variants ``k1+`` (``kl+``), ``abs+``, ``k3+`` (``low_var_kl+``) have
the *value* of the named estimator and the *gradient* of ``k2``:

    k+(x) = k2(x) - sg[k2(x)] + sg[k(x)],      grad k+ = x grad log p

As a loss on tokens sampled from ``p``, ``E_p[grad k1] = E_p[grad log p] = 0`` (k1 gives no
KL gradient at all) and ``grad k3`` is biased, while ``E_p[x grad log p] = grad KL(p || q)``:
``k2``'s gradient is the unbiased one. The ``+`` estimators keep an unbiased *value* for
logging (k1, k3) with that gradient. Reference: Zhang et al. 2025, "On the Design of
KL-Regularized Policy Gradient Algorithms for LLM Reasoning", arXiv 2505.17508.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .registry import register_op

__all__ = [
    "KL_TYPES", "kl_penalty", "masked_kl", "kl_in_reward", "score_to_token_rewards",
    "last_valid_token", "KLTokens", "ShapedRewards", "TokenRewards",
]

LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _abs(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.abs()


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    ref_minus_logp = (-log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # expm1(y) - y rather than exp(y) - y - 1: exact near y = 0, where the latter rounds to small negatives.
    return (torch.expm1(ref_minus_logp) - ref_minus_logp).clamp(-K3_CLAMP, K3_CLAMP)


def _straight_through(estimator: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The value of ``estimator``, the gradient of ``k2``."""

    def estimate(log_ratio: torch.Tensor) -> torch.Tensor:
        k2 = _k2(log_ratio)
        return k2 - k2.detach() + estimator(log_ratio).detach()

    return estimate


KL_TYPES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": _k1, "kl": _k1,
    "abs": _abs,
    "k2": _k2, "mse": _k2,
    "k3": _k3, "low_var_kl": _k3,
    "k1+": _straight_through(_k1), "kl+": _straight_through(_k1),
    "abs+": _straight_through(_abs),
    "k3+": _straight_through(_k3), "low_var_kl+": _straight_through(_k3),
}


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"shapes must match: {listed}")


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, *, kl_type: str) -> torch.Tensor:
    """Per-token estimate of ``KL(p || q)`` from sampled-token log-probs (estimators in the module docstring).

    Shapes: log_probs ``(b, r)``, ref_log_probs ``(b, r)`` -> ``(b, r)`` (any equal shapes work).
    Reference: J. Schulman, "Approximating KL Divergence" (2020).
    """
    try:
        estimator = KL_TYPES[kl_type]
    except KeyError:
        raise ValueError(f"unknown kl_type {kl_type!r}; valid types are: {', '.join(KL_TYPES)}") from None
    _check_same_shape(log_probs=log_probs, ref_log_probs=ref_log_probs)
    return estimator(log_probs - ref_log_probs)


def _masked_log_ratio_inputs(log_probs, ref_log_probs, mask):
    """Inputs with padding set to 0 so nan/inf there reaches neither value nor gradient."""
    _check_same_shape(log_probs=log_probs, ref_log_probs=ref_log_probs, response_mask=mask)
    valid = mask.to(torch.bool)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    return torch.where(valid, log_probs, zero), torch.where(valid, ref_log_probs, zero), valid


class KLTokens(NamedTuple):
    kl: torch.Tensor


@register_op(
    "kl",
    inputs=("old_log_probs: float32[B, R]", "ref_log_probs: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("kl: float32[B, R]",),
)
def masked_kl(old_log_probs: torch.Tensor, ref_log_probs: torch.Tensor, response_mask: torch.Tensor, *, kl_type: str = "k1") -> KLTokens:
    """Per-token KL estimate ``kl_penalty(old_log_probs, ref_log_probs)``, 0 at padding.

    Shapes: old_log_probs ``(b, r)``, ref_log_probs ``(b, r)``, response_mask ``(b, r)`` -> kl ``(b, r)``.
    Estimators as in the module docstring. Reference: J. Schulman 2020, "Approximating KL Divergence".
    """
    logp, ref, valid = _masked_log_ratio_inputs(old_log_probs, ref_log_probs, response_mask)
    kl = kl_penalty(logp, ref, kl_type=kl_type)
    return KLTokens(torch.where(valid, kl, torch.zeros_like(kl)))


def last_valid_token(response_mask: torch.Tensor) -> torch.Tensor:
    """Boolean ``(b, r)`` marking the last valid position of each row (an all-padding row marks none)."""
    valid = response_mask.to(torch.bool)
    positions = torch.arange(valid.shape[-1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=-1, keepdim=True).values
    return (positions == last) & valid


class TokenRewards(NamedTuple):
    token_rewards: torch.Tensor


@register_op(
    "score_to_token_rewards",
    inputs=("scores: float32[B]", "response_mask: float32[B, R]"),
    outputs=("token_rewards: float32[B, R]",),
)
def score_to_token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> TokenRewards:
    """Place each sequence's score on its last valid token, 0 elsewhere.

    Shapes: scores ``(b,)``, response_mask ``(b, r)`` -> token_rewards ``(b, r)``.
    ``token_rewards[i, t] = scores[i]`` if ``t`` is the last valid position of row ``i``.
    This is the outcome reward of RLHF (Stiennon et al. 2020; Ouyang et al. 2022).
    """
    if scores.dim() != 1 or scores.shape[0] != response_mask.shape[0]:
        raise ValueError(f"scores must be (b,) with b = {response_mask.shape[0]} rows of response_mask, got {tuple(scores.shape)}")
    last = last_valid_token(response_mask)
    placed = scores.to(torch.result_type(scores, 0.0)).unsqueeze(-1).expand(last.shape)
    return TokenRewards(torch.where(last, placed, torch.zeros_like(placed)))


class ShapedRewards(NamedTuple):
    token_rewards: torch.Tensor
    kl: torch.Tensor


@register_op(
    "kl_in_reward",
    inputs=("scores: float32[B]", "old_log_probs: float32[B, R]", "ref_log_probs: float32[B, R]", "response_mask: float32[B, R]"),
    outputs=("token_rewards: float32[B, R]",),
)
def kl_in_reward(
    scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_coef: float = 0.001,
    kl_type: str = "k1",
) -> ShapedRewards:
    """Token rewards penalised by KL to the reference, with the score on the last valid token.

    Shapes: scores ``(b,)``, old_log_probs ``(b, r)``, ref_log_probs ``(b, r)``,
    response_mask ``(b, r)`` -> token_rewards ``(b, r)``, kl ``(b, r)``; both 0 at padding.

    ``token_rewards[i, t] = -kl_coef * kl[i, t] + [t = last_i] * scores[i]`` where
    ``kl = kl_penalty(old_log_probs, ref_log_probs, kl_type=kl_type)``.
    Reference: Ouyang et al. 2022 (InstructGPT, eq. 2); Stiennon et al. 2020.
    """
    kl = masked_kl(old_log_probs, ref_log_probs, response_mask, kl_type=kl_type).kl
    rewards = score_to_token_rewards(scores, response_mask).token_rewards.to(kl.dtype)
    return ShapedRewards(rewards - kl_coef * kl, kl)
