"""One run per output folder: an exclusive lock held for the duration of a run.

A run takes ``fcntl.flock`` on ``<output_dir>/.hybridflow-run.lock`` and writes its pid, host
and start time into the file; a second run on the same folder gets an
:class:`~hybridflow.errors.OutputDirError` that names the holder. The kernel drops the lock when
the holder's process ends, however it ends (kill -9 included), so a stale lock file never blocks
a later run. Under the lock, :func:`remove_stale_temp` deletes what an interrupted run left
half-written (``checkpoints/.tmp-*``, ``tiny_model.tmp``): with the lock held nobody else
can be writing them.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from ..errors import OutputDirError, WriteError

try:
    import fcntl
except ImportError:  # not POSIX: no lock, runs are not protected from each other
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "RunLock", "remove_stale_temp"]

log = logging.getLogger("hybridflow.trainer")

LOCK_FILE = ".hybridflow-run.lock"
"""Name of the lock file in the output folder."""


class RunLock:
    """The exclusive lock on one output folder; :meth:`acquire` takes it, :meth:`release` gives it back."""

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "RunLock":
        """Take the lock (a no-op when held already); OutputDirError naming the holder when another run has it."""
        if self._fd is not None:
            return self
        if self.output_dir.exists() and not self.output_dir.is_dir():
            raise OutputDirError(f"output_dir {str(self.output_dir)!r} is a file, not a folder; give a folder path")
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise WriteError(f"output_dir {str(self.output_dir)!r} cannot be used (it cannot be created, or its "
                             f"lock file {LOCK_FILE} cannot be written there)", err) from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(self.path)
                os.close(fd)
                raise OutputDirError(
                    f"output_dir {str(self.output_dir)!r} is in use by another run ({holder}; lock file {self.path}). "
                    "Wait for that run to finish or stop it, or give this run another output_dir") from None
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())}
        try:
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(record) + "\n").encode())
        except OSError as err:
            os.close(fd)
            raise WriteError(f"output_dir {str(self.output_dir)!r} cannot be used", err, self.path) from None
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock back (the file stays: deleting it could let two runs lock different files)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _describe(path: Path) -> str:
    try:
        record = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        record = {}
    if not record.get("pid"):
        return "a process that has not written its pid yet"
    return f"process {record['pid']} on host {record.get('host', '?')}, started {record.get('started', '?')}"


def remove_stale_temp(output_dir: str | os.PathLike) -> list[Path]:
    """Delete half-written folders an interrupted run left in ``output_dir``; returns them. Call it under the lock."""
    from .checkpoint import CHECKPOINTS

    output_dir = Path(output_dir)
    stale = sorted((output_dir / CHECKPOINTS).glob(".tmp-*")) + sorted(output_dir.glob("tiny_model.tmp"))
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        log.warning("removed %d half-written folder(s) an interrupted run left behind: %s", len(stale),
                    ", ".join(str(p) for p in stale))
    return stale
