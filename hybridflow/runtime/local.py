"""LocalExecutor: runs an ExecutionPlan in one process, on the devices its pools name.

The executor is an interpreter of the plan (STYLE.md, principle 3): a loop over
the plan's ops with a single-assignment environment ``env`` (producer name ->
:class:`Batch`), dispatching each op through :data:`OP_RUNNERS` (by op kind) and
graph nodes through :data:`NODE_RUNNERS` (by node kind). It has no idea of the
algorithm: the graph says what to run, the plan where and in which order.

Inputs of a node are gathered by their :class:`~hybridflow.graph.Input`
records; the non-tensor columns of its producers (decoded responses, ground
truths, data sources) travel along. Nodes that run a model over the responses
(infer, update) also get the sequence fields (``prompt_ids``, ``prompt_mask``,
``response_ids``, ``response_mask``) of the rollout their ``response_mask``
comes from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from hybridflow_ops.registry import get_op

from ..compiler.plan import ExecutionPlan, PlanOp
from ..errors import ExecutionError, HybridflowError
from ..graph import CONTROLLER, Node
from .batch import Batch
from .roles import RoleSpec
from .spans import SpanRecorder
from .worker import RoleWorker

__all__ = ["LocalExecutor", "IterationResult", "NODE_RUNNERS", "OP_RUNNERS"]

SEQUENCE_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


@dataclass
class IterationResult:
    """What one iteration produced: every node's output batch and the update metrics."""

    env: dict[str, Batch]
    metrics: dict[str, float] = field(default_factory=dict)


class LocalExecutor:
    """Runs ``plan`` with the engines ``specs`` describe (role name -> :class:`RoleSpec`)."""

    def __init__(self, plan: ExecutionPlan, specs: Mapping[str, RoleSpec], *, recorder: SpanRecorder | None = None):
        self.plan = plan
        self.graph = plan.graph_ir()
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

    def run_iteration(self, inputs: Mapping[str, Batch]) -> IterationResult:
        """Run every op of the plan once, feeding the graph inputs (e.g. ``{"prompts": batch}``)."""
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

    # -- gathering inputs -----------------------------------------------------------------
    def gather(self, node: Node, env: Mapping[str, Batch], *, sequence: bool = False) -> Batch:
        tensors: dict[str, torch.Tensor] = {}
        columns: dict[str, object] = {}
        for inp in node.inputs:
            producer = env[inp.source]
            tensors[inp.name] = producer[inp.field]
            for name, values in producer.columns.items():
                columns.setdefault(name, values)
        if sequence:
            source = next((i.source for i in node.inputs if i.name == "response_mask"), None)
            if source is None:
                raise ExecutionError(f"node {node.name!r} runs a model over responses but reads no response_mask; "
                                     "pass the rollout to it in the algorithm")
            for name in SEQUENCE_FIELDS:
                tensors.setdefault(name, env[source][name])
        return Batch(tensors, columns)


# -- node runners: one per node kind -------------------------------------------------------

def _generate(ex: LocalExecutor, op: PlanOp, node: Node, result: IterationResult) -> Batch:
    a = node.attrs
    overrides = {"n": a.n, "greedy": a.greedy or None, "max_new_tokens": a.max_new_tokens,
                 "temperature": a.temperature, "top_p": a.top_p}
    out = ex.worker(op).generate(node.role, ex.gather(node, result.env), overrides)
    lengths = out["response_mask"].sum(-1)
    result.metrics.setdefault("response_length/mean", float(lengths.mean()))
    return out


def _infer(ex: LocalExecutor, op: PlanOp, node: Node, result: IterationResult) -> Batch:
    run = {"logprob": RoleWorker.logprob, "values": RoleWorker.values}.get(node.op)
    if run is None:
        raise ExecutionError(f"node {node.name!r}: infer op {node.op!r} is not one of logprob, values")
    (field_spec,) = node.outputs.fields
    return Batch({field_spec.name: run(ex.worker(op), node.role, ex.gather(node, result.env, sequence=True))})


def _score(ex: LocalExecutor, op: PlanOp, node: Node, result: IterationResult) -> Batch:
    out = ex.worker(op).score(node.role, ex.gather(node, result.env))
    scores = out.scores.to(torch.float32)
    if not torch.isfinite(scores).all():
        from ..errors import RewardError

        bad = int((~torch.isfinite(scores)).nonzero()[0])
        raise RewardError(f"node {node.name!r}: reward source returned a non-finite score at sample {bad}")
    name = "score" if node.attrs.field == "scores" else node.attrs.field
    result.metrics[f"critic/{name}/mean"] = float(scores.mean())
    return Batch({node.attrs.field: scores})


def _compute(ex: LocalExecutor, op: PlanOp, node: Node, result: IterationResult) -> Batch:
    spec = get_op(node.op)
    batch = ex.gather(node, result.env)
    outputs = spec.fn(*(batch[f.name] for f in spec.inputs), **dict(node.attrs.params))
    return Batch({f.name: value for f, value in zip(spec.outputs, outputs)})


def _update(ex: LocalExecutor, op: PlanOp, node: Node, result: IterationResult) -> Batch:
    terms = [(t.op, t.weight, dict(t.params)) for t in node.attrs.terms]
    metrics = ex.worker(op).update(node.role, ex.gather(node, result.env, sequence=True), terms)
    result.metrics.update(metrics)
    return Batch({})


NODE_RUNNERS: dict[str, Callable[[LocalExecutor, PlanOp, Node, IterationResult], Batch]] = {
    "generate": _generate, "infer": _infer, "score": _score, "compute": _compute, "update": _update,
}


# -- op runners: one per plan op kind -------------------------------------------------------

def _run_node(ex: LocalExecutor, op: PlanOp, result: IterationResult) -> None:
    node = ex.graph.node(op.node)
    result.env[node.name] = NODE_RUNNERS[node.kind](ex, op, node, result)


def _weight_sync(ex: LocalExecutor, op: PlanOp, result: IterationResult) -> None:
    ex.worker(op).sync_weights(op.role)


def _offload(ex: LocalExecutor, op: PlanOp, result: IterationResult) -> None:
    ex.worker(op).offload(op.role, op.items)


def _onload(ex: LocalExecutor, op: PlanOp, result: IterationResult) -> None:
    ex.worker(op).onload(op.role, op.items)


OP_RUNNERS: dict[str, Callable[[LocalExecutor, PlanOp, IterationResult], None]] = {
    "node": _run_node, "weight_sync": _weight_sync, "offload": _offload, "onload": _onload,
}
