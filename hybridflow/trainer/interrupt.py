"""Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (a scheduler's stop).

While a :class:`StopRequest` is active (``with StopRequest() as stop:``, in the main thread),
the first SIGINT or SIGTERM only records itself: the trainer finishes the step under way, then
takes its "last step" path (a checkpoint unless ``save_on_interrupt=False``, the trace, the
summary) and the command exits with ``128 + signal number`` (130 for SIGINT, 143 for SIGTERM,
as shells do). A second signal raises :class:`KeyboardInterrupt` at once (or, inside a file write
torch's writers must finish, as soon as it returns: see :mod:`hybridflow.runtime.write_guard`),
and so does a first one while ``at_once`` is set (a run starting up: no step to finish, nothing to save);
checkpoints are written to a temporary folder and renamed, so that stop leaves each one complete or absent. The
previous handlers come back when the block ends. (Python ignores an exception raised while a
``__del__`` runs, so :meth:`check` raises it again at the trainer's next step boundary.) Outside the main thread it installs nothing.
"""
from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from ..runtime import write_guard

__all__ = ["StopRequest", "exit_code"]

log = logging.getLogger("hybridflow.trainer")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    """The exit status a shell gives a process ended by ``signum``: 128 + its number."""
    return 128 + int(signum)


class StopRequest:
    """Records the first SIGINT/SIGTERM (see the module docstring); ``signum`` is None until one arrives."""

    def __init__(self, what: str = "the current step, then writing a checkpoint, the trace and the summary"):
        self.what = what
        self.signum: int | None = None
        self.forced = False
        self.at_once = False
        """While True (a run starting up: nothing to finish or save yet), the first signal stops at once too."""
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def check(self) -> None:
        """Raise KeyboardInterrupt if a second signal came (its own may have been swallowed, e.g. inside a ``__del__``)."""
        if self.forced:
            raise KeyboardInterrupt("a second signal: stopping at once")

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None or self.at_once:
            self.forced = True
            which = "second " if self.signum is not None else ""
            self.signum = self.signum if self.signum is not None else signum
            stop = KeyboardInterrupt(f"{which}{signal.Signals(signum).name}: stopping at once")
            if write_guard.defer(stop):
                log.warning("second %s received: stopping once the file being written is complete",
                            signal.Signals(signum).name)
                return
            raise stop
        self.signum = signum
        log.warning("%s received: finishing %s (press Ctrl-C again to stop at once)", signal.Signals(signum).name,
                    self.what)

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
