"""Plan ops on their way through the workers: the executor's unit of scheduling.

A :class:`Stream` is one run through a list of plan ops with its own environment:
a whole iteration, or, with overlap (:mod:`.overlap`), the generation working ahead
for the next iteration, which may still be in flight when the call that started it
returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ...compiler.plan import PlanOp
from ..batch import Batch
from .op_dispatch import InFlight

__all__ = ["IterationState", "Stream"]


@dataclass
class IterationState:
    """The environment (producer name -> Batch) and metrics of one run through plan ops."""

    env: dict[str, Batch]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Stream:
    """Plan ops to send (``pending``), sent (``inflight``) and finished (``done``), for one ``iteration``."""

    pending: list[PlanOp]
    state: IterationState
    iteration: int
    done: set[str] = field(default_factory=set)
    inflight: dict[str, InFlight] = field(default_factory=dict)
    inputs: Mapping[str, Batch] | None = None
    """The graph inputs this stream works on (a generation ahead is matched to the next call's inputs)."""

    @property
    def finished(self) -> bool:
        return not self.pending and not self.inflight
