"""The hang watchdog: when no op of a plan completes for ``timeout_s``, say where the run hangs.

While the interpreter drives a plan (:meth:`~.interpreter.PlanExecutor.drive`), a :class:`Watchdog`
attached to the executor (``executor.watchdog``) keeps a thread that notices when no op has
completed for ``timeout_s`` seconds. It then writes a report (:meth:`Watchdog.report`) to
``report_path`` (a run's ``hang.txt``) and to stderr: for every pool and rank the op in flight,
its iteration (and the trainer's step), how long since it was sent, the last op the pool
completed, and the worker's Python stacks (:meth:`~.interpreter.PlanExecutor.worker_stacks`:
asked of the Ray actors in a concurrency group of their own, so a worker busy in an op still
answers); then the controller's stacks. Then, with ``on_hang="stop"``, the run stops with a
:class:`~hybridflow.errors.HangError`; with ``"wait"`` it keeps waiting (a later completion ends
the stall, and a new stall is reported again).

How the stop reaches the controller depends on where ops run. The RayExecutor's loop waits
``poll_s`` at a time and calls :meth:`Watchdog.check` after each wait, which raises. The
LocalExecutor runs an op in the controller's own thread (``runs_inline``): a blocked op blocks
the loop, so the watchdog sends the main thread :data:`STOP_SIGNAL`, whose handler (installed
for the drive) raises :class:`HangInterrupt`, a ``BaseException`` that user code's
``except Exception`` does not swallow; :meth:`Watchdog.watch` turns it into the HangError. A
thread stuck in C code that never returns to Python cannot be interrupted; the report is
written all the same.

Only time inside a plan's run counts: between plans (logging, data, the trainer's own work) the
watchdog is not armed. A rule reward's own ``reward_timeout_s`` is a separate, finer bound:
whichever fires first names the hang (a RewardError naming the sample, or this report).
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Literal, Sequence

from ..errors import HangError, WriteError

if TYPE_CHECKING:
    from .interpreter import PlanExecutor, Stream

__all__ = ["Watchdog", "HangInterrupt", "STOP_SIGNAL", "thread_stacks", "OnHang"]

log = logging.getLogger("hybridflow.watchdog")

OnHang = Literal["stop", "wait"]

STOP_SIGNAL = signal.SIGUSR2
"""The signal that breaks a blocked op on an inline backend (its handler is installed only while a plan runs)."""


class HangInterrupt(BaseException):
    """Raised in the controller's thread by the watchdog's signal; :meth:`Watchdog.watch` turns it into a HangError."""


def thread_stacks(skip_current: bool = False) -> dict[str, str]:
    """``"<thread name> (id <ident>)"`` -> its formatted Python stack (innermost frame last), for every thread of
    this process; ``skip_current``: without the calling thread's own."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    return {f"{names.get(ident, 'thread')} (id {ident})": "".join(traceback.format_stack(frame))
            for ident, frame in sys._current_frames().items() if not (skip_current and ident == me)}


@dataclass
class _Done:
    op: str
    iteration: int
    at: float
    plan: str

    def describe(self, now: float) -> str:
        return f"op {self.op!r} of plan {self.plan!r} iteration {self.iteration}, {now - self.at:.1f} s ago"


@dataclass
class Watchdog:
    """Watches the plans an executor runs (module docstring)."""

    timeout_s: float
    """Seconds without a completed op before the report (``hang_timeout_s``)."""
    on_hang: OnHang = "stop"
    """stop: raise a HangError after the report; wait: keep waiting."""
    report_path: Path | None = None
    """Where the report is written (a run's ``hang.txt``); None: stderr only."""
    step: Callable[[], int] | None = None
    """The trainer's step, for the report."""
    stack_timeout_s: float = 10.0
    """How long the report waits for a worker's stacks."""
    reports: list[str] = field(default_factory=list)
    """Every report written (the newest last)."""
    detect_s: float | None = None
    """Seconds from the last completion (or the plan's start) to the newest report being written."""
    reported_at: float | None = None
    """``time.monotonic()`` when the newest report was written."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._last_done: dict[str, _Done] = {}
        self._armed = False
        self._signal_main = False
        self._starting: tuple[object, int, float] | None = None
        self._inline = False
        self._plan = ""
        self.hang: HangError | None = None
        """The HangError of a stall reported with on_hang='stop' (raised by :meth:`check`)."""

    # -- what the interpreter tells it ----------------------------------------------------------
    def starting(self, op, iteration: int) -> None:
        """The interpreter is sending ``op`` (a PlanOp): an inline backend, or the controller for its own ops,
        runs it before the send returns."""
        self._starting = (op, iteration, time.monotonic())

    def sent(self, op, iteration: int) -> None:
        """``op`` is sent (on an inline backend: it ran, and is done)."""
        self._starting = None
        if self._inline and op.pool is not None:
            self.op_done(op.name, op.pool, iteration)

    def op_done(self, op: str, pool: str | None, iteration: int) -> None:
        """Op ``op`` of ``pool`` (None: the controller) finished: the stall, if any, is over."""
        now = time.monotonic()
        self._last = now
        self._last_done[pool or "controller"] = _Done(op, iteration, now, self._plan)

    def check(self) -> None:
        """Raise the HangError of a stall reported with ``on_hang='stop'`` (the controller's loop calls this)."""
        if self.hang is not None:
            raise self.hang

    @contextlib.contextmanager
    def watch(self, executor: "PlanExecutor", streams: Sequence["Stream"]) -> Iterator[None]:
        """Arm the watchdog for one :meth:`~.interpreter.PlanExecutor.drive` of ``streams``."""
        self._last, self.hang, self._inline = time.monotonic(), None, executor.runs_inline
        self._plan = executor.graph.name
        inline = executor.runs_inline and threading.current_thread() is threading.main_thread()
        previous = signal.signal(STOP_SIGNAL, self._on_signal) if inline else None
        with self._lock:
            self._armed, self._signal_main = True, inline
        stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(executor, streams, stop), name="hybridflow-watchdog",
                                  daemon=True)
        thread.start()
        try:
            yield
        except HangInterrupt:
            raise (self.hang or HangError("the run was stopped by the hang watchdog")) from None
        finally:
            with self._lock:
                self._armed = False
            stop.set()
            thread.join()
            if inline:
                signal.signal(STOP_SIGNAL, previous if previous is not None else signal.SIG_DFL)
        self.check()

    def _on_signal(self, signum, frame) -> None:
        if self._armed and self.hang is not None:
            raise HangInterrupt()

    # -- the watching thread ------------------------------------------------------------------
    def _run(self, executor: "PlanExecutor", streams: Sequence["Stream"], stop: threading.Event) -> None:
        reported_at = None
        tick = min(1.0, self.timeout_s / 4)
        while not stop.wait(tick):
            last = self._last
            if reported_at == last or time.monotonic() - last < self.timeout_s:
                continue
            reported_at = last
            summary = self._summary(streams, time.monotonic() - last)
            try:
                text = self.report(executor, streams, time.monotonic() - last)
            except Exception as err:  # a report that cannot be assembled must not leave the hang unreported
                text = f"hang: {summary}\n(the full report failed: {type(err).__name__}: {err})"
            self._publish(text, time.monotonic() - last)
            if self.on_hang == "stop":
                self.hang = HangError(summary)
                with self._lock:
                    if self._armed and self._signal_main:
                        signal.pthread_kill(threading.main_thread().ident, STOP_SIGNAL)

    def _publish(self, text: str, detect_s: float) -> None:
        self.reports.append(text)
        self.detect_s = detect_s
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        if self.report_path is not None:
            try:
                self.report_path.write_text(text + "\n")
            except OSError as err:
                log.error("%s", WriteError("the hang report cannot be written", err, self.report_path))
        self.reported_at = time.monotonic()

    def _flights(self, streams: Sequence["Stream"]) -> list[tuple["Stream", object]]:
        """The ops in flight (an inline backend's sent ops are done already: the op being sent is the one running)."""
        if self._inline:
            return []
        return [(s, f) for s in list(streams) for f in list(s.inflight.values())]

    def _summary(self, streams: Sequence["Stream"], idle: float) -> str:
        ops = [f"op {f.op.name!r} on pool {f.op.pool!r}" for _, f in self._flights(streams)]
        starting = self._starting
        if starting is not None:
            ops.append(f"op {starting[0].name!r} on " + (f"pool {starting[0].pool!r}" if starting[0].pool else "the controller"))
        ops = ", ".join(ops) or "no op in flight"
        where = f"; the report is in {self.report_path}" if self.report_path is not None else ""
        return (f"no op completed for {idle:.1f} s (hang_timeout_s={self.timeout_s:g}); in flight: {ops}{where}. "
                "Raise hang_timeout_s if an op is just slow, or set on_hang=wait to keep waiting")

    # -- the report ------------------------------------------------------------------------------
    def report(self, executor: "PlanExecutor", streams: Sequence["Stream"], idle: float) -> str:
        """What every pool and rank is doing (module docstring), as text."""
        now = time.monotonic()
        flights = self._flights(streams)
        step = f", trainer step {self.step()}" if self.step is not None else ""
        lines = [f"hang: no op completed for {idle:.1f} s (hang_timeout_s={self.timeout_s:g}, on_hang={self.on_hang})",
                 f"at {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC; {type(executor).__name__} "
                 f"running plan {executor.graph.name!r}{step}", ""]
        busy = {slot.name: (f"op {f.op.name!r} (role {f.op.role!r}) of iteration {s.iteration}, "
                            f"sent {now - f.sent_at:.1f} s ago")
                for s, f in flights for i, slot in enumerate(f.slots) if i not in f.results}
        starting, running = self._starting, None
        if starting is not None:
            op, iteration, at = starting
            running = (f"op {op.name!r} (role {op.role!r}) of iteration {iteration}, started {now - at:.1f} s "
                       "ago (running in the controller's thread)")
            pools = {op.pool, op.target_pool} - {None}
            busy.update({slot.name: running for pool in pools for slot in executor.topology.pool_slots(pool)})
        slots = [slot for pool in executor.plan.pools for slot in executor.topology.pool_slots(pool.name)]
        stacks = executor.worker_stacks([s for s in slots if s.name in busy], self.stack_timeout_s)
        for slot in slots:
            roles = ", ".join(r.role for r in slot.roles)
            lines.append(f"pool {slot.pool!r} rank {slot.rank} (slot {slot.name}, roles {roles}, device {slot.device}):")
            lines.append(f"  in flight: {busy.get(slot.name, 'nothing (idle)')}")
            done = self._last_done.get(slot.pool)
            lines.append(f"  last completed: {done.describe(now)}" if done else "  last completed: none yet")
            if slot.name in busy:
                threads = stacks.get(slot.name)
                if threads is None:
                    lines.append("  worker stacks: " + ("in this process: see the controller's stacks below"
                                                        if executor.runs_inline else
                                                        f"no answer within {self.stack_timeout_s:g} s"))
                else:
                    lines.append("  worker stacks:")
                    lines.extend(_stack_lines(threads, "    "))
            lines.append("")
        if starting is not None and starting[0].pool is None:
            lines.append(f"controller: running {running}")
        done = self._last_done.get("controller")
        if done is not None:
            lines.append(f"controller: last completed {done.describe(now)}")
        if lines[-1]:
            lines.append("")
        lines.append("controller stacks (this process):")
        lines.extend(_stack_lines(thread_stacks(skip_current=True), "  "))
        return "\n".join(lines)


def _stack_lines(threads: dict[str, str], indent: str) -> list[str]:
    lines = []
    for name, text in threads.items():
        lines.append(f"{indent}thread {name}:")
        lines.extend(f"{indent}  {line}" for line in text.rstrip().splitlines())
    return lines
