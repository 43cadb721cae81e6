"""torch CPU threads that do not oversubscribe the cores, and a warning when the machine is oversubscribed.

Why: torch's intra-op pool (OpenMP) splits each op over its threads and waits for
all of them at the op's end. With more busy threads on the machine than cores, one
of them is often descheduled, and every op of a small model then waits a scheduler
time slice for it: a 2-thread run on 2 cores with one busy neighbour process was
measured 50x slower per step (issue 18), while a 1-thread run slows about 2x (it
shares one core, nothing more).

So a CPU slot gets ``threads = min(share, free)`` torch threads, where ``share`` is
its share of the cores from the plan (``Machine.threads_per_slot``: cores / slots)
and ``free`` the cores not busy with other processes right now (:func:`busy_cores`:
the busy fraction of all cores over a short window from ``/proc/stat``, minus what
this process itself used; ``os.getloadavg`` where there is no ``/proc``). An explicit
``num_threads`` in the config is kept as given. :func:`warn_if_oversubscribed`
logs (logger ``hybridflow.runtime``) when our workers' threads plus the other busy
cores exceed the cores.
"""
from __future__ import annotations

import logging
import os
import time

__all__ = ["OtherLoad", "available_cores", "busy_cores", "slot_threads", "warn_if_oversubscribed"]

log = logging.getLogger("hybridflow.runtime")


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_times() -> tuple[float, float] | None:
    """``(busy, total)`` jiffies of all cores from ``/proc/stat``, or None where it cannot be read."""
    try:
        with open("/proc/stat") as stat:
            fields = [float(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


class OtherLoad:
    """Cores other processes keep busy from its creation to :meth:`cores` (``/proc/stat``), e.g. over a
    measurement this process makes: the busy share of all cores in the window minus this process's own
    CPU time in it."""

    def __init__(self) -> None:
        self._start, self._own, self._wall = _cpu_times(), time.process_time(), time.perf_counter()

    def cores(self, min_window_s: float = 0.05) -> float | None:
        """Busy cores elsewhere since creation; None without ``/proc/stat`` or for a window under ``min_window_s``."""
        wall = time.perf_counter() - self._wall
        after = _cpu_times()
        if self._start is None or after is None or wall < min_window_s:
            return None
        busy, total = after[0] - self._start[0], after[1] - self._start[1]
        if total <= 0:
            return None
        own = time.process_time() - self._own
        return max(0.0, (os.cpu_count() or 1) * busy / total - own / wall)


_last_window: OtherLoad = OtherLoad()
"""The window since the last :func:`busy_cores` measurement ended (or since this module was imported)."""
_last_busy: float | None = None
"""What that measurement found (None before the first)."""


def busy_cores(window_s: float = 0.2, *, reuse_s: float = 2.0) -> float:
    """Cores kept busy by *other* processes: measured over ``window_s`` (:class:`OtherLoad`), else the load average.

    ``busy = cores x (busy jiffies / all jiffies)`` over the window, minus this process's own CPU time
    in it. No wait where a recent measurement says it (a trainer's start-up asks twice, a test session hundreds
    of times): the last result when it ended under ``window_s`` ago; else the window since then when that is
    at most ``reuse_s`` long; else a fresh window of ``window_s`` this call sleeps through (its own share ~0).
    ``reuse_s=0``: always a fresh window. Never negative.
    """
    global _last_window, _last_busy
    meter, fresh = _last_window, OtherLoad()
    if fresh._start is None:
        try:
            return max(0.0, float(os.getloadavg()[0]))
        except (AttributeError, OSError):
            return 0.0
    age = fresh._wall - meter._wall
    if reuse_s > 0 and _last_busy is not None and age < window_s:
        return _last_busy
    if reuse_s <= 0 or meter._start is None or age > reuse_s:
        meter, age = fresh, 0.0  # no recent window: open one now
    if age < window_s:
        time.sleep(window_s - age)
    found = meter.cores(min_window_s=0.0)
    _last_window, _last_busy = OtherLoad(), (0.0 if found is None else found)
    return _last_busy


def slot_threads(share: int | None, *, requested: int | None = None, busy: float | None = None) -> int:
    """torch threads for one CPU slot: ``requested`` when given, else ``min(share, cores - busy)``, at least 1.

    ``share``: the slot's share of the cores from the plan (None: all of them); ``busy``: cores busy
    with other processes (None: measured now with :func:`busy_cores`).
    """
    if requested is not None:
        return requested
    cores = available_cores()
    share = cores if share is None else max(1, share)
    others = busy_cores() if busy is None else busy
    return max(1, min(share, int(cores - others + 0.5)))


def warn_if_oversubscribed(workers: int, threads: int, *, busy: float | None = None) -> bool:
    """Log a warning when ``workers x threads`` of ours plus the busy cores of others exceed the cores.

    Returns whether it warned.
    """
    cores = available_cores()
    others = busy_cores() if busy is None else busy
    ours = workers * threads
    if ours + others <= cores + 0.5:
        return False
    advice = ("fewer threads (num_threads) or fewer workers (cpu_slots) would help: each thread waits for the others "
              "at every op" if ours > 1 else "this run already uses one thread; the other processes set the pace")
    log.warning("the machine is oversubscribed: %d worker(s) x %d torch thread(s) of this run and %.1f cores busy with "
                "other processes, on %d cores; steps will be slower and noisier (%s)", workers, threads, others, cores,
                advice)
    return True
