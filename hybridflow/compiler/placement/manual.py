"""Manual placement: pools (and optionally layouts) given by the user, or a ``device_map`` dict.

- :func:`manual_placement`: the user names the groups of colocated roles and
  their device counts (:class:`PoolSpec`), optionally some layouts; the
  layouts left open are chosen by the cost model.
- :func:`placement_from_device_map`: ``{"actor": "cuda:0", "critic": "cuda:0",
  "reward": "cpu"}`` — roles on the same device string share a pool of that
  one device; every layout is ``dp1·tp1·pp1``.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ...errors import ConfigError, PlacementError
from ...names import DEVICE_RE
from ..cluster import ClusterSpec
from ..cost import CostOptions
from ..layout import Layout, layout_problem
from ..workload import Workload
from .evaluate import controller_time
from .options import group_combinations, make_candidate, role_candidates
from .search import ScoredPlacement, TopK, branch_and_bound, packs, scored_placement

__all__ = ["PoolSpec", "manual_placement", "placement_from_device_map"]


class PoolSpec(BaseModel):
    """One user-given pool: the roles colocated on it, its device count, and any layouts to use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    roles: tuple[str, ...] = Field(min_length=1, description="Roles sharing this pool.")
    devices: int = Field(ge=1, description="Devices in the pool.")
    layouts: dict[str, str] = Field(default_factory=dict, description="Role -> layout 'dpD·tpT·ppP'; roles left out get the cost model's best.")
    gen_layout: str | None = Field(default=None, description="Generation layout of the generating role, if it is in this pool.")

    def __hash__(self) -> int:  # dict field: hash by content
        return hash((self.roles, self.devices, tuple(sorted(self.layouts.items())), self.gen_layout))


def _candidates_for(workload: Workload, cluster: ClusterSpec, options: CostOptions, spec: PoolSpec):
    per_role = []
    for name in spec.roles:
        role = workload.role(name)
        if name not in spec.layouts:
            per_role.append(role_candidates(role, spec.devices, workload.generation, cluster, options))
            continue
        layout = Layout.parse(spec.layouts[name])
        problem = layout_problem(layout, role.model, cluster.devices_per_node)
        if problem or layout.size != spec.devices:
            raise ConfigError(f"pool {list(spec.roles)}: layout {layout} of {name!r} does not fit {spec.devices} devices ({problem or 'dp·tp·pp must equal the device count'})")
        per_role.append(tuple(make_candidate(role, layout, engine, workload.generation, cluster, options)
                              for engine in role.search_engines))
    return per_role


def manual_placement(workload: Workload, cluster: ClusterSpec, pools: Sequence[PoolSpec],
                     options: CostOptions | None = None) -> ScoredPlacement:
    """Place roles on the user's pools; fill open layouts with the best ones; raise PlacementError if nothing fits."""
    options = options or CostOptions()
    names = sorted(n for p in pools for n in p.roles)
    if names != sorted(workload.role_names):
        raise PlacementError(f"pools place roles {names} but the workload has {sorted(workload.role_names)}; place each role exactly once")
    if not packs([p.devices for p in pools], cluster):
        raise PlacementError(f"pools of {[p.devices for p in pools]} devices do not fit {cluster.describe()}; "
                             "give each pool a power of two below a node or whole nodes, within the cluster")
    order = sorted(pools, key=lambda p: min(workload.role_names.index(r) for r in p.roles))
    fronts, groups = [], []
    for spec in order:
        roles = tuple(workload.role(n) for n in spec.roles)
        gen = Layout.parse(spec.gen_layout) if spec.gen_layout else None
        found = group_combinations(roles, spec.devices, _candidates_for(workload, cluster, options, spec),
                                   workload.generation, cluster, options, gen_layout=gen)
        if not found:
            raise PlacementError(f"pool {list(spec.roles)} on {spec.devices} devices: no layout fits in memory; give it more devices or offload")
        fronts.append(found)
        groups.append(spec.roles)
    top = TopK(1)
    constant = controller_time(workload, cluster, options)
    branch_and_bound(fronts, tuple(groups), cluster, constant, top, check_packing=False)
    ((_, (value, choice)),) = top.best.items()
    return scored_placement(workload, cluster, options, choice, "manual", value)


def placement_from_device_map(device_map: Mapping[str, str], workload: Workload):
    """A placement from ``{role: device string}``: one single-device pool per distinct string, colocating its roles."""
    from .types import Placement, Pool, RolePlacement

    missing = [r for r in workload.role_names if r not in device_map]
    extra = [r for r in device_map if r not in workload.role_names]
    if missing or extra:
        raise ConfigError(f"device_map: roles {missing} are missing and {extra} are unknown; map every role of {list(workload.role_names)} to a device such as 'cuda:0' or 'cpu'")
    pools: dict[str, int] = {}
    roles = []
    for name in workload.role_names:
        device = device_map[name].strip().lower()
        match = DEVICE_RE.match(device)
        if not match:
            raise ConfigError(f"device_map[{name!r}] = {device_map[name]!r}: expected 'cpu', 'cuda', 'cuda:N' or 'mps'")
        kind, index = device.partition(":")[0], int(match.group("index") or 0)
        key = "cpu" if kind == "cpu" else f"{kind}:{index}"
        pools.setdefault(key, len(pools))
        gen = Layout(1) if workload.role(name).generates else None
        roles.append(RolePlacement(name, pools[key], Layout(1), gen))
    pool_records = []
    for key in pools:
        kind, _, index = key.partition(":")
        pool_records.append(Pool((int(index or 0),), kind))
    return Placement(pools=tuple(pool_records), roles=tuple(roles), strategy="device_map")
