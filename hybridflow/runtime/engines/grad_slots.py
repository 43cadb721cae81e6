"""Weight gradients added into the update's gradient buffers as the backward computes them.

Autograd sums the gradients a parameter receives from each of its uses in one backward before it adds them to
``.grad``: the engine holds the first ones in the parameter's input buffer until the last use's backward has run.
The shared-prompt forward (:mod:`.shared_prompt`) uses every weight twice, for the responses and then for the
prompts, whose backward runs last: every layer's weight gradients from the responses' backward were held at once,
a second model-sized tensor set at the backward's peak (~330 MB of the ~100M bench model's update: each layer's
31 MB added while the backward walked down the layers, measured with mallinfo2).

Inside :func:`gradients_into`, the lean forward's own backward functions (:mod:`.lean_forward`) add a weight's
gradient into that weight's buffer straight away and hand autograd nothing for it, so that each is freed once
added. The train engine opens it around its backward passes when its gradients live in one flat buffer
(:meth:`~.train.TrainEngine._start_gradients`, the CPU), whose parameters have no hooks. The buffer then receives
``g_responses`` and ``g_prompts`` one after the other where autograd added their sum: the first micro-batch's
gradients are the same to the bit (``0 + a + b``), a later one's equal up to float summation order.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch

__all__ = ["gradients_into", "weight_gradient"]

_SLOTS: ContextVar[dict[int, torch.Tensor] | None] = ContextVar("hybridflow_gradient_slots", default=None)


@contextmanager
def gradients_into(slots: dict[int, torch.Tensor]) -> Iterator[None]:
    """Within this block, :func:`weight_gradient` adds the gradient of a weight with ``id(weight)`` in ``slots``
    into its buffer there (the weight's ``.grad``)."""
    token = _SLOTS.set(slots)
    try:
        yield
    finally:
        _SLOTS.reset(token)


def weight_gradient(weight: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor | None:
    """What a backward function returns for ``weight``: None once ``grad`` is added into the weight's buffer
    (:func:`gradients_into`), else ``grad`` for autograd to accumulate."""
    slots = _SLOTS.get()
    slot = None if slots is None or grad is None else slots.get(id(weight))
    if slot is None or slot is not weight.grad:
        return grad
    slot.add_(grad)
    return None
