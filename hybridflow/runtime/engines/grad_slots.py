"""The update's gradient buffers (:func:`flat_gradient_slots`), and weight gradients added into them as the backward
computes them (:func:`gradients_into`).

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

The embedding is used twice too, and its gradient is dense: each use's backward made a ``(vocab, hidden)``
tensor, the responses' one held until the prompts' backward (~540 MB at a 151,936-token vocabulary and hidden
896). Inside :func:`gradients_into` the lean forward's embedding sums each use's gradient of the rows it looked
up and adds those rows into the buffer (:class:`~.lean_forward._Embedding`), with no dense tensor at all.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch

__all__ = ["flat_gradient_slots", "gradient_slot", "gradients_into", "weight_gradient"]

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


def gradient_slot(weight: torch.Tensor) -> torch.Tensor | None:
    """The buffer :func:`gradients_into` adds ``weight``'s gradient into (the weight's ``.grad``), None outside it."""
    slots = _SLOTS.get()
    slot = None if slots is None else slots.get(id(weight))
    return slot if slot is not None and slot is weight.grad else None


def weight_gradient(weight: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor | None:
    """What a backward function returns for ``weight``: None once ``grad`` is added into the weight's buffer
    (:func:`gradients_into`), else ``grad`` for autograd to accumulate."""
    slot = None if grad is None else gradient_slot(weight)
    if slot is None:
        return grad
    slot.add_(grad)
    return None


def flat_gradient_slots(optimizer: torch.optim.Optimizer) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """A zeroed gradient for each trainable parameter of ``optimizer``, all on one buffer per dtype and device.

    Each is made with ``Tensor.set_`` on the buffer's storage (its own tensor and version counter, not a view), at
    an offset aligned to 64 bytes. The buffer's memory goes when the last of them does."""
    params = list({id(p): p for group in optimizer.param_groups for p in group["params"] if p.requires_grad}.values())
    kinds: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
    for param in params:
        kinds.setdefault((param.dtype, param.device), []).append(param)
    slots = []
    for (dtype, device), members in kinds.items():
        align = max(1, 64 // torch.empty((), dtype=dtype).element_size())
        offsets, total = [], 0
        for param in members:
            offsets.append(total)
            total += -(-param.numel() // align) * align
        storage = torch.zeros(total, dtype=dtype, device=device).untyped_storage()
        for param, offset in zip(members, offsets):  # contiguous: set_'s default strides
            slots.append((param, torch.empty(0, dtype=dtype, device=device).set_(storage, offset, param.shape)))
    return slots
