"""The runtime: the engines, role workers and executors that run a compiled plan.

``Batch`` (:mod:`hybridflow.batch`: the data layer makes batches, the runtime and the trainer pass them on) is
re-exported here and loaded on first use (it needs torch), so that importing a light submodule
(``runtime.write_guard``, which every command's argument parser reaches) costs nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["Batch"]

if TYPE_CHECKING:
    from ..batch import Batch


def __getattr__(name: str):
    if name == "Batch":
        from ..batch import Batch

        return Batch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
