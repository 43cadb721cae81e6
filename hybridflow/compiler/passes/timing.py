"""Predicted time and per-device peak memory of every plan op (not a pass: ``reshard``, ``offload`` and ``schedule`` read it).

One rule per op kind in :data:`OP_COSTS`, and per node kind in
:data:`NODE_COSTS`; each builds the cost model's work record
(:mod:`hybridflow.compiler.cost`) from the plan and the context and adds the
memory the rest of the pool holds meanwhile, as the placement search does
(:mod:`hybridflow.compiler.placement.evaluate`): in a resident pool every
other role's states stay on the device; in an offload pool only the working
role's states are there. Batch sizes follow the node's rollout: an infer or
score node reading a generate node with ``n`` samples works on ``prompts x n``
sequences. A node inside a dynamic-sampling region (:mod:`hybridflow.graph.resampling`) runs
once per round: its time is multiplied by the region's expected rounds
(:func:`~hybridflow.graph.resampling.expected_rounds` of its ``expected_keep`` prior).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from ...capabilities import AGENT_DEFAULTS, ENV_WORKER_THREADS, WEIGHT_SYNC_BUCKET_BYTES
from ...errors import PlanError
from ...graph import Node
from ..cost import CostRecord, Compute, Generate, Infer, Offload, Onload, Score, Update, WeightSync, estimate
from ..layout import Layout
from ..memory import PARAM_BYTES, resident_bytes
from ..plan import ExecutionPlan, LayoutPlan, PlanOp, RolePlacement
from ..reshard import cross_pool_sync
from .context import CompileContext

__all__ = ["PlanView", "layout_of", "op_cost", "OP_COSTS", "NODE_COSTS"]


def layout_of(plan_layout: LayoutPlan) -> Layout:
    return Layout(plan_layout.dp, plan_layout.tp, plan_layout.pp)


@dataclass(frozen=True, eq=False)
class PlanView:
    """Read-only lookups over a plan and its context: roles' models, layouts, resident states per pool."""

    plan: ExecutionPlan
    ctx: CompileContext

    @cached_property
    def placements(self) -> dict[str, RolePlacement]:
        return {p.role: p for p in self.plan.placements}

    @cached_property
    def trainable(self) -> dict[str, bool]:
        return {r.name: r.trainable for r in self.ctx.workload.roles}

    @cached_property
    def resident(self) -> dict[str, float]:
        """Bytes of model states each role keeps per device of its training pool (0 for rule roles)."""
        found = {}
        for role, p in self.placements.items():
            model = self.ctx.models.get(role)
            found[role] = 0.0 if model is None else resident_bytes(model, layout_of(p.layout), self.trainable.get(role, False),
                                                                p.train_engine)
        return found

    @cached_property
    def offload_pools(self) -> frozenset[str]:
        return frozenset(p.name for p in self.plan.pools if p.offload)

    def others(self, role: str, pool: str | None) -> float:
        """States of the other roles resident on ``pool`` while ``role`` works there (0 in offload pools)."""
        if pool is None or pool in self.offload_pools:
            return 0.0
        return sum(self.resident[r] for r, p in self.placements.items() if p.pool == pool and r != role)

    def own(self, role: str, pool: str | None) -> float:
        """``role``'s own states on ``pool`` (0 on a rollout pool it only generates on)."""
        p = self.placements.get(role)
        return self.resident[role] if p is not None and p.pool == pool else 0.0

    @cached_property
    def nodes(self) -> dict[str, Node]:
        return {n.name: n for n in self.ctx.graph.nodes}

    def _generate_read(self, node: Node) -> Node | None:
        """The generate node ``node`` reads, if any."""
        for source in node.sources:
            producer = self.nodes.get(source)
            if producer is not None and producer.kind == "generate":
                return producer
        return None

    def sequences(self, node: Node) -> int:
        """Sequences the node works on: prompts x n of the generate node it reads, else the workload's rollout."""
        producer = self._generate_read(node)
        return self.ctx.workload.generation.sequences if producer is None else self.ctx.batch.prompts * producer.attrs.n

    def samples(self, node: Node) -> int:
        """Rows per distinct prompt in what the node reads: the n of the generate node it reads, else the workload's."""
        producer = self._generate_read(node)
        return self.ctx.workload.generation.samples if producer is None else producer.attrs.n


def _model(view: PlanView, role: str):
    model = view.ctx.models.get(role)
    if model is None:
        raise PlanError(f"role {role!r} has no model (a rule function) but runs a model op")
    return model


def _tool_waves(view: PlanView, op: PlanOp, sequences: int) -> int:
    """Rounds of tool calls one turn's steps take on the op's environment pool: its workers each step
    ENV_WORKER_THREADS samples at once (1 when the op names no pool: every sample steps at once)."""
    if op.env_pool is None:
        return 1
    workers = view.plan.pool(op.env_pool).workers or 1
    return math.ceil(sequences / (workers * ENV_WORKER_THREADS))


def _generate(view: PlanView, op: PlanOp, node: Node) -> CostRecord:
    p, batch = view.placements[op.role], view.ctx.batch
    used = view.own(op.role, op.pool) + view.others(op.role, op.pool)
    a = node.attrs
    response_len, turns, tool_s = batch.response_len, 1, 0.0
    if a.env is not None:  # a multi-turn rollout: its token budget, turns (at most) and tool calls between turns
        response_len = a.max_total_tokens or AGENT_DEFAULTS["max_total_tokens"]
        turns = a.max_turns or AGENT_DEFAULTS["max_turns"]
        tool_s = (turns - 1) * view.ctx.options.tool_call_s * _tool_waves(view, op, batch.prompts * a.n)
    work = Generate(_model(view, op.role), layout_of(p.generation_layout or p.layout), batch.prompts * a.n,
                    batch.prompt_len, response_len, used, samples=a.n, turns=turns, tool_s=tool_s)
    return estimate(work, view.ctx.cluster, view.ctx.options)


def _forward(view: PlanView, op: PlanOp, node: Node) -> CostRecord:
    seq_len = view.ctx.batch.prompt_len + view.ctx.batch.response_len
    sequences = view.sequences(node)
    if view.ctx.models.get(op.role) is None:  # a rule function: host-side, like controller math
        return estimate(Compute(sequences * seq_len), view.ctx.cluster, view.ctx.options)
    p = view.placements[op.role]
    model, layout, trainable = _model(view, op.role), layout_of(p.layout), view.trainable.get(op.role, False)
    if node.kind == "score":  # a reward model runs every row whole
        work = Score(model, layout, trainable, sequences, seq_len, engine=p.train_engine)
    else:
        work = Infer(model, layout, trainable, sequences, seq_len, engine=p.train_engine,
                     prompt_len=view.ctx.batch.prompt_len, samples=view.samples(node))
    return estimate(work, view.ctx.cluster, view.ctx.options)


def _update(view: PlanView, op: PlanOp, node: Node) -> CostRecord:
    batch = view.ctx.batch
    p = view.placements[op.role]
    work = Update(_model(view, op.role), layout_of(p.layout), view.sequences(node),
                  batch.prompt_len + batch.response_len, batch.epochs, batch.mini_batches, engine=p.train_engine,
                  prompt_len=batch.prompt_len, samples=view.samples(node))
    return estimate(work, view.ctx.cluster, view.ctx.options)


def _compute(view: PlanView, op: PlanOp, node: Node) -> CostRecord:
    seq_len = view.ctx.batch.prompt_len + view.ctx.batch.response_len
    return estimate(Compute(view.sequences(node) * seq_len), view.ctx.cluster, view.ctx.options)


NODE_COSTS: dict[str, Callable[[PlanView, PlanOp, Node], CostRecord]] = {
    "generate": _generate, "infer": _forward, "score": _forward, "update": _update, "compute": _compute,
}
"""Cost rule per node kind; the generate rule already counts the pool's resident states in its peak."""


def _node(view: PlanView, op: PlanOp) -> CostRecord:
    """The node's cost rule, plus the cluster's fixed ``op_overhead_s`` and the pool's other resident states."""
    node = view.nodes[op.node]
    record = (_compute if op.reuse else NODE_COSTS[node.kind])(view, op, node)
    region = view.ctx.graph.resample_of(node.name)
    rounds = region.expected_rounds(view.ctx.batch.prompts) if region is not None else 1.0
    time_s = (record.time_s + view.ctx.cluster.op_overhead_s) * rounds
    extra = 0.0 if node.kind == "generate" or op.pool is None else view.others(op.role, op.pool)
    return CostRecord(record.kind, time_s, record.peak_memory_bytes + extra, record.parts, record.problem)


def _weight_sync(view: PlanView, op: PlanOp) -> CostRecord:
    p, model = view.placements[op.role], _model(view, op.role)
    train, gen = layout_of(p.layout), layout_of(p.generation_layout or p.layout)
    used = view.own(op.role, op.pool) + view.others(op.role, op.pool)
    if op.target_pool is None:
        record = estimate(WeightSync(model, train, gen, p.train_engine), view.ctx.cluster, view.ctx.options)
        return CostRecord("weight_sync", record.time_s, used + record.peak_memory_bytes, record.parts, record.problem)
    model_bytes = PARAM_BYTES * model.trainable_params  # a LoRA policy syncs its adapters only
    sync = cross_pool_sync(model_bytes, train, gen, view.ctx.cluster, WEIGHT_SYNC_BUCKET_BYTES)
    return CostRecord("weight_sync", sync.time_s, used + min(WEIGHT_SYNC_BUCKET_BYTES, model_bytes), (("broadcast", sync.time_s),))


def _transfer(view: PlanView, op: PlanOp) -> CostRecord:
    work = (Onload if op.kind == "onload" else Offload)(float(op.volume_bytes or 0))
    record = estimate(work, view.ctx.cluster, view.ctx.options)
    return CostRecord(op.kind, record.time_s, view.own(op.role, op.pool), record.parts)


OP_COSTS: dict[str, Callable[[PlanView, PlanOp], CostRecord]] = {
    "node": _node, "weight_sync": _weight_sync, "offload": _transfer, "onload": _transfer,
}
"""Cost rule per plan op kind."""


def op_cost(view: PlanView, op: PlanOp) -> CostRecord:
    """Predicted time and peak memory per device of ``op`` (infinite time with a ``problem`` when it cannot run)."""
    return OP_COSTS[op.kind](view, op)
