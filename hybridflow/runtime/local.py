"""LocalExecutor: runs a bound ExecutionPlan in this process, one slot per pool.

The run loop is the shared plan interpreter (:mod:`.interpreter`); this module
only says how a call reaches a slot: each pool of the plan is one
:class:`~hybridflow.runtime.worker.Worker` built in this process on
the pool's device, and an op runs at once. Those workers (:attr:`LocalExecutor.slots`)
are this transport's own; everything else reaches them through plans. Pools therefore take turns (no
two ops run at the same time), which is why a plan with ``staleness`` > 0 is
an error here, and a pool spread over several devices (data parallelism) needs
the RayExecutor, whose slots are processes. Colocated roles share a slot; a
cross-pool weight sync copies the train engine's tensors into the other
pool's rollout engine.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..compiler.plan import ExecutionPlan
from ..errors import ExecutionError, HybridflowError
from .interpreter import IterationResult, PlanExecutor
from .roles import RoleSpec
from .spans import SpanRecorder
from .topology import Slot
from .worker import Worker

__all__ = ["LocalExecutor", "IterationResult"]


class _Done:
    """A call that already ran: its result, or the exception it raised."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error


class LocalExecutor(PlanExecutor):
    """Runs the bound ``plan`` with the engines ``specs`` describe (role name -> :class:`RoleSpec`)."""

    def __init__(self, plan: ExecutionPlan, specs: Mapping[str, RoleSpec], *, recorder: SpanRecorder | None = None,
                 seed: int | None = None):
        super().__init__(plan, specs, recorder=recorder)
        wide = [f"{p.name} ({len(p.devices)} devices)" for p in plan.pools if len(p.devices) > 1]
        if wide:
            raise ExecutionError(f"pools {', '.join(wide)} span several devices; the local executor runs one device per "
                                 "pool in this process. Use executor='ray' (one process per device slot, FSDP2 data "
                                 "parallelism), or compile with one device per pool (cpu_slots=1, or a device map)")
        self.mailbox: dict[str, list] = {}
        self.slots: dict[str, Worker] = {}
        """Slot name -> its worker (this transport's; seed None: engines from the caller's torch generator, as
        built before this executor existed)."""
        for slot in self.topology.slots:
            worker = Worker(slot, {r.role: self.specs[r.role] for r in slot.roles}, seed=seed)
            worker.setup_local(slot.device, self.mailbox)
            self.slots[slot.name] = worker

    def restart(self) -> None:
        raise ExecutionError("the local executor has no worker processes to restart; resume='auto' continues a run "
                             "from its newest checkpoint")

    # -- the transport: calls run at once --------------------------------------------------------
    runs_inline = True

    def send(self, slot: Slot, kind: str, *args) -> _Done:
        try:
            return _Done(self.slots[slot.name].run(kind, *args))
        except Exception as err:  # raised by fetch, where the op is named
            return _Done(error=err)

    def send_stream(self, slot: Slot, kind: str, *args) -> _Done:
        """The worker's generator; each :meth:`next_piece` runs it in this thread up to its next piece."""
        return _Done(self.slots[slot.name].run_stream(kind, *args))

    def next_piece(self, handle: _Done, slot: Slot, what: str) -> tuple[Any, tuple[float, float]] | None:
        try:
            return next(handle.value)
        except StopIteration:
            return None
        except HybridflowError:
            raise
        except Exception as err:
            raise ExecutionError(f"{what} failed on {slot.describe()}: {type(err).__name__}: {err}") from err

    def wait(self, refs: list, timeout: float) -> None:
        pass

    def ready(self, refs: list) -> list[bool]:
        return [True] * len(refs)

    def fetch(self, ref: _Done, slot: Slot, what: str) -> tuple[Any, tuple[float, float]]:
        if ref.error is None:
            return ref.value
        if isinstance(ref.error, HybridflowError):
            raise ref.error
        raise ExecutionError(f"{what} failed on {slot.describe()}: {type(ref.error).__name__}: {ref.error}") from ref.error
