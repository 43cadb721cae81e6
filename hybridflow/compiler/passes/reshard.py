"""Pass ``reshard``: move the policy's weights from its training layout to its generation layout before it generates.

Before each generate node of a role that the graph also updates (once per
iteration, and again after any update of the role earlier in the same
iteration) this pass inserts a ``weight_sync`` op:

- **same pool** (hybrid engine, HybridFlow §5): the actor trains on
  ``(p, t, d)`` and generates on ``(pg, tg, dg)`` over the same devices; ranks
  all-gather inside *micro-DP groups* (``rank_groups``, pool-local ranks, from
  :func:`hybridflow.compiler.reshard.hybrid_engine_groups`), each receiving
  ``M/(tg·pg) − M/(p·t·d)`` bytes (table 2 with ZeRO-3 sharding over d), peak
  ``M/(tg·pg)``, no redundant copy;
- **across pools** (a rollout pool of its own): the trainer gathers its weights
  bucket by bucket and broadcasts each bucket to the rollout ranks
  (:func:`hybridflow.compiler.reshard.cross_pool_sync`); every rollout rank
  receives ``M`` (``volume_bytes``); ``target_pool`` names the rollout pool.

``M`` is the bf16 weights, 2 bytes per parameter: of the adapters alone for a LoRA
policy (``ModelSpec.adapter_params``), which is all a sync sends.
"""
from __future__ import annotations

from ...capabilities import WEIGHT_SYNC_BUCKET_BYTES
from ..memory import PARAM_BYTES
from ..plan import ExecutionPlan, PlanOp
from ..engine import shards_weights_over_dp
from ..reshard import cross_pool_sync, hybrid_engine_figures, hybrid_engine_groups
from .context import CompileContext
from .timing import layout_of

__all__ = ["reshard", "sync_op"]


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def sync_op(name: str, role: str, plan: ExecutionPlan, ctx: CompileContext, deps: tuple[str, ...]) -> PlanOp:
    """The weight_sync op of ``role`` (hybrid engine in its pool, or a broadcast to its generation pool)."""
    p = plan.placement(role)
    train, gen = layout_of(p.layout), layout_of(p.generation_layout or p.layout)
    model_bytes = PARAM_BYTES * ctx.models[role].trainable_params  # a LoRA policy syncs its adapters only
    if p.generation_pool:
        sync = cross_pool_sync(model_bytes, train, gen, ctx.cluster, WEIGHT_SYNC_BUCKET_BYTES)
        note = (f"bucketed broadcast {p.pool} -> {p.generation_pool}: {sync.buckets} buckets of {_gib(WEIGHT_SYNC_BUCKET_BYTES)}, "
                f"trainer {train} all-gathers each, rank 0 sends it along a chain of {gen.size} rollout ranks ({gen})")
        return PlanOp(name=name, kind="weight_sync", role=role, pool=p.pool, target_pool=p.generation_pool, deps=deps,
                      volume_bytes=int(sync.volume_per_receiver), note=note)
    sharded = shards_weights_over_dp(p.train_engine)  # fsdp: pieces over t·p·d ranks; megatron: over one replica's t·p
    groups = hybrid_engine_groups(train, gen, sharded_over_dp=sharded)
    figures = hybrid_engine_figures(model_bytes, train, gen, sharded_over_dp=sharded)
    note = (f"hybrid engine {train} -> {gen}: {len(groups.micro_dp_groups)} micro-DP groups of {groups.micro_dp_size}, "
            f"all-gather {_gib(figures.comm_volume_bytes)} per rank, peak {_gib(figures.peak_memory_bytes)}, no redundant copy")
    return PlanOp(name=name, kind="weight_sync", role=role, pool=p.pool, deps=deps,
                  volume_bytes=int(figures.comm_volume_bytes), rank_groups=groups.micro_dp_groups, note=note)


def reshard(plan: ExecutionPlan, ctx: CompileContext) -> ExecutionPlan:
    """Insert weight syncs.

    Requires: a placed plan (generating roles have a generation layout, on
    their pool or on ``generation_pool``).
    Guarantees: before the first generate op of every updated role, and
    before any generate op that follows an update of the role in this
    iteration, a ``weight_sync`` op named ``ROLE.weight_sync`` (``#k`` for
    the k-th after the first) that the generate op depends on, with its volume,
    rank groups or target pool; the sync depends on the update before it, if any.
    """
    graph = ctx.graph
    updated = {n.role for n in graph.nodes if n.kind == "update"}
    last_update: dict[str, str | None] = {role: None for role in updated}
    dirty, count, ops = set(updated), {}, []
    current: dict[str, str] = {}
    for op in plan.ops:
        kind = graph.node(op.node).kind if op.kind == "node" else op.kind
        if kind == "generate" and op.role in updated:
            if op.role in dirty:
                k = count[op.role] = count.get(op.role, 0) + 1
                name = f"{op.role}.weight_sync" + (f"#{k}" if k > 1 else "")
                deps = (last_update[op.role],) if last_update[op.role] else ()
                ops.append(sync_op(name, op.role, plan, ctx, deps))
                current[op.role] = name
                dirty.discard(op.role)
            op = op.model_copy(update={"deps": op.deps + (current[op.role],)})
        elif kind == "update" and op.role in updated:
            dirty.add(op.role)
            last_update[op.role] = op.name
        ops.append(op)
    return plan.model_copy(update={"ops": tuple(ops)})
