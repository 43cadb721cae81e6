"""The reference role of a LoRA policy: the policy's own module with its adapters disabled.

With LoRA the policy's initial model *is* its base model (the adapters start at
``B = 0``), so the reference log-probs come from the policy's module under
:func:`~.lora.adapters_disabled` — no second copy of the base weights. The view
holds no state of its own; offloading its ``params`` moves the policy's module
(the memory it reads is the policy's).
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import torch

from hybridflow.errors import OpError

from .lora import adapters_disabled
from .train import TrainEngine

__all__ = ["BaseModelView"]


class BaseModelView:
    """Log-probs of ``policy``'s base model (adapters disabled) at ``temperature``, for a reference role ``role``."""

    is_value_model = False

    def __init__(self, policy: TrainEngine, *, role: str, temperature: float = 1.0):
        self.policy = policy
        self.role = role
        self.temperature = temperature

    @property
    def module(self) -> torch.nn.Module:
        return self.policy.module

    @property
    def config(self):
        """The policy's engine settings: its forwards (micro-batches, packing, precision) are the ones used here."""
        return self.policy.config

    @property
    def device(self) -> torch.device:
        return self.policy.device

    def compute_log_probs(self, batch, *, temperature: float | None = None) -> torch.Tensor:
        """As :meth:`TrainEngine.compute_log_probs`, with the policy's adapters disabled: ``(b, R)`` float32."""
        with adapters_disabled(self.policy.module):
            return self.policy.compute_log_probs(batch, temperature=self.temperature if temperature is None else temperature)

    def compute_values(self, batch) -> torch.Tensor:
        raise OpError(f"role {self.role!r} is a reference model (the policy's base model): it has no values")

    def update(self, batch, loss_terms: Sequence[Any], **_) -> dict[str, float]:
        raise OpError(f"role {self.role!r} is the policy's frozen base model (LoRA adapters disabled); it cannot be "
                      "updated: give it a model of its own (ref_model_name) to train it")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise OpError(f"role {self.role!r} reads the policy's base weights and holds no state to load")

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(())

    def move_states(self, items: Sequence[str], device: torch.device) -> None:
        """``params`` moves the policy's module (the weights this view reads); nothing else is held here."""
        if "params" in items:
            self.policy.move_states(("params",), device)
