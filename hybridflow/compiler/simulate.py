"""Predicted iteration time per cluster size for the fixed strategies and the automatic placement (HybridFlow §8.3).

:func:`simulate_table` runs the placement search for each model and cluster
size and returns one :class:`SimulationRow` per pair; :func:`format_table`
prints them. ``hybridflow simulate`` wires this to the command line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from ..errors import ConfigError, PlacementError
from .cluster import ClusterSpec
from .cost import CostOptions
from .models import ModelSpec
from .placement import FIXED_STRATEGIES, Placement, search
from .workload import Workload, paper_workload

__all__ = ["SimulationRow", "simulate_table", "format_table"]


@dataclass(frozen=True)
class SimulationRow:
    """One (model, cluster size): seconds per iteration by strategy (inf where it does not fit) and the auto placement."""

    model: str
    gpus: int
    times: tuple[tuple[str, float], ...]
    auto: Placement | None
    search_s: float

    def time(self, strategy: str) -> float:
        return dict(self.times)[strategy]

    @property
    def winner(self) -> str:
        """The fastest fixed strategy (ties to the first in colocate, split, standalone)."""
        return min(FIXED_STRATEGIES, key=self.time)


def _cluster_for(base: ClusterSpec, gpus: int) -> ClusterSpec:
    node = base.devices_per_node
    if gpus % node == 0:
        return base.with_nodes(gpus // node)
    if gpus < node and node % gpus == 0:
        return base.model_copy(update={"nodes": 1, "devices_per_node": gpus})
    raise ConfigError(f"simulate: {gpus} GPUs is neither whole nodes of {node} nor a divisor of one node")


def simulate_table(workload_factory: Callable[[ModelSpec | str], Workload] = paper_workload,
                   models: Iterable[str | ModelSpec] = ("llama2-7b", "llama2-13b", "llama2-34b", "llama2-70b"),
                   gpus: Iterable[int] = (16, 32, 64, 96, 128), cluster: str | ClusterSpec = "a100-80g",
                   options: CostOptions | None = None) -> tuple[SimulationRow, ...]:
    """Per model and GPU count: predicted iteration of colocate / split / standalone / auto, and the auto placement."""
    base = ClusterSpec.parse(cluster) if isinstance(cluster, str) else cluster
    rows = []
    for model in models:
        spec = ModelSpec.preset(model) if isinstance(model, str) else model
        workload = workload_factory(spec)
        for count in gpus:
            c = _cluster_for(base, count)
            try:
                result = search(workload, c, options)
            except PlacementError:
                rows.append(SimulationRow(spec.name, count, tuple((s, math.inf) for s in (*FIXED_STRATEGIES, "auto")), None, 0.0))
                continue
            times = [(s, sp.iteration_s if sp else math.inf) for s, sp in result.fixed]
            times.append(("auto", result.best.iteration_s))
            rows.append(SimulationRow(spec.name, count, tuple(times), result.best.placement, result.seconds))
    return tuple(rows)


def _fmt(seconds: float) -> str:
    return "  OOM" if math.isinf(seconds) else f"{seconds:7.1f}"


def format_table(rows: Iterable[SimulationRow], with_placement: bool = True) -> str:
    """A fixed-width table: model, GPUs, seconds per strategy, search time, and the auto placement's pools."""
    head = f"{'model':<14}{'GPUs':>5} {'colocate':>9}{'split':>9}{'standalone':>11}{'auto':>9}{'search s':>9}  auto placement"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = "".join(f"{_fmt(r.time(s)):>{w}}" for s, w in (("colocate", 9), ("split", 9), ("standalone", 11), ("auto", 9)))
        plan = ""
        if with_placement and r.auto is not None:
            plan = " | ".join(f"{'+'.join(g)}@{p.size}{'*' if off else ''}" for g, p, off in zip(r.auto.groups, r.auto.pools, r.auto.offload))
        lines.append(f"{r.model:<14}{r.gpus:>5} {cells}{r.search_s:>9.2f}  {plan}")
    return "\n".join(lines)
