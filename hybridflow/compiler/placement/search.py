"""Automatic placement: which roles share devices, how many devices each group gets, and every role's layout.

The search space (HybridFlow §6 and appendix C, algorithm 1):

1. every **set partition** of the roles into colocated groups;
2. every **allocation** of devices to the groups, by the allocation rule:
   a group gets a power of two that divides the node size (1, 2, 4 on nodes
   of 8) or a whole number of nodes, and the groups must pack into the
   cluster — whole-node groups take whole nodes, and the sub-node groups
   (powers of two, so they pack perfectly) take ``ceil(sum / node)`` more
   nodes. Devices may stay idle;
3. every valid ``(dp, tp, pp)`` layout per role under each training engine
   the role allows (``RoleWork.engines``: fsdp, megatron), and per generating role
   every generation layout the hybrid engine reaches without redundancy; per
   group, resident or offloaded states.

Each point is scored by :func:`~hybridflow.compiler.placement.evaluate.evaluate`
(sum over stages of the max over groups). The search is exact over this
space: per-role and per-group candidates are pruned by dominance only
(:mod:`.options`), and the allocation search is a branch and bound whose
bound (each stage's time is at least the current groups' max and every
remaining group's fastest option) never cuts a better point. It starts from
the three fixed strategies, which lie in the space, so ``auto`` is never worse
than any of them.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ...errors import PlacementError
from ..cluster import ClusterSpec
from ..cost import CostOptions
from ..workload import STAGES, Workload
from .evaluate import PlacementCost, controller_time, evaluate
from .options import GroupOption, group_options, pareto
from .types import Placement, Pool, RolePlacement

__all__ = ["ScoredPlacement", "SearchResult", "FIXED_STRATEGIES", "allowed_sizes", "packs", "set_partitions",
           "assign_devices", "fixed_allocation", "fixed_strategy_refusal", "place_fixed", "search", "place"]

FIXED_STRATEGIES = ("colocate", "split", "standalone")


@dataclass(frozen=True)
class ScoredPlacement:
    """A placement and its simulated iteration."""

    placement: Placement
    cost: PlacementCost

    @property
    def iteration_s(self) -> float:
        return self.cost.iteration_s


@dataclass(frozen=True)
class SearchResult:
    """The best placement, the runners-up (distinct partitions/allocations), the fixed strategies, and the search time."""

    best: ScoredPlacement
    runners_up: tuple[ScoredPlacement, ...]
    fixed: tuple[tuple[str, ScoredPlacement | None], ...]
    seconds: float

    def fixed_strategy(self, name: str) -> ScoredPlacement | None:
        """The fixed strategy ``name``'s placement (None when it does not apply or fit)."""
        return dict(self.fixed)[name]


# ---------------------------------------------------------------- allocation rule
def allowed_sizes(cluster: ClusterSpec) -> tuple[int, ...]:
    """Device counts a group may get: powers of two dividing the node size (below it), then 1..nodes whole nodes."""
    node = cluster.devices_per_node
    sub = [1 << k for k in range(node.bit_length()) if (1 << k) < node and node % (1 << k) == 0]
    return tuple(sub + [node * k for k in range(1, cluster.nodes + 1)])


def packs(sizes: tuple[int, ...] | list[int], cluster: ClusterSpec) -> bool:
    """Whether groups of these sizes fit the cluster: whole-node groups + ceil(sub-node total / node) nodes <= nodes."""
    node = cluster.devices_per_node
    whole = sum(s for s in sizes if s >= node)
    sub = sum(s for s in sizes if s < node)
    return whole + node * math.ceil(sub / node) <= cluster.num_devices


def assign_devices(sizes: tuple[int, ...], cluster: ClusterSpec) -> tuple[tuple[int, ...], ...]:
    """Concrete device indices per group: whole-node groups first (largest first), then sub-node groups packed, largest first."""
    if not packs(sizes, cluster):
        raise PlacementError(f"groups of {list(sizes)} devices do not fit {cluster.nodes} nodes of {cluster.devices_per_node}")
    order = sorted(range(len(sizes)), key=lambda k: -sizes[k])
    start, out = 0, [()] * len(sizes)
    for k in order:
        out[k] = tuple(range(start, start + sizes[k]))
        start += sizes[k]
    return tuple(out)


def set_partitions(items: tuple[str, ...]):
    """Every partition of ``items`` into non-empty groups (Bell(n) of them), groups in first-item order."""
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield ((first,),) + part
        for k in range(len(part)):
            yield part[:k] + ((first,) + part[k],) + part[k + 1:]


def _canonical(part, names: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    groups = [tuple(sorted(g, key=names.index)) for g in part]
    return tuple(sorted(groups, key=lambda g: names.index(g[0])))


# ---------------------------------------------------------------- fixed strategies
def fixed_allocation(strategy: str, workload: Workload, cluster: ClusterSpec):
    """(groups, sizes) of a fixed strategy, or None where it does not apply.

    - ``colocate``: all roles on all devices.
    - ``split``: actor and ref on one half, the other roles on the other (the
      OpenRLHF-like split of HybridFlow §8.3); the first half gets the odd node.
    - ``standalone``: every role on its own equal share of whole nodes (extra
      nodes to the first roles), or of a power of two below a node when
      there are fewer nodes than roles.
    """
    names, node, nodes = workload.role_names, cluster.devices_per_node, cluster.nodes
    if strategy == "colocate":
        return (names,), (cluster.num_devices,)
    if strategy == "split":
        first = tuple(n for n in names if n in ("actor", "ref"))
        second = tuple(n for n in names if n not in first)
        if not first or not second:
            return None
        if nodes >= 2:
            return (first, second), (node * math.ceil(nodes / 2), node * (nodes // 2))
        half = node // 2
        return ((first, second), (half, half)) if half in allowed_sizes(cluster) else None
    if strategy == "standalone":
        k = len(names)
        if nodes >= k:
            sizes = tuple(node * (nodes // k + (i < nodes % k)) for i in range(k))
        else:
            share = max((s for s in allowed_sizes(cluster) if s < node and s * k <= cluster.num_devices), default=0)
            if not share:
                return None
            sizes = (share,) * k
        return tuple((n,) for n in names), sizes
    raise PlacementError(f"unknown placement strategy {strategy!r}; use auto, {', '.join(FIXED_STRATEGIES)}")


def fixed_strategy_refusal(strategy: str, workload: Workload, cluster: ClusterSpec) -> str:
    """Why fixed ``strategy`` gives no placement of ``workload`` on ``cluster``, and what it would need."""
    names = list(workload.role_names)
    where = cluster.describe()
    if strategy == "split":
        first = [n for n in names if n in ("actor", "ref")]
        second = [n for n in names if n not in first]
        if not first or not second:
            return (f"strategy 'split' puts actor and ref on one half of the devices and the other roles with a model "
                    f"(critic, reward model, cost model) on the other; this graph's roles on devices are "
                    f"{names}, so one half would be empty (a rule reward runs on the host, not on a device). It needs "
                    "a role on each side; use 'colocate' or 'auto'")
        if fixed_allocation(strategy, workload, cluster) is None:
            return (f"strategy 'split' gives {first} one half and {second} the other half of the devices; {where} "
                    "cannot be halved (it needs 2 or more nodes, or nodes whose half is a power of two: 2, 4, 8 ... devices); "
                    "use 'colocate' or 'auto', or a cluster with more devices")
    if strategy == "standalone" and fixed_allocation(strategy, workload, cluster) is None:
        return (f"strategy 'standalone' gives each of the {len(names)} roles {names} its own devices; {where} has "
                f"too few to give each a share; use 'colocate' or 'auto', or a cluster with more devices")
    return (f"strategy {strategy!r} places roles {names} on {where}, but a model does not fit its share of the "
            "devices' memory; try 'auto', more devices, or smaller models")


class TopK:
    """The k best distinct keys seen, with the k-th value as the pruning threshold."""

    def __init__(self, k: int):
        self.k, self.best = k, {}

    @property
    def threshold(self) -> float:
        if len(self.best) < self.k:
            return math.inf
        return sorted(v for v, _ in self.best.values())[self.k - 1]

    def offer(self, value: float, key, choice) -> None:
        if value == math.inf or (key in self.best and self.best[key][0] <= value):
            return
        if value < self.threshold or key in self.best:
            self.best[key] = (value, choice)
            if len(self.best) > self.k:
                worst = max(self.best, key=lambda kk: self.best[kk][0])
                del self.best[worst]


def _group_roles(workload: Workload, group: tuple[str, ...]):
    return tuple(workload.role(n) for n in group)


def _fixed_choice(strategy, workload, cluster, options, constant):
    """(value, key, choice) of a fixed strategy's best layouts, or None."""
    alloc = fixed_allocation(strategy, workload, cluster)
    if alloc is None:
        return None
    names = workload.role_names
    groups, sizes = zip(*sorted(zip(*alloc), key=lambda gs: names.index(gs[0][0])))
    fronts = [list(group_options(_group_roles(workload, g), s, workload.generation, cluster, options)) for g, s in zip(groups, sizes)]
    top = TopK(1)
    branch_and_bound(fronts, groups, cluster, constant, top, check_packing=False)
    if not top.best:
        return None
    ((key, (value, choice)),) = top.best.items()
    return value, key, choice


def _placement_from_choice(workload, cluster, choice, strategy: str) -> Placement:
    sizes = tuple(opt.size for _, opt in choice)
    devices = assign_devices(sizes, cluster)
    roles = []
    for k, (group, opt) in enumerate(choice):
        for name, (layout, gen_layout, engine) in zip(group, opt.layouts):
            roles.append(RolePlacement(name, k, layout, gen_layout, engine))
    order = {n: i for i, n in enumerate(workload.role_names)}
    return Placement(pools=tuple(Pool(d) for d in devices), roles=tuple(sorted(roles, key=lambda r: order[r.role])),
                     offload=tuple(opt.offload for _, opt in choice), strategy=strategy)


def scored_placement(workload, cluster, options, choice, strategy, expected: float) -> ScoredPlacement:
    """The placement of a search ``choice``, evaluated; PlacementError if its cost is not the search's ``expected``."""
    placement = _placement_from_choice(workload, cluster, choice, strategy)
    cost = evaluate(placement, workload, cluster, options)
    if not math.isclose(cost.iteration_s, expected, rel_tol=1e-9):
        raise PlacementError(f"internal: search scored {expected} but evaluation gives {cost.iteration_s} for\n{placement.describe()}")
    return ScoredPlacement(placement, cost)


def place_fixed(strategy: str, workload: Workload, cluster: ClusterSpec, options: CostOptions | None = None) -> ScoredPlacement | None:
    """The best layouts for a fixed strategy's groups and sizes; None when it does not apply or does not fit."""
    options = options or CostOptions()
    found = _fixed_choice(strategy, workload, cluster, options, controller_time(workload, cluster, options))
    return None if found is None else scored_placement(workload, cluster, options, found[2], strategy, found[0])


# ---------------------------------------------------------------- branch and bound
def branch_and_bound(cands: list[list[GroupOption]], groups, cluster: ClusterSpec, constant: float, top: TopK,
                     check_packing: bool = True) -> None:
    """Depth-first over one option per group; prunes with a lower bound against ``top``'s threshold."""
    k, stages = len(cands), len(STAGES)
    if any(not c for c in cands):
        return
    lows = [tuple(min(o.times[s] for o in c) for s in range(stages)) for c in cands]
    rest = [(0.0,) * stages] * (k + 1)
    for g in range(k - 1, -1, -1):
        rest[g] = tuple(max(a, b) for a, b in zip(lows[g], rest[g + 1]))
    node = cluster.devices_per_node

    def visit(g: int, whole: int, sub: int, vec: tuple[float, ...], chosen: list) -> None:
        if g == k:
            key = tuple((grp, opt.size) for grp, opt in zip(groups, chosen))
            top.offer(sum(vec) + constant, key, list(zip(groups, chosen)))
            return
        threshold, after = top.threshold, rest[g + 1]
        for opt in cands[g]:
            w, s = (whole + opt.size, sub) if opt.size >= node else (whole, sub + opt.size)
            if check_packing and w + node * -(-s // node) > cluster.num_devices:
                continue
            new = tuple(max(a, b) for a, b in zip(vec, opt.times))
            if sum(max(a, b) for a, b in zip(new, after)) + constant >= threshold:
                continue
            chosen.append(opt)
            visit(g + 1, w, s, new, chosen)
            chosen.pop()
            threshold = top.threshold

    visit(0, 0, 0, (0.0,) * stages, [])


def _group_candidates(workload, cluster, options, group) -> list[GroupOption]:
    """All sizes' options of one group, Pareto-pruned on (size, stage times), fastest first."""
    roles = _group_roles(workload, group)
    found = [o for n in allowed_sizes(cluster) for o in group_options(roles, n, workload.generation, cluster, options)]
    kept = pareto(found, key=lambda o: (float(o.size),) + o.times)  # fewer devices never packs worse
    return sorted(kept, key=lambda o: (sum(o.times), o.size))


def search(workload: Workload, cluster: ClusterSpec, options: CostOptions | None = None, top_k: int = 5) -> SearchResult:
    """Exhaustive-by-bounds search of the placement space (module docstring); the best and up to ``top_k − 1`` runners-up."""
    start = time.perf_counter()
    options = options or CostOptions()
    constant = controller_time(workload, cluster, options)
    top = TopK(max(1, top_k))
    fixed = []
    for strategy in FIXED_STRATEGIES:
        found = _fixed_choice(strategy, workload, cluster, options, constant)
        fixed.append((strategy, None if found is None else scored_placement(workload, cluster, options, found[2], strategy, found[0])))
        if found is not None:
            top.offer(*found)
    names = workload.role_names
    candidates: dict[tuple[str, ...], list[GroupOption]] = {}
    for part in set_partitions(names):
        groups = _canonical(part, names)
        for g in groups:
            if g not in candidates:
                candidates[g] = _group_candidates(workload, cluster, options, g)
        branch_and_bound([candidates[g] for g in groups], groups, cluster, constant, top)
    if not top.best:
        raise PlacementError(f"no placement of {', '.join(names)} fits {cluster.describe()}: every layout runs out of memory; "
                             "use more nodes, devices with more memory, or smaller models")
    ranked = sorted(top.best.values(), key=lambda vc: vc[0])
    scored = [scored_placement(workload, cluster, options, choice, "auto", value) for value, choice in ranked]
    return SearchResult(best=scored[0], runners_up=tuple(scored[1:]), fixed=tuple(fixed), seconds=time.perf_counter() - start)


def place(workload: Workload, cluster: ClusterSpec, strategy: str = "auto", options: CostOptions | None = None) -> ScoredPlacement:
    """The placement of ``strategy`` (``auto`` searches; ``colocate`` / ``split`` / ``standalone`` are fixed)."""
    if strategy == "auto":
        return search(workload, cluster, options).best
    found = place_fixed(strategy, workload, cluster, options)
    if found is None:
        raise PlacementError(fixed_strategy_refusal(strategy, workload, cluster))
    return found
