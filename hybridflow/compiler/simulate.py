"""Predicted iteration time per cluster size for the fixed strategies and the automatic placement (HybridFlow §8.3).

:func:`simulate_table` runs the placement search for each model and cluster
size and returns one :class:`SimulationRow` per pair; :func:`format_table`
prints them, each cell with its winner and margin, and — with ``compare`` —
the winner a paper reports for that cell (:data:`REPORTED_WINNERS`).
``hybridflow simulate`` wires this to the command line.

With staleness (``simulate --staleness 0,1,2,4``), :func:`async_table` instead
prices, per model and cluster size, the colocated placement and every split of
the devices between a rollout pool and the training pools
(:func:`~hybridflow.compiler.async_placement.split_costs`), chooses the split per
``k`` by the predicted asynchronous step
(:func:`~hybridflow.compiler.async_placement.choose_split`), and
:func:`format_async_table` prints trained samples per second against ``k``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from pydantic import ValidationError

from ..errors import ConfigError, PlacementError
from .async_placement import SplitChoice, choose_split, split_costs
from .async_cost import samples_per_s
from .cluster import ClusterSpec
from .cost import CostOptions
from .models import ModelSpec
from .placement import FIXED_STRATEGIES, Placement, search
from .workload import Workload, paper_workload

__all__ = ["AsyncRow", "async_table", "format_async_table", "SimulationRow", "REPORTED_WINNERS", "ScalingFigure", "simulate_table", "format_table", "agreement",
           "strong_scaling", "format_scaling", "apply_settings"]

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


def apply_settings(cluster: ClusterSpec, options: CostOptions, settings: Sequence[str]) -> tuple[ClusterSpec, CostOptions]:
    """``cluster`` and ``options`` with ``FIELD=VALUE`` settings applied (``simulate --assume``), each validated by its model.

    A field of :class:`ClusterSpec` (e.g. a measured ``decode_step_overhead_s=0.004``)
    or of :class:`CostOptions` (``train_micro_batch=2``): a sensitivity study,
    not a preset. ConfigError names an unknown field or a value its field refuses.
    """
    updates: tuple[dict, dict] = ({}, {})
    for item in settings:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--assume {item!r}: write FIELD=VALUE, e.g. decode_step_overhead_s=0.004")
        if key in ("name", "nodes", "devices_per_node"):
            raise ConfigError(f"--assume {key}: the cluster's shape comes from --cluster and --gpus")
        target = 0 if key in ClusterSpec.model_fields else 1 if key in CostOptions.model_fields else None
        if target is None:
            raise ConfigError(f"--assume {key!r}: not a field of the cluster ({', '.join(ClusterSpec.model_fields)}) "
                              f"or of the cost options ({', '.join(CostOptions.model_fields)})")
        updates[target][key] = value.strip()
    try:
        cluster = ClusterSpec.model_validate({**cluster.model_dump(), **updates[0]})
        options = CostOptions.model_validate({**options.model_dump(), **updates[1]})
    except ValidationError as err:
        problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"--assume: {problems}") from None
    return cluster, options


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


@dataclass(frozen=True)
class ScalingFigure:
    """Strong scaling of one model's automatic placement from ``gpus[0]`` to ``gpus[1]`` devices."""

    model: str
    gpus: tuple[int, int]
    seconds: tuple[float, float]

    @property
    def efficiency(self) -> float:
        """(throughput at the largest count / throughput at the smallest) / (largest / smallest) = T_s·n_s / (T_l·n_l)."""
        (small, large), (t_small, t_large) = self.gpus, self.seconds
        return t_small * small / (t_large * large)


def strong_scaling(rows: Iterable[SimulationRow]) -> tuple[ScalingFigure, ...]:
    """Per model, the auto placement's strong-scaling efficiency between the smallest and the largest GPU count where it fits.

    The batch is fixed (strong scaling), so throughput is proportional to
    ``1/T``; the efficiency is HybridFlow §8.2's: the throughput at the largest
    scale over that at the smallest, divided by the ratio of the scales.
    Models that fit at fewer than two counts are left out.
    """
    by_model: dict[str, list[SimulationRow]] = {}
    for r in rows:
        if not math.isinf(r.time("auto")):
            by_model.setdefault(r.model, []).append(r)
    figures = []
    for model, found in by_model.items():
        small, large = min(found, key=lambda r: r.gpus), max(found, key=lambda r: r.gpus)
        if small.gpus < large.gpus:
            figures.append(ScalingFigure(model, (small.gpus, large.gpus), (small.time("auto"), large.time("auto"))))
    return tuple(figures)


def format_scaling(figures: Iterable[ScalingFigure]) -> str:
    """One line per model and the mean: ``llama2-7b 16->128 GPUs: 210.1 s -> 30.2 s, efficiency 87.0%``."""
    figures = tuple(figures)
    if not figures:
        return "strong scaling: no model fits at two of the GPU counts"
    lines = [f"  {f.model} {f.gpus[0]}->{f.gpus[1]} GPUs: {f.seconds[0]:.1f} s -> {f.seconds[1]:.1f} s, "
             f"efficiency {100 * f.efficiency:.1f}%" for f in figures]
    mean = sum(f.efficiency for f in figures) / len(figures)
    return "\n".join([f"strong scaling of the auto placement (HybridFlow §8.2: T_small·n_small / (T_large·n_large)), "
                      f"mean {100 * mean:.1f}% (paper: 66.8%, mean over its algorithms and models):", *lines])


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


@dataclass(frozen=True)
class AsyncRow:
    """One (model, cluster size) with staleness: the split chosen per k (empty when nothing fits)."""

    model: str
    gpus: int
    samples: int
    """Trained samples (sequences) per step."""
    choices: tuple[SplitChoice, ...]


def async_table(workload_factory: Callable[[ModelSpec | str], Workload] = paper_workload,
                models: Iterable[str | ModelSpec] = ("llama2-7b",), gpus: Iterable[int] = (16, 32),
                cluster: str | ClusterSpec = "a100-80g", options: CostOptions | None = None, network: str = "default",
                staleness: Sequence[int] = (0, 1, 2, 4)) -> tuple[AsyncRow, ...]:
    """Per model and GPU count, the split of the devices chosen for each staleness k and its predicted step, with
    ``options.generation_time_cv`` and ``options.async_weight_sync`` (:mod:`hybridflow.compiler.async_cost`)."""
    options = options or CostOptions()
    if not staleness or min(staleness) < 0:
        raise ConfigError(f"--staleness {list(staleness)}: give staleness values >= 0, e.g. 0,1,2,4")
    base = (ClusterSpec.parse(cluster) if isinstance(cluster, str) else cluster).with_network(network)
    rows = []
    for model in models:
        spec = ModelSpec.preset(model) if isinstance(model, str) else model
        workload = workload_factory(spec)
        for count in gpus:
            costs = split_costs(workload, _cluster_for(base, count), options)
            choices = () if not costs else tuple(
                choose_split(costs, k, gen_cv=options.generation_time_cv, sync=options.async_weight_sync) for k in staleness)
            rows.append(AsyncRow(spec.name, count, workload.generation.sequences,
                                 tuple(c for c in choices if math.isfinite(c.step_s))))
    return tuple(rows)


def _best_split(choice: SplitChoice) -> tuple[str, float] | None:
    """(label, step) of the fastest split with a rollout pool of its own, None if none fits."""
    split = [(c, t) for c, t in choice.steps if c.rollout_devices and math.isfinite(t)]
    if not split:
        return None
    cost, step = min(split, key=lambda ct: ct[1])
    return cost.label, step


def format_async_table(rows: Iterable[AsyncRow]) -> str:
    """One line per (model, GPUs, k): the chosen placement's predicted step, trained samples/s, ratio to the row's
    first k and the split; then the fastest split with a rollout pool of its own (samples/s and split), which is
    what a run with staleness needs (generation overlaps training only on devices of its own)."""
    head = (f"{'model':<14}{'GPUs':>5}{'k':>4} {'step s':>10} {'samples/s':>10} {'vs first':>8}  {'chosen':<20}"
            f"{'split samples/s':>16}  rollout split")
    lines = [head, "-" * len(head)]
    for r in rows:
        if not r.choices:
            lines.append(f"{r.model:<14}{r.gpus:>5}{'-':>4} {'OOM':>10}")
            continue
        first = r.choices[0].step_s
        for c in r.choices:
            split = _best_split(c)
            tail = f"{'-':>16}  -" if split is None else f"{samples_per_s(r.samples, split[1]):>16.4g}  {split[0]}"
            lines.append(f"{r.model:<14}{r.gpus:>5}{c.k:>4} {c.step_s:>10.4g} {samples_per_s(r.samples, c.step_s):>10.4g} "
                         f"{first / c.step_s:>7.2f}x  {c.best.label:<20}{tail}")
    return "\n".join(lines)
