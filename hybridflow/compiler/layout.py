"""Parallel layouts: how one model is split over the devices of its pool.

A :class:`Layout` ``(dp, tp, pp)`` uses ``dp x tp x pp`` devices: ``tp``-way tensor
parallelism (Megatron-LM, Shoeybi et al. 2019) inside a node, ``pp`` pipeline
stages, and ``dp`` data-parallel replicas. Ranks are numbered with tp fastest,
then pp, then dp (``rank = d·(pp·tp) + p·tp + t``), so one replica's
``tp x pp`` model-parallel group is contiguous.

Validity (:func:`layout_problem`): ``tp`` divides the node size and the number
of attention heads, and the kv heads divide into or are replicated over the tp
ranks (``kv_heads % tp == 0`` or ``tp % kv_heads == 0``, as vLLM and Megatron
allow); ``pp`` divides the number of layers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..errors import ConfigError
from .engine import DEFAULT_ENGINE, shards_weights_over_dp
from .models import ModelSpec

__all__ = ["Layout", "layout_problem", "valid_layouts", "generation_layouts", "divisors"]


@dataclass(frozen=True, order=True)
class Layout:
    """``dp`` replicas x ``tp`` tensor-parallel ranks x ``pp`` pipeline stages."""

    dp: int
    tp: int = 1
    pp: int = 1

    @property
    def size(self) -> int:
        """Devices used: dp x tp x pp."""
        return self.dp * self.tp * self.pp

    @property
    def model_parallel(self) -> int:
        """Devices holding one copy of the model: tp x pp."""
        return self.tp * self.pp

    def __str__(self) -> str:
        return f"dp{self.dp}·tp{self.tp}·pp{self.pp}"

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """Parse ``"dp2·tp4·pp1"``, ``"dp2,tp4,pp1"`` or ``"2,4,1"`` (dp, tp, pp in that order)."""
        values = [int(v) for v in re.findall(r"\d+", text)]
        if len(values) != 3:
            raise ConfigError(f"layout {text!r}: expected three degrees dp, tp, pp, e.g. 'dp2·tp4·pp1'")
        return cls(*values)


def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of ``n`` in increasing order."""
    return tuple(k for k in range(1, n + 1) if n % k == 0)


def layout_problem(layout: Layout, model: ModelSpec, devices_per_node: int) -> str | None:
    """Why ``layout`` cannot run ``model`` on nodes of ``devices_per_node``, or None when it can."""
    tp, pp = layout.tp, layout.pp
    if min(layout.dp, tp, pp) < 1:
        return f"{layout}: every degree must be >= 1"
    if tp > devices_per_node or devices_per_node % tp:
        return f"{layout}: tp {tp} must divide the node size {devices_per_node} (tensor parallelism stays inside a node)"
    if model.heads % tp:
        return f"{layout}: tp {tp} must divide the {model.heads} attention heads of {model.name}"
    if model.kv_heads % tp and tp % model.kv_heads:
        return f"{layout}: tp {tp} and the {model.kv_heads} kv heads of {model.name} must divide one another"
    if model.layers % pp:
        return f"{layout}: pp {pp} must divide the {model.layers} layers of {model.name}"
    return None


@lru_cache(maxsize=4096)
def valid_layouts(model: ModelSpec, devices: int, devices_per_node: int) -> tuple[Layout, ...]:
    """Every valid ``(dp, tp, pp)`` with ``dp·tp·pp == devices``, ordered by (tp, pp)."""
    found = []
    for tp in divisors(devices):
        for pp in divisors(devices // tp):
            layout = Layout(devices // (tp * pp), tp, pp)
            if layout_problem(layout, model, devices_per_node) is None:
                found.append(layout)
    return tuple(sorted(found, key=lambda l: (l.tp, l.pp)))


@lru_cache(maxsize=4096)
def generation_layouts(model: ModelSpec, train: Layout, devices_per_node: int, engine: str = DEFAULT_ENGINE) -> tuple[Layout, ...]:
    """Generation layouts ``(dg, tg, pg)`` on the training pool that the hybrid engine can reach without redundancy.

    A generation shard must be a union of training shards, so ``pg | pp`` and
    ``tg`` divides the number of column pieces: ``tp·dp`` for the ``fsdp``
    engine (ZeRO-3 splits each tensor-parallel shard further over the dp
    ranks), ``tp`` for ``megatron`` (weights replicated over dp; HybridFlow §5
    requires ``tg | t`` and ``pg | p``). ``dg`` fills the pool:
    ``dg = size / (tg·pg)``.
    """
    columns = train.tp * train.dp if shards_weights_over_dp(engine) else train.tp
    found = []
    for pg in divisors(train.pp):
        for tg in divisors(columns):
            if (train.size // pg) % tg:
                continue
            layout = Layout(train.size // (tg * pg), tg, pg)
            if layout_problem(layout, model, devices_per_node) is None:
                found.append(layout)
    return tuple(sorted(found, key=lambda l: (l.tp, l.pp)))
