"""Shared checks and helpers of the advantage estimators."""
from __future__ import annotations

import torch

__all__ = ["check_token_inputs", "check_sequence_inputs", "broadcast_to_tokens", "select_valid"]


def check_token_inputs(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    """Every ``(b, r)`` tensor matches ``mask``'s shape, and ``mask`` is 2-D."""
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be (batch, response_len), got shape {tuple(mask.shape)}")
    for name, tensor in tensors.items():
        if tensor.shape != mask.shape:
            raise ValueError(f"{name} of shape {tuple(tensor.shape)} must match response_mask of shape {tuple(mask.shape)}")


def check_sequence_inputs(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    """Every per-sequence tensor is ``(b,)`` with ``b`` the rows of ``mask``."""
    check_token_inputs(mask)
    for name, tensor in tensors.items():
        if tensor.shape != (mask.shape[0],):
            raise ValueError(f"{name} must have shape ({mask.shape[0]},) (one entry per response), got {tuple(tensor.shape)}")


def select_valid(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``values`` with padding replaced by 0, so nan/inf there cannot leak."""
    return torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))


def broadcast_to_tokens(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(b,)`` -> ``(b, r)``: the sequence's value on each valid token, 0 at padding."""
    valid = mask.to(torch.bool)
    return select_valid(per_sequence.unsqueeze(-1).expand(valid.shape), valid)
