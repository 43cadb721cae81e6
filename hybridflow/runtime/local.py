"""LocalExecutor: runs an ExecutionPlan in one process, on the devices its pools name.

The executor is an interpreter of the plan (STYLE.md, principle 3): a loop over
the plan's ops with a single-assignment environment ``env`` (producer name ->
:class:`Batch`), dispatching each op through :data:`OP_RUNNERS` (by op kind).
Graph nodes go through the tables of :mod:`.node_calls`, which the Ray executor
shares: the node's worker call is built from ``env``, called on the pool's one
worker, and its result read back into the node's output batch. The executor has
no idea of the algorithm: the graph says what to run, the plan where and in
which order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..compiler.plan import ExecutionPlan, PlanOp
from ..errors import ExecutionError, HybridflowError
from ..graph import CONTROLLER
from .batch import Batch
from .node_calls import node_call, node_output, run_compute
from .roles import RoleSpec
from .spans import SpanRecorder
from .worker import RoleWorker

__all__ = ["LocalExecutor", "IterationResult", "OP_RUNNERS"]


@dataclass
class IterationResult:
    """What one iteration produced: every node's output batch and the update metrics."""

    env: dict[str, Batch]
    metrics: dict[str, float] = field(default_factory=dict)


class LocalExecutor:
    """Runs ``plan`` with the engines ``specs`` describe (role name -> :class:`RoleSpec`)."""

    def __init__(self, plan: ExecutionPlan, specs: Mapping[str, RoleSpec], *, recorder: SpanRecorder | None = None):
        self.plan = plan
        self.plan_graph = plan.graph_ir()
        self.graph = self.plan_graph
        """The graph the current (or last) iteration runs: the plan's, with that call's ``params``."""
        missing = [r.name for r in self.graph.roles if r.name not in specs]
        if missing:
            raise ExecutionError(f"no RoleSpec for role(s) {missing}; give one per role of graph {self.graph.name!r}")
        self.recorder = recorder or SpanRecorder()
        self.workers: dict[str, RoleWorker] = {}
        kinds = {r.name: r.kind for r in self.graph.roles}
        for pool in plan.pools:
            if len(pool.devices) != 1:
                raise ExecutionError(f"pool {pool.name!r} spans {len(pool.devices)} devices; the LocalExecutor runs one "
                                     "device per pool (use the RayExecutor for data parallelism)")
            roles = {name: (kinds[name], specs[name]) for name in plan.roles_on(pool.name)}
            self.workers[pool.name] = RoleWorker(pool.devices[0], roles)
        self.iteration = 0

    def worker(self, op: PlanOp) -> RoleWorker:
        return self.workers[op.pool]  # verified plans name existing pools

    def device(self, op: PlanOp) -> str:
        return CONTROLLER if op.pool is None else self.workers[op.pool].device

    def trace_spans(self) -> list:
        """The spans of the run's trace: one per op (the RayExecutor adds one per op and worker)."""
        return list(self.recorder.spans)

    def run_iteration(self, inputs: Mapping[str, Batch], *, params: Mapping[str, Mapping[str, object]] | None = None
                      ) -> IterationResult:
        """Run every op of the plan once, feeding the graph inputs (e.g. ``{"prompts": batch}``).

        ``params`` (node name -> {parameter: value}) sets compute nodes' parameters for this
        iteration only (run state such as a Lagrange multiplier; see :meth:`Graph.with_params`).
        """
        self.graph = self.plan_graph.with_params(params or {})
        expected = {i.name for i in self.graph.inputs}
        if set(inputs) != expected:
            raise ExecutionError(f"graph {self.graph.name!r} takes inputs {sorted(expected)}, got {sorted(inputs)}")
        result = IterationResult(env=dict(inputs))
        for op in self.plan.ops:
            with self.recorder.record(op=op.name, node=op.node, kind=op.kind if op.kind != "node" else self.graph.node(op.node).kind,
                                      role=op.role, device=self.device(op), iteration=self.iteration):
                try:
                    OP_RUNNERS[op.kind](self, op, result)
                except HybridflowError:
                    raise
                except Exception as err:  # name the op, node, role and device of an engine failure
                    raise ExecutionError(f"op {op.name!r} (role {op.role!r} on {self.device(op)}) failed: "
                                         f"{type(err).__name__}: {err}") from err
        self.iteration += 1
        return result


# -- op runners: one per plan op kind -------------------------------------------------------

def _run_node(ex: LocalExecutor, op: PlanOp, result: IterationResult) -> None:
    node = ex.graph.node(op.node)
    if node.kind == "compute":
        result.env[node.name] = run_compute(node, result.env)
        return
    call = node_call(node, result.env)
    raw = getattr(ex.worker(op), call.method)(call.role, call.batch, *call.args)
    result.env[node.name] = node_output(node, raw, result.metrics)


def _weight_sync(ex: LocalExecutor, op: PlanOp, result: IterationResult) -> None:
    ex.worker(op).sync_weights(op.role)


def _offload(ex: LocalExecutor, op: PlanOp, result: IterationResult) -> None:
    ex.worker(op).offload(op.role, op.items)


def _onload(ex: LocalExecutor, op: PlanOp, result: IterationResult) -> None:
    ex.worker(op).onload(op.role, op.items)


OP_RUNNERS: dict[str, Callable[[LocalExecutor, PlanOp, IterationResult], None]] = {
    "node": _run_node, "weight_sync": _weight_sync, "offload": _offload, "onload": _onload,
}
