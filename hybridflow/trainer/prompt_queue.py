"""The prompts of the coming steps: drawn from the loader in order, up to k of them ahead (staleness k).

With ``staleness=k`` the trainer hands the executor the prompts of the next k steps along with this step's,
so their generations run ahead (:mod:`hybridflow.runtime.overlap`). :class:`PromptQueue` holds them as
:class:`DrawnBatch` records, each with the loader's position *before* it was drawn. A checkpoint saves the
position before the first prompts drawn ahead (:meth:`PromptQueue.loader_state`), not the loader's current
one: the generations in flight are not saved, and a resumed run draws those prompts again and generates
them with the restored weights. So a resume loses no prompt and trains none twice; the price is that the
first k rollouts after a resume lag less (0, 1, ..., k-1 updates, as at a run's start) than they would have.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["DrawnBatch", "PromptQueue"]


@dataclass(frozen=True)
class DrawnBatch:
    """One step's prompts: the loader's position before the draw, the rows' dataset indices, the rows and their
    prompt batch (what the executor generates for)."""

    loader_state: dict
    indices: tuple[int, ...]
    rows: list
    batch: Any


class PromptQueue:
    """The next step's prompts and those drawn ahead of it, from ``loader`` (a PromptLoader); ``make_batch(rows)``
    makes a prompt batch."""

    def __init__(self, loader, make_batch: Callable[[list], Any]):
        self.loader, self.make_batch = loader, make_batch
        self.ahead: deque[DrawnBatch] = deque()
        """The following steps' prompts, in step order, drawn ahead (their generations are in flight or done)."""
        self.current: DrawnBatch | None = None
        """The prompts :meth:`next` handed out for the step about to run."""

    def draw(self) -> DrawnBatch:
        state = self.loader.state_dict()
        rows = self.loader.next_batch()
        return DrawnBatch(state, tuple(self.loader.last_indices), rows, self.make_batch(rows))

    def next(self) -> DrawnBatch:
        """The next step's prompts: the first drawn ahead, else the loader's next batch."""
        self.current = self.ahead[0] if self.ahead else self.draw()
        return self.current

    def start_step(self, rows: list) -> DrawnBatch | None:
        """Step on ``rows`` begins: the record :meth:`next` gave for them (None for rows from elsewhere), taken off
        the queue."""
        current, self.current = self.current, None
        if self.ahead and self.ahead[0].rows is rows:
            self.ahead.popleft()
        return current if current is not None and current.rows is rows else None

    def fill(self, count: int) -> list[DrawnBatch]:
        """Draw until ``count`` steps' prompts are ahead; returns those ahead, in step order."""
        while len(self.ahead) < count:
            self.ahead.append(self.draw())
        return list(self.ahead)

    def loader_state(self) -> dict:
        """The loader position a checkpoint saves: before the prompts drawn ahead (module docstring)."""
        return self.ahead[0].loader_state if self.ahead else self.loader.state_dict()

    def clear(self) -> None:
        """Forget the prompts drawn ahead (their generations are gone: a restart); restore the loader after this."""
        self.ahead.clear()
        self.current = None
