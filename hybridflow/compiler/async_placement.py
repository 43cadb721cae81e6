"""How many devices go to generation and how many to training, for a given staleness k.

With separate pools, the rollout pool generates while the training pools train
(:mod:`hybridflow.compiler.async_cost`); the split decides both times. With
``k >= 1`` the step is about ``max(gen, train)`` plus the sync, so the best split
balances the two; with ``k = 0`` the pools take turns anyway, so giving every
device to both (colocating: generation and training share all devices, one
after the other) usually wins. :func:`choose_split` scores every split by the
predicted asynchronous step and, if given, the colocated step, and keeps the
fastest.

:func:`split_costs` prices the splits of a real workload on a cluster with the
cost model: the rollout on ``r`` devices in its fastest generation layout, the
other roles placed by the placement search on the rest (the rollout carve-outs
``compile`` tries with staleness: whole nodes, or part of a single node), the
weight sync a bucketed broadcast between the two; colocated is the search's best
placement of the whole workload. ``hybridflow simulate --staleness`` prints the
choice per k (:mod:`hybridflow.compiler.simulate`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from ..capabilities import WEIGHT_SYNC_BUCKET_BYTES
from ..errors import ConfigError, PlacementError
from .async_cost import predict_async
from .cluster import ClusterSpec
from .cost import CostOptions, Generate, estimate
from .layout import Layout, valid_layouts
from .memory import PARAM_BYTES
from .placement import search
from .reshard import cross_pool_sync
from .workload import Workload

__all__ = ["SplitCost", "SplitChoice", "choose_split", "rollout_generation", "rollout_carve_outs", "split_costs"]

COLOCATED = 0
"""``SplitCost.rollout_devices`` of the colocated placement (no rollout pool of its own)."""


@dataclass(frozen=True)
class SplitCost:
    """One way to share the devices: the rollout's devices (0: colocated) and the predicted times of one step's parts.

    Colocated, ``gen_s`` is the generate stage (with the hybrid engine's reshard) and ``train_s`` the rest of the
    iteration; split, ``gen_s`` is the rollout pool's generation, ``train_s`` the other pools' iteration and
    ``sync_s`` the weight sync between them.
    """

    rollout_devices: int
    train_devices: int
    gen_s: float
    train_s: float
    sync_s: float = 0.0

    @property
    def label(self) -> str:
        return "colocated" if self.rollout_devices == COLOCATED else f"gen {self.rollout_devices} | train {self.train_devices}"


@dataclass(frozen=True)
class SplitChoice:
    """The chosen split for staleness ``k``, its predicted step, and every split's step (same order as given)."""

    k: int
    best: SplitCost
    step_s: float
    steps: tuple[tuple[SplitCost, float], ...]


def _step(cost: SplitCost, k: int, gen_cv: float, sync: str) -> float:
    if cost.rollout_devices == COLOCATED:  # one pool: generation and training take turns whatever k is
        return cost.gen_s + cost.sync_s + cost.train_s
    if not all(math.isfinite(x) for x in (cost.gen_s, cost.train_s, cost.sync_s)):
        return math.inf
    return predict_async(cost.gen_s, cost.train_s, k, sync_s=cost.sync_s, gen_cv=gen_cv, sync=sync)


def choose_split(costs: Iterable[SplitCost], k: int, *, gen_cv: float = 0.0, sync: str = "collective") -> SplitChoice:
    """The split with the smallest predicted step at staleness ``k`` (ties to the earlier one given).

    A colocated entry (``rollout_devices == 0``) costs ``gen + sync + train`` at every k (its pool takes
    turns); a split costs :func:`~hybridflow.compiler.async_cost.predict_async` of its parts.
    """
    costs = tuple(costs)
    if not costs:
        raise ConfigError("choose_split: give at least one split to choose from")
    steps = tuple((c, _step(c, k, gen_cv, sync)) for c in costs)
    best, step = min(steps, key=lambda cs: cs[1])
    if math.isinf(step):
        raise PlacementError(f"staleness {k}: no split of the devices fits ({', '.join(c.label for c in costs)})")
    return SplitChoice(k, best, step, steps)


def rollout_generation(workload: Workload, devices: int, cluster: ClusterSpec,
                       options: CostOptions) -> tuple[float, Layout | None]:
    """(seconds, layout) of one step's generation on a rollout pool of ``devices`` in its fastest layout; (inf, None)
    when no layout holds the model."""
    role = next((r for r in workload.roles if r.generates), None)
    if role is None:
        raise ConfigError("the workload generates nothing, so there is no rollout to give devices to")
    gen = workload.generation
    best: tuple[float, Layout | None] = (math.inf, None)
    for layout in valid_layouts(role.model, devices, cluster.devices_per_node):
        if options.data_parallel_only and layout.size != layout.dp:
            continue
        record = estimate(Generate(role.model, layout, gen.sequences, gen.prompt_len, gen.response_len,
                                   samples=gen.samples), cluster, options)
        if record.time_s * gen.generations < best[0]:
            best = (record.time_s * gen.generations, layout)
    return best


def rollout_carve_outs(cluster: ClusterSpec) -> list[tuple[int, ClusterSpec]]:
    """(rollout devices, cluster left for the other roles): whole nodes on multi-node clusters, else devices of the
    one node (what ``compile`` tries with staleness)."""
    if cluster.nodes > 1:
        return [(k * cluster.devices_per_node, cluster.with_nodes(cluster.nodes - k)) for k in range(1, cluster.nodes)]
    node = cluster.devices_per_node
    return [(k, cluster.model_copy(update={"devices_per_node": node - k})) for k in range(1, node)]


def split_costs(workload: Workload, cluster: ClusterSpec, options: CostOptions | None = None) -> tuple[SplitCost, ...]:
    """The colocated placement and every rollout carve-out of ``cluster``, priced (module docstring); splits that do
    not fit are left out."""
    from .passes.placement import without_generation

    options = options or CostOptions()
    found = []
    try:
        whole = search(workload, cluster, options).best
        gen_stage = whole.cost.stage_s[0]  # the generate stage (weight sync to the generation layout included)
        found.append(SplitCost(COLOCATED, cluster.num_devices, gen_stage, whole.iteration_s - gen_stage))
    except PlacementError:
        pass
    actor = next(r for r in workload.roles if r.generates)
    rest_workload = without_generation(workload)
    for devices, rest in rollout_carve_outs(cluster):
        gen_s, gen_layout = rollout_generation(workload, devices, cluster, options)
        if gen_layout is None:
            continue
        try:
            trained = search(rest_workload, rest, options).best
        except PlacementError:
            continue
        sync = cross_pool_sync(PARAM_BYTES * actor.model.trainable_params, trained.placement.of(actor.name).layout,
                               gen_layout, cluster, WEIGHT_SYNC_BUCKET_BYTES).time_s
        found.append(SplitCost(devices, rest.num_devices, gen_s, trained.iteration_s, sync))
    return tuple(found)
