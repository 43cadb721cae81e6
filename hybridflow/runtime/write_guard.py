"""Holding a "stop at once" until the file being written is complete.

torch's writers (``torch.save``'s zip writer, DCP's file writer) do not survive an exception
raised inside them: a KeyboardInterrupt from a signal handler that lands mid-file closes the
file on its way out, and the C++ writer's clean-up then writes to it and aborts the process
("terminate called ... ValueError: write to closed file"), so the run dies with SIGABRT
instead of stopping. Code that writes such a file wraps the call in :func:`whole_write`; a
signal handler that wants to stop at once offers its exception to :func:`defer` first, which
keeps it while a write is under way and has :func:`whole_write` raise it when the write
returns. Only the main thread (where Python runs signal handlers) is guarded.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["whole_write", "defer"]

_depth = 0  # whole_write blocks open in the main thread
_deferred: BaseException | None = None


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def whole_write() -> Iterator[None]:
    """Around one write that must not be cut; raises what :func:`defer` kept once the outermost one returns."""
    global _depth, _deferred
    if not _in_main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _deferred is not None:
            err, _deferred = _deferred, None
            raise err


def defer(err: BaseException) -> bool:
    """Keep ``err`` to be raised when the write under way returns; False (kept nothing) when none is."""
    global _deferred
    if not (_depth and _in_main_thread()):
        return False
    _deferred = err
    return True
