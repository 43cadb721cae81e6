"""Which worker runs what: the plan's pools as device slots, ranks and process groups.

A pure function of the plan (no Ray here): :func:`topology` turns an
:class:`~hybridflow.compiler.plan.ExecutionPlan` into

* one :class:`Slot` per device of every device pool — one Ray actor each — with a
  global rank in one ``torch.distributed`` world that spans every slot, a rank
  within its pool, and the roles it hosts (:class:`RoleSlot`: which engines,
  and over how many data-parallel ranks they are spread);
* the process groups the slots create together: ``pool:<name>`` (the ranks of
  one pool: FSDP and the global counts of an update) and
  ``sync:<role>:<pool>-><target>`` (the train pool's rank 0 and every rank of
  a generation pool: the bucketed weight broadcast).

The Ray executor runs data parallelism only: a layout with tp or pp > 1 is an
ExecutionError that says so (the compiler's cost model knows tensor and
pipeline parallelism; no engine here implements them yet).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..compiler.plan import ExecutionPlan, LayoutPlan, PlanOp
from ..errors import ExecutionError

__all__ = ["RoleSlot", "Slot", "Topology", "topology", "pool_group", "sync_group"]


@dataclass(frozen=True)
class RoleSlot:
    """One role's engines on one slot."""

    role: str
    kind: str
    """Graph role kind: policy, critic, reference, reward, cost."""
    train: bool
    """The slot hosts the role's train engine (policies, critics, references)."""
    rollout: bool
    """The slot hosts the role's rollout engine (policies whose generation runs on this pool)."""
    dp: int
    """Data-parallel ranks the role's engines on this pool are spread over (the pool's size)."""


@dataclass(frozen=True)
class Slot:
    """One device of one pool: a Ray actor hosting every role placed there."""

    pool: str
    rank: int
    """Rank within the pool (the data-parallel rank)."""
    global_rank: int
    """Rank in the ``torch.distributed`` world of all slots."""
    device: str
    """The plan's name of the device ('n0.d3', 'cuda:1', 'cpu')."""
    roles: tuple[RoleSlot, ...]

    @property
    def name(self) -> str:
        return f"{self.pool}/rank{self.rank}"

    def describe(self) -> str:
        """``pool0/rank1 (device n0.d1; roles actor, ref)``, for error messages."""
        return f"{self.name} (device {self.device}; roles {', '.join(r.role for r in self.roles) or '-'})"


@dataclass(frozen=True)
class Topology:
    slots: tuple[Slot, ...]
    groups: dict[str, tuple[int, ...]]
    """Process-group name -> global ranks, in the order every slot creates them."""

    @property
    def world_size(self) -> int:
        return len(self.slots)

    def pool_slots(self, pool: str) -> tuple[Slot, ...]:
        return tuple(s for s in self.slots if s.pool == pool)

    def op_slots(self, op: PlanOp) -> tuple[Slot, ...]:
        """Every slot an op runs on: its pool's, and its target pool's for a cross-pool weight sync."""
        slots = self.pool_slots(op.pool) if op.pool else ()
        return slots + (self.pool_slots(op.target_pool) if op.target_pool else ())


def pool_group(pool: str) -> str:
    return f"pool:{pool}"


def sync_group(role: str, pool: str, target: str) -> str:
    return f"sync:{role}:{pool}->{target}"


def _data_parallel(role: str, layout: LayoutPlan, what: str) -> int:
    if layout.tp > 1 or layout.pp > 1:
        raise ExecutionError(f"role {role!r}: {what} layout {layout} has tensor or pipeline parallelism, which the Ray "
                             "executor does not run (it runs data parallelism with FSDP2); compile with layouts "
                             "dpN·tp1·pp1, e.g. placement 'actor(dp2,tp1,pp1)+ref@2;...'")
    return layout.dp


def topology(plan: ExecutionPlan, role_kinds: Mapping[str, str]) -> Topology:
    """The slots and process groups of ``plan`` (see the module docstring)."""
    hosted: dict[str, list[RoleSlot]] = {pool.name: [] for pool in plan.pools}
    for p in plan.placements:
        kind = role_kinds[p.role]
        dp = _data_parallel(p.role, p.layout, "training")
        generates = kind == "policy"
        own_rollout = generates and p.generation_pool in (None, p.pool)
        hosted[p.pool].append(RoleSlot(p.role, kind, train=kind not in ("reward", "cost"), rollout=own_rollout, dp=dp))
        if generates and not own_rollout:
            gen_dp = _data_parallel(p.role, p.generation_layout or LayoutPlan(dp=len(plan.pool(p.generation_pool).devices)),
                                    "generation")
            hosted[p.generation_pool].append(RoleSlot(p.role, kind, train=False, rollout=True, dp=gen_dp))
    slots: list[Slot] = []
    groups: dict[str, tuple[int, ...]] = {}
    for pool in plan.pools:
        if pool.workers:  # an environment pool: its workers are no device slots (hybridflow.runtime.env_pool)
            continue
        first = len(slots)
        for rank, device in enumerate(pool.devices):
            slots.append(Slot(pool.name, rank, first + rank, device, tuple(hosted[pool.name])))
        groups[pool_group(pool.name)] = tuple(range(first, len(slots)))
    for op in plan.ops:
        if op.kind == "weight_sync" and op.target_pool and op.target_pool != op.pool:
            source = groups[pool_group(op.pool)][0]
            groups.setdefault(sync_group(op.role, op.pool, op.target_pool), (source, *groups[pool_group(op.target_pool)]))
    return Topology(tuple(slots), groups)
