"""Response text from response token ids: EOS stripped, padding dropped."""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["decode_responses", "ends_with_eos", "response_lengths"]


def response_lengths(response_mask: torch.Tensor) -> torch.Tensor:
    """Number of valid positions of each response (last position with mask > 0, plus 1): ``(b, R)`` -> ``(b,)``."""
    valid = (response_mask > 0).long()
    positions = torch.arange(1, valid.shape[-1] + 1, device=valid.device)
    return (valid * positions).amax(dim=-1) if valid.shape[-1] else valid.sum(dim=-1)


def ends_with_eos(response_ids: torch.Tensor, response_mask: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """Whether each response's last valid token is an EOS id: ``(b, R)`` -> ``(b,)`` bool."""
    lengths = response_lengths(response_mask)
    last = response_ids.gather(-1, (lengths - 1).clamp(min=0)[:, None]).squeeze(-1)
    eos = torch.tensor(list(eos_token_ids), dtype=response_ids.dtype, device=response_ids.device)
    return (lengths > 0) & torch.isin(last, eos)


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor,
                     eos_token_ids: Sequence[int]) -> list[str]:
    """The text of each response: its valid tokens, without a final EOS, decoded as they are.

    Other special tokens the model produced are kept in the text (``skip_special_tokens=False``),
    so a reward function sees exactly what was generated. Each distinct id sequence is decoded once
    (a group's responses often repeat: short answers, a small vocabulary).
    """
    lengths = response_lengths(response_mask).tolist()
    eos = set(int(i) for i in eos_token_ids)
    decoded: dict[tuple[int, ...], str] = {}
    texts = []
    for row, length in zip(response_ids.tolist(), lengths):
        ids = row[:length]
        if ids and ids[-1] in eos:
            ids = ids[:-1]
        key = tuple(ids)
        if key not in decoded:
            decoded[key] = tokenizer.decode(ids, skip_special_tokens=False)
        texts.append(decoded[key])
    return texts
