"""Staged weight sync (``async_weight_sync: staged``): the rollout pool loads each policy version from a staging buffer.

With ``staleness`` k >= 1 the generation of step ``j`` must be sampled by policy version ``j - k`` (the weights after
the update of step ``j - k - 1``; the lag :func:`hybridflow.graph.staleness.edge_lags` records). A *collective*
weight sync (:func:`.weight_sync.broadcast_send` / :func:`~.weight_sync.broadcast_receive`) needs both pools at
once, so the trainer waits after each update for the generation in progress and the pools move in lock step
whatever k is (:mod:`hybridflow.compiler.async_cost`, ``sync="collective"``). The *staged* sync cuts the plan's
cross-pool ``weight_sync`` op of a generation working ahead into two ops, each on one pool:

* ``<sync>.stage`` on the train pool (:meth:`~.worker.Worker.stage_weights`), queued where the sync was: ahead
  of the update of the step that trains while this generation is sent, so it stages exactly the version the
  generation needs. Every train rank gathers; pool rank 0 copies the full tensors to host memory and leaves them
  in the staging buffer (:meth:`~.worker.Worker.stash`: on Ray ``ray.put``, the object store). No rollout worker
  takes part, so it never waits for a generation.
* ``<sync>.load`` on the rollout pool (:meth:`~.worker.Worker.load_weights`), after the stage: the ObjectRef of
  the staged tensors is the op's argument (a data dependency between the pools; Ray resolves it on the rollout
  worker), and the version travels with it, so every token the rollout samples next records it
  (:mod:`.policy_version`). The generation's generate ops no longer wait for a sync to finish: they are sent
  right behind the load, on the same pool.

**Order on the rollout pool.** A worker runs the ops sent to it in the order they were sent — the per-pool order
the interpreter keeps everywhere (a weight sync queued ahead of an update, generations queued behind each other).
Each generation stream working ahead keeps the order of the one before it (:attr:`.interpreter.Stream.after`):
none of its ops on a pool is sent while the previous generation still has ops to send there. So the rollout
worker's queue reads: the previous generation, the load of version ``v``, the generation that needs ``v``; it runs
them back to back without waiting for the controller, and generation ``j`` is sampled by version ``j - k``
exactly. Another plan that uses the rollout pool (validation, checkpoint) first drives the generations ahead to
their end where some of their ops are still unsent (:meth:`.interpreter.PlanExecutor.run_plan`).

**What it buys.** :func:`.overlap.run_overlapped` no longer drives every buffered generation to its end before
each step: it waits only for the rollout the step trains on, and the rollout pool works through up to k
generations ahead while the train pool trains, bounded by data alone — the producer/consumer pipeline of
``async_cost``'s ``sync="staged"`` model. The staged copy costs the train pool a gather and a host copy per
update (the model assumes it is free), and the rollout pool one load per generation.

Only on an executor whose pools run at the same time (the RayExecutor) and only for plans with staleness >= 1;
partial rollouts that continue under newer weights mid-generation (``partial_rollouts: continue``) sync
collectively and are not combined with it. :func:`check_weight_sync` says so with a :class:`ConfigError`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..compiler.async_cost import SYNC_MODES
from ..compiler.plan import PlanOp
from ..errors import ConfigError, ExecutionError
from .interpreter import InFlight, IterationState, Stream, sync_metrics

if TYPE_CHECKING:
    from .interpreter import PlanExecutor

__all__ = ["SYNC_MODES", "HALVES", "check_weight_sync", "stage_syncs", "plan_op_name"]

HALVES = (".stage", ".load")
"""Suffixes of a staged sync's two ops: ``<sync op>.stage`` (train pool) and ``<sync op>.load`` (rollout pool)."""


def check_weight_sync(mode: str, *, staleness: int, executor: str = "ray", partial_rollouts: str = "finish") -> None:
    """ConfigError unless weight sync ``mode`` can run a plan of ``staleness`` on ``executor`` ('ray' or 'local';
    an executor class name is taken as one of them) with this ``partial_rollouts`` setting (module docstring)."""
    if mode not in SYNC_MODES:
        raise ConfigError(f"async_weight_sync={mode!r}: use one of {', '.join(SYNC_MODES)}")
    if mode == "collective":
        return
    if staleness < 1:
        raise ConfigError("async_weight_sync=staged stages the weights a generation working ahead of training needs, "
                          "which needs staleness >= 1; set staleness=k (k >= 1) or async_weight_sync=collective")
    if executor.lower().startswith("local"):
        raise ConfigError("async_weight_sync=staged needs a rollout pool that runs beside the train pool "
                          "(executor='ray'); the local executor's pools take turns in one process. Set executor=ray "
                          "or async_weight_sync=collective")
    if partial_rollouts != "finish":
        raise ConfigError(f"async_weight_sync=staged with partial_rollouts={partial_rollouts}: a generation continued "
                          "under newer weights mid-way syncs them collectively; set partial_rollouts=finish or "
                          "async_weight_sync=collective")


def plan_op_name(name: str, plan_ops: set[str] | frozenset[str]) -> str:
    """The plan op a span's op ``name`` runs: a staged sync's halves (``<sync>.stage``, ``<sync>.load``) map to the
    plan's sync op ``<sync>``; any other name is its own."""
    for suffix in HALVES:
        if name.endswith(suffix) and name[:-len(suffix)] in plan_ops:
            return name[:-len(suffix)]
    return name


def stage_syncs(ex: "PlanExecutor", stream: Stream) -> None:
    """Replace each cross-pool weight sync pending in ``stream`` (a generation working ahead) by its stage op on the
    train pool and its load op on the rollout pool (module docstring); ops that waited on the sync are sent behind
    the load on its pool instead (their other deps stay)."""
    for sync in [op for op in stream.pending if op.kind == "weight_sync" and op.target_pool not in (None, op.pool)]:
        stage = sync.model_copy(update={"name": f"{sync.name}{HALVES[0]}", "target_pool": None})
        load = sync.model_copy(update={"name": f"{sync.name}{HALVES[1]}", "pool": sync.target_pool, "target_pool": None,
                                       "deps": (stage.name,)})
        pending = []
        for op in stream.pending:
            if op is sync:
                pending += [stage, load]
            elif sync.name in op.deps:
                pending.append(op.model_copy(update={"deps": tuple(d for d in op.deps if d != sync.name)}))
            else:
                pending.append(op)
        stream.pending = pending
        run = _StagedSync(sync.role)
        stream.submitters[stage.name] = run.stage
        stream.submitters[load.name] = run.load


@dataclass
class _StagedSync:
    """One staged sync: what its stage op left in the buffer, for its load op."""

    role: str
    staged: Any = None
    """The train pool rank 0's :class:`~.weight_sync.StagedWeights` once the stage op is done."""

    def stage(self, ex: "PlanExecutor", op: PlanOp, state: IterationState) -> InFlight:
        slots = ex.topology.pool_slots(op.pool)
        refs = [ex.send(slot, "stage_weights", op.role) for slot in slots]
        return InFlight(op, slots, refs, self._staged, "weight_sync")

    def _staged(self, results: Sequence[Any]) -> None:
        self.staged = next(r for r in results if r is not None)  # pool rank 0's; the other ranks only gathered

    def load(self, ex: "PlanExecutor", op: PlanOp, state: IterationState) -> InFlight:
        if self.staged is None:
            raise ExecutionError(f"op {op.name!r}: no weights staged for role {self.role!r}; its stage op must run first")
        staged, self.staged = self.staged, None  # the buffer's entry is freed once every rollout worker has it
        slots = ex.topology.pool_slots(op.pool)
        refs = [ex.send(slot, "load_weights", op.role, staged.weights, staged.version) for slot in slots]
        return InFlight(op, slots, refs, lambda results: sync_metrics(state, op.role, results), "weight_sync")
