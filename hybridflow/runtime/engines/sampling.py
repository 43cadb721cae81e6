"""Sampling settings and the pure functions of one decoding step.

A decoding step turns the last position's logits ``(b, v)`` into a token per
row and the log-probability of that token. The log-probability reported is
always taken under ``softmax(logits / temperature)`` over the *whole*
vocabulary, before top-k / top-p truncation (and for greedy decoding too):

    rollout_log_prob = log_softmax(logits / T)[token]

This is the quantity the train engine recomputes from the same weights
(``log_softmax(lm_head(h) / T)`` gathered at the response tokens), so with
identical weights the first PPO ratio ``exp(log_probs - old_log_probs)`` is
exactly 1 up to float error. Truncation only decides which tokens may be drawn;
the probability of the drawn token under the truncated, renormalised
distribution would be larger and would not match what the trainer computes
(verl and OpenRLHF make the same choice).
"""
from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SamplingParams", "scaled_log_probs", "truncate_logits", "choose_tokens"]


class SamplingParams(BaseModel):
    """How the rollout engine decodes responses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(1, ge=1, description="Responses sampled per prompt (a group, for GRPO/RLOO).")
    max_new_tokens: int = Field(32, ge=1, description="Response length limit; responses are right-padded to it.")
    temperature: float = Field(1.0, gt=0.0, description="Logits are divided by it before sampling and for the log-probs.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: draw from the smallest set of tokens whose probability reaches top_p (1 = off).")
    top_k: int = Field(0, ge=0, description="Draw from the k most likely tokens only (0 = off).")
    greedy: bool = Field(False, description="Take the argmax token at every step (temperature, top-p and top-k do not change the choice).")
    stop_at_eos: bool = Field(True, description="End a response at its first EOS token (kept and masked in); the rest is padding.")
    seed: int | None = Field(None, description="Seed of the sampling generator for reproducible rollouts; None uses torch's global RNG.")
    keep_products: bool = Field(True, description="An update may read these responses: a rollout engine that keeps a decode's products for the update (hf: its keep_products option, decode_tape) may keep them. The executor sets it False for a generation no update of the same role reads (validation, ReMax's greedy baseline).")


def scaled_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` in float32.

    Shapes: logits ``(b, v)`` -> ``(b, v)`` float32.

    At ``T = 1`` the division is left out (``x / 1 == x`` for every float), as is the cast of
    float32 logits: the same numbers, two ops fewer per decoding step.
    """
    if logits.dtype != torch.float32:
        logits = logits.float()
    return torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)


def truncate_logits(log_probs: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set to ``-inf`` every entry outside the top-k / top-p support (top-k first, then top-p).

    Shapes: log_probs ``(b, v)`` (normalised, e.g. from :func:`scaled_log_probs`) -> ``(b, v)``.

    top-k keeps exactly the ``k`` largest entries of a row (ties broken by index).
    top-p (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration",
    Sec. 3.1) then renormalises the survivors and keeps, in decreasing order, the
    tokens whose preceding cumulative probability is below ``top_p``: the smallest
    prefix whose mass reaches ``top_p``; the most likely token is always kept.
    """
    out = log_probs
    vocab = log_probs.shape[-1]
    if 0 < top_k < vocab:
        keep = torch.zeros_like(out, dtype=torch.bool).scatter_(-1, out.topk(top_k, dim=-1).indices, True)
        out = out.masked_fill(~keep, float("-inf"))
    if top_p < 1.0:
        sorted_lp, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(sorted_lp, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def choose_tokens(log_probs: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row: the argmax when greedy, else a draw from the truncated distribution.

    Shapes: log_probs ``(b, v)`` from :func:`scaled_log_probs` -> tokens ``(b,)`` int64.
    """
    if params.greedy:
        return log_probs.argmax(dim=-1)
    allowed = truncate_logits(log_probs, top_k=params.top_k, top_p=params.top_p)
    probs = torch.softmax(allowed, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
