"""Data-parallel communication time of the training engines (the rules :mod:`.engine` describes).

Each rule gives, for one optimizer step of an update, ``(time overlapped with
compute, time exposed)``; :data:`DP_RULES` maps the engine name to it. A
trainable model's forward-only pass under ZeRO-3 costs :func:`zero3_time`
gathers per micro-batch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from . import memory as mem
from .cluster import ClusterSpec
from .comm import all_gather_time, span_of_group
from .layout import Layout
from .models import ModelSpec

if TYPE_CHECKING:
    from .cost import CostOptions

__all__ = ["zero3_time", "DP_RULES"]


def zero3_time(model: ModelSpec, layout: Layout, collectives: int, c: ClusterSpec) -> float:
    """``collectives`` all-gathers / reduce-scatters of the bf16 tp·pp shard over the dp ranks (stride tp·pp)."""
    if layout.dp == 1:
        return 0.0
    span = span_of_group(layout.dp, layout.model_parallel)
    return collectives * all_gather_time(2 * model.params / layout.model_parallel, layout.dp, span, c)


def _zero3_update_dp(m: ModelSpec, l: Layout, compute: float, micro_batches: int, flops_per_token: float,
                     c: ClusterSpec, o: CostOptions) -> tuple[float, float]:
    """fsdp, per optimizer step: (overlapped, exposed) = (3 collectives per micro-batch, 0)."""
    return micro_batches * zero3_time(m, l, 3, c), 0.0


def _distributed_optimizer_dp(m: ModelSpec, l: Layout, compute: float, micro_batches: int, flops_per_token: float,
                              c: ClusterSpec, o: CostOptions) -> tuple[float, float]:
    """megatron, per optimizer step: (0, exposed), exposed = max(0, T_rs − T_backward_last) + T_ag.

    T_rs: ring reduce-scatter of the fp32 gradient buffer (4·P/mp bytes) over
    the dp ranks (stride t·p); T_ag: ring all-gather of the bf16 weights
    (2·P/mp bytes); T_backward_last: the backward (with its recomputed
    forward) of the last micro-batch, (flops_per_token − 2·N)/flops_per_token
    of that micro-batch's compute, 0 without ``o.overlap_grad_reduce``.
    """
    if l.dp == 1:
        return 0.0, 0.0
    span = span_of_group(l.dp, l.model_parallel)
    shard = m.params / l.model_parallel
    reduce_scatter = all_gather_time(4 * shard, l.dp, span, c)
    all_gather = all_gather_time(mem.PARAM_BYTES * shard, l.dp, span, c)
    last_backward = compute / micro_batches * (flops_per_token - 2 * m.flop_params) / flops_per_token
    if not o.overlap_grad_reduce:
        last_backward = 0.0
    return 0.0, max(0.0, reduce_scatter - last_backward) + all_gather


DP_RULES: dict[str, Callable[..., tuple[float, float]]] = {
    "fsdp": _zero3_update_dp,
    "megatron": _distributed_optimizer_dp,
}
"""Data-parallel communication of one optimizer step per training engine: (time overlapped with compute, time exposed)."""
