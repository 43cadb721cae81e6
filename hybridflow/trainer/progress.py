"""What a user sees while a run goes: a progress bar over steps and the phase being run.

The bar (tqdm) shows steps done, ETA, the mean reward of the last steps and the op the
executor is running now (``actor.generate``, ``critic.update``, ``validate``,
``save checkpoint``): the executor reports each op it starts through a
:class:`PhaseRecorder`, so no executor code knows about the bar. Console metric lines
go through :func:`write_line`, which prints above an active bar instead of breaking it.
"""
from __future__ import annotations

import sys
from collections import deque
from typing import Callable, Mapping, TextIO

from ..runtime.spans import SpanRecorder

__all__ = ["StepProgress", "PhaseRecorder", "write_line"]


def write_line(text: str, stream: TextIO | None = None) -> None:
    """Print a line; above the progress bar when one is shown."""
    from tqdm import tqdm

    tqdm.write(text, file=stream or sys.stdout)


class PhaseRecorder(SpanRecorder):
    """A span recorder that also tells ``on_phase`` the name of each op as it starts."""

    def __init__(self, on_phase: Callable[[str], None]):
        super().__init__()
        self.on_phase = on_phase

    def started(self, op: str) -> None:
        self.on_phase(op)


class StepProgress:
    """A bar over ``total`` steps starting at ``initial``; shown only on a terminal unless ``force``.

    ``reward_key`` is the metric averaged over the last ``window`` steps for the live reward
    (None: the step's training score, :func:`~.metrics.training_score`).
    """

    def __init__(self, total: int, initial: int = 0, *, enabled: bool = True, force: bool = False,
                 reward_key: str | None = None, window: int = 10, stream: TextIO | None = None):
        from tqdm import tqdm

        disable = True if not enabled else (False if force else None)  # None: tqdm shows it on terminals only
        self.bar = tqdm(total=total, initial=initial, unit="step", desc="train", dynamic_ncols=True,
                        disable=disable, file=stream or sys.stderr, leave=True)
        self.reward_key = reward_key
        self.rewards: deque[float] = deque(maxlen=window)
        self._phase = ""

    def _postfix(self) -> None:
        parts = []
        if self.rewards:
            parts.append(f"reward={sum(self.rewards) / len(self.rewards):.3f}")
        if self._phase:
            parts.append(self._phase)
        self.bar.set_postfix_str("  ".join(parts), refresh=True)

    def phase(self, name: str) -> None:
        """Show ``name`` as what runs now."""
        self._phase = name
        self._postfix()

    def step_done(self, metrics: Mapping[str, float]) -> None:
        from .metrics import training_score

        value = metrics.get(self.reward_key) if self.reward_key else training_score(metrics)
        if value is not None:
            self.rewards.append(float(value))
        self._phase = ""
        self.bar.update(1)
        self._postfix()

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def close(self) -> None:
        self.bar.close()
