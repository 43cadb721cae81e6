"""A generator's byte state (``torch.Generator.get_state()``, ``torch.get_rng_state()``: a uint8 tensor) as text
for JSON files, and back. Checkpoints store every RNG this way: the train engines' mini-batch shuffle
generators, the rollout engines' sampling generators and the controller's global RNGs."""
from __future__ import annotations

import base64

import torch

__all__ = ["state_to_text", "state_from_text"]


def state_to_text(state: torch.Tensor) -> str:
    """Base64 of the bytes of a uint8 state tensor."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def state_from_text(text: str) -> torch.Tensor:
    """The uint8 state tensor whose :func:`state_to_text` is ``text`` (a copy the caller owns)."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()
