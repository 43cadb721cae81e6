"""The Ray executor: the same ExecutionPlan as the LocalExecutor, on a Ray cluster.

Ray is imported only in this package (DESIGN.md). :class:`RayExecutor` is
resolved lazily, so ``import hybridflow.runtime.ray`` stays cheap and the
pure parts (:mod:`.topology`, :mod:`.dispatch`) work without Ray installed.
"""
from __future__ import annotations

__all__ = ["RayExecutor"]


def __getattr__(name: str):
    if name == "RayExecutor":
        from .executor import RayExecutor

        return RayExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
