"""Predicted iteration time per cluster size for the fixed strategies and the automatic placement (HybridFlow §8.3).

:func:`simulate_table` runs the placement search for each model and cluster
size and returns one :class:`SimulationRow` per pair; :func:`format_table`
prints them, each cell with its winner and margin, and — with ``compare`` —
the winner a paper reports for that cell (:data:`REPORTED_WINNERS`).
``hybridflow simulate`` wires this to the command line.
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

__all__ = ["SimulationRow", "REPORTED_WINNERS", "simulate_table", "format_table", "agreement"]

REPORTED_WINNERS: dict[str, dict[tuple[str, int], str]] = {
    # HybridFlow (Sheng et al., EuroSys 2025), §8.3, Figure 12: PPO iteration time of the
    # placements on 16-128 A100s, 13B and 34B models. Colocate is best at 16-64 GPUs; split
    # (actor+ref | critic+reward) for 34B at 96 and 128 and for 13B at 96; standalone
    # (actor 64, critic 32, ref 16, reward 16 GPUs) for 13B at 128.
    "paper": {
        **{("llama2-13b", n): "colocate" for n in (16, 32, 64)},
        **{("llama2-34b", n): "colocate" for n in (16, 32, 64)},
        ("llama2-13b", 96): "split",
        ("llama2-13b", 128): "standalone",
        ("llama2-34b", 96): "split",
        ("llama2-34b", 128): "split",
    },
}
"""Winners other studies report per (model, GPUs), keyed by the name ``--compare`` takes."""


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

    @property
    def margin(self) -> float:
        """How much slower the runner-up fixed strategy is than the winner, as a fraction of the winner's time (inf if nothing else fits; nan if nothing does)."""
        times = sorted(self.time(s) for s in FIXED_STRATEGIES)
        if math.isinf(times[0]):
            return math.nan
        return (times[1] - times[0]) / times[0]


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
                   options: CostOptions | None = None, network: str = "default") -> tuple[SimulationRow, ...]:
    """Per model and GPU count: predicted iteration of colocate / split / standalone / auto, and the auto placement.

    ``network``: a :data:`~hybridflow.compiler.cluster.NETWORK_PRESETS` name for the links between nodes.
    """
    base = (ClusterSpec.parse(cluster) if isinstance(cluster, str) else cluster).with_network(network)
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


def _margin(row: SimulationRow) -> str:
    m = row.margin
    return "-" if math.isnan(m) else ("only" if math.isinf(m) else f"{100 * m:.1f}%")


def agreement(rows: Iterable[SimulationRow], compare: str) -> tuple[int, int]:
    """(cells whose winner is the one ``compare`` reports, cells ``compare`` reports on)."""
    reported = _reported(compare)
    cells = [(r.winner, reported[(r.model, r.gpus)]) for r in rows if (r.model, r.gpus) in reported]
    return sum(ours == theirs for ours, theirs in cells), len(cells)


def _reported(compare: str) -> dict[tuple[str, int], str]:
    if compare not in REPORTED_WINNERS:
        raise ConfigError(f"--compare {compare!r}: known studies are {', '.join(REPORTED_WINNERS)}")
    return REPORTED_WINNERS[compare]


def format_table(rows: Iterable[SimulationRow], with_placement: bool = True, compare: str | None = None) -> str:
    """A fixed-width table: model, GPUs, seconds per strategy, the winning fixed strategy and its margin over the
    runner-up, (with ``compare``) the winner that study reports and whether they agree, search time, and the auto placement's pools."""
    reported = _reported(compare) if compare else {}
    extra = f"{compare:>11} " if compare else ""
    head = (f"{'model':<14}{'GPUs':>5} {'colocate':>9}{'split':>9}{'standalone':>11}{'auto':>9}  {'winner':<11}{'margin':>7} "
            f"{extra}{'search s':>9}  auto placement")
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = "".join(f"{_fmt(r.time(s)):>{w}}" for s, w in (("colocate", 9), ("split", 9), ("standalone", 11), ("auto", 9)))
        winner = r.winner if not math.isnan(r.margin) else "-"
        theirs = ""
        if compare:
            paper = reported.get((r.model, r.gpus))
            theirs = f"{'-':>11} " if paper is None else f"{paper:>10}{'=' if paper == winner else '≠'} "
        plan = ""
        if with_placement and r.auto is not None:
            plan = " | ".join(f"{'+'.join(g)}@{p.size}{'*' if off else ''}" for g, p, off in zip(r.auto.groups, r.auto.pools, r.auto.offload))
        lines.append(f"{r.model:<14}{r.gpus:>5} {cells}  {winner:<11}{_margin(r):>7} {theirs}{r.search_s:>9.2f}  {plan}")
    return "\n".join(lines)
