"""``hf.register_op``: :func:`hybridflow_ops.registry.register_op` whose refusals are hybridflow errors.

The ops package raises its own ``OpRegistryError`` (it imports nothing of hybridflow); through
``hf.register_op`` that becomes :class:`~hybridflow.graph.errors.OpRegistrationError`, which is both an
``OpError`` (so a ``HybridflowError``, as every error a user can cause) and an ``OpRegistryError``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from hybridflow_ops import registry

from .errors import OpRegistrationError

__all__ = ["register_op"]


@functools.wraps(registry.register_op)
def register_op(name: str, **declaration: Any) -> Callable[[Callable], Callable]:
    try:
        decorate = registry.register_op(name, **declaration)
    except registry.OpRegistryError as err:
        raise OpRegistrationError(str(err)) from None

    def register(fn: Callable) -> Callable:
        try:
            return decorate(fn)
        except registry.OpRegistryError as err:
            raise OpRegistrationError(str(err)) from None

    return register
