"""The runtime: the batch container, engines, role workers and executors that run a compiled plan."""
from __future__ import annotations

from .batch import Batch

__all__ = ["Batch"]
