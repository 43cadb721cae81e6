"""Simulated iteration time of a placement (HybridFlow appendix C, made explicit).

Per pool (a group of colocated roles), the time of each stage is the **sum**
of its roles' work in that stage (colocated roles take turns); the iteration
time is the **sum over stages of the max over pools** (disjoint pools run
concurrently, but a stage waits for the previous one), plus the controller's
compute between the infer and train stages. Transition costs are charged to
the stage they precede: the actor's weight sync (training -> generation
layout) to ``generate``; onload/offload of model states to every stage a role
works in, when its pool runs in offload mode.

Memory, per device: in a resident pool every role's states stay on the
device, so a role's work needs ``its peak + the other roles' states``; in an
offload pool only the working role's states are on the device. The actor's
KV cache gets whatever the states and generation weights leave.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ...errors import PlacementError
from ..cluster import ClusterSpec
from ..engine import DEFAULT_ENGINE, TRAIN_ENGINES
from ..cost import (DEFAULT_OPTIONS, CostOptions, Compute, Generate, Infer, Offload, Score, Update, WeightSync, estimate,
                    generation_plan, generation_time)
from ..layout import Layout, generation_layouts, layout_problem
from ..memory import generation_weight_bytes, kv_bytes_per_sequence, resident_bytes
from ..models import ModelSpec
from ..rollout_engines import rollout_engine_cost
from ..workload import STAGES, GenerationWork, RoleWork, Workload
from .types import Placement

__all__ = ["RoleEstimate", "GroupCost", "PlacementCost", "role_estimate", "weight_sync_estimate", "generation_estimate",
           "group_cost", "evaluate", "member_stages"]

GEN, INFER, TRAIN = range(len(STAGES))
INF = math.inf


@dataclass(frozen=True)
class RoleEstimate:
    """One role on one layout, generation aside: its resident states, and time and own peak memory per stage."""

    role: str
    layout: Layout
    resident: float
    times: tuple[float, ...]
    peaks: tuple[float, ...]
    problem: str | None = None
    engine: str = DEFAULT_ENGINE


def member_stages(role: RoleWork) -> tuple[int, ...]:
    """Indices of the stages ``role`` works in."""
    return tuple(s for s, works in ((GEN, role.generates), (INFER, role.infer_passes + role.score_passes > 0),
                                    (TRAIN, role.train_epochs > 0)) if works)


@lru_cache(maxsize=200_000)
def role_estimate(role: RoleWork, layout: Layout, gen: GenerationWork, cluster: ClusterSpec, options: CostOptions,
                  engine: str = DEFAULT_ENGINE) -> RoleEstimate:
    """Infer/score and update costs of ``role`` on ``layout`` trained by ``engine`` (cached per role, layout, engine and cluster)."""
    m, seqs, seq_len = role.model, gen.sequences, gen.seq_len
    times, peaks = [0.0] * len(STAGES), [0.0] * len(STAGES)
    records = []
    if role.infer_passes:
        records.append((INFER, estimate(Infer(m, layout, role.trainable, seqs, seq_len, role.infer_passes, engine,
                                              gen.prompt_len, gen.samples), cluster, options)))
    if role.score_passes:
        records.append((INFER, estimate(Score(m, layout, role.trainable, seqs, seq_len, role.score_passes, engine), cluster, options)))
    if role.train_epochs:
        records.append((TRAIN, estimate(Update(m, layout, seqs, seq_len, role.train_epochs, role.mini_batches, engine,
                                               gen.prompt_len, gen.samples), cluster, options)))
    for stage, rec in records:
        times[stage] += rec.time_s
        peaks[stage] = max(peaks[stage], rec.peak_memory_bytes)
    resident = resident_bytes(m, layout, role.trainable, engine)
    return RoleEstimate(role.name, layout, resident, tuple(times), tuple(peaks), engine=engine)


@lru_cache(maxsize=100_000)
def weight_sync_estimate(model: ModelSpec, train: Layout, gen_layout: Layout, cluster: ClusterSpec, options: CostOptions,
                         engine: str = DEFAULT_ENGINE):
    """The cost record of the hybrid-engine transition ``train -> gen_layout`` of a model trained by ``engine`` (cached)."""
    return estimate(WeightSync(model, train, gen_layout, engine), cluster, options)


def generation_estimate(model: ModelSpec, train: Layout, gen_layout: Layout, gen: GenerationWork, memory_used: float,
                        cluster: ClusterSpec, options: CostOptions, engine: str = DEFAULT_ENGINE) -> tuple[float, float, str | None]:
    """(time, peak memory, problem) of the weight sync train -> gen_layout followed by ``gen.generations`` generations.

    Only the wave plan depends on ``memory_used``; the rest is cached.
    """
    sync = weight_sync_estimate(model, train, gen_layout, cluster, options, engine)
    if sync.problem:
        return INF, INF, sync.problem
    plan = generation_plan(model, gen_layout, gen.sequences, gen.seq_len, memory_used, cluster)
    if plan is None:
        rollout = estimate(Generate(model, gen_layout, gen.sequences, gen.prompt_len, gen.response_len, memory_used), cluster, options)
        return INF, INF, rollout.problem
    waves, batch = plan
    prefill, decode = generation_time(model, gen_layout, batch, gen.prompt_len, gen.response_len, cluster)
    factor = rollout_engine_cost(options.rollout_engine).time_factor
    prefill, decode = factor * prefill, factor * decode
    peak = (memory_used + generation_weight_bytes(model, gen_layout)
            + batch * kv_bytes_per_sequence(model, gen_layout, gen.seq_len))
    return sync.time_s + gen.generations * waves * (prefill + decode), peak, None


@dataclass(frozen=True)
class GroupCost:
    """One pool's time per stage and peak memory per device."""

    roles: tuple[str, ...]
    size: int
    offload: bool
    stage_times: tuple[float, ...]
    peak_memory_bytes: float
    problem: str | None = None


def _transfer(nbytes: float, cluster: ClusterSpec, options: CostOptions) -> float:
    return 2 * estimate(Offload(nbytes), cluster, options).time_s  # offload after, onload before


def group_cost(members: tuple[tuple[RoleWork, Layout, Layout | None, str], ...], size: int, offload: bool,
               gen: GenerationWork, cluster: ClusterSpec, options: CostOptions) -> GroupCost:
    """Stage times and peak memory of the roles ``members`` = (role, layout, generation layout, engine) sharing ``size`` devices."""
    names = tuple(r.name for r, _, _, _ in members)
    estimates = [role_estimate(r, l, gen, cluster, options, e) for r, l, _, e in members]
    usable = cluster.usable_memory_bytes
    total_resident = sum(e.resident for e in estimates)
    times, peak = [0.0] * len(STAGES), 0.0
    for (role, layout, gen_layout, engine), est in zip(members, estimates):
        others = 0.0 if offload else total_resident - est.resident
        for stage in member_stages(role):
            if stage == GEN:
                used = est.resident + others
                t, p, problem = generation_estimate(role.model, layout, gen_layout, gen, used, cluster, options, engine)
                if problem:
                    return GroupCost(names, size, offload, (INF,) * len(STAGES), INF, f"{role.name}: {problem}")
            else:
                t, p = est.times[stage], est.peaks[stage] + others
            if p > usable:
                where = "with its colocated roles' states resident" if others else "alone"
                return GroupCost(names, size, offload, (INF,) * len(STAGES), p,
                                 f"{role.name} on {layout} needs {p / 2**30:.1f} GiB per device in stage {STAGES[stage]} {where}; usable {usable / 2**30:.1f} GiB")
            times[stage] += t + (_transfer(est.resident, cluster, options) if offload else 0.0)
            peak = max(peak, p)
    return GroupCost(names, size, offload, tuple(times), peak)


@dataclass(frozen=True)
class PlacementCost:
    """Simulated iteration of a placement: total, per-stage maxima, per-pool details."""

    iteration_s: float
    stage_s: tuple[float, ...]
    compute_s: float
    groups: tuple[GroupCost, ...]

    @property
    def problem(self) -> str | None:
        """The first pool's reason it cannot run, or None."""
        return next((g.problem for g in self.groups if g.problem), None)

    @property
    def feasible(self) -> bool:
        return self.problem is None

    @property
    def peak_memory_bytes(self) -> float:
        return max(g.peak_memory_bytes for g in self.groups)


def controller_time(workload: Workload, cluster: ClusterSpec, options: CostOptions) -> float:
    """The controller's compute stage (advantages etc.), 0 when the workload has none."""
    if not workload.controller_compute:
        return 0.0
    return estimate(Compute(workload.generation.sequences * workload.generation.seq_len), cluster, options).time_s


def combine(stage_vectors: list[tuple[float, ...]], constant: float) -> tuple[float, tuple[float, ...]]:
    """Iteration time = sum over stages of the max over pools, + constant."""
    stage = tuple(max(v[s] for v in stage_vectors) for s in range(len(STAGES)))
    return sum(stage) + constant, stage


def check_placement(placement: Placement, workload: Workload, cluster: ClusterSpec) -> None:
    """Raise PlacementError unless every role is placed once on a valid layout of its pool's size."""
    placed = [rp.role for rp in placement.roles]
    if sorted(placed) != sorted(workload.role_names):
        raise PlacementError(f"placement places roles {placed} but the workload has {list(workload.role_names)}; place each role exactly once")
    seen: set[int] = set()
    for k, pool in enumerate(placement.pools):
        if pool.device_type != "cpu" and (seen & set(pool.devices) or max(pool.devices) >= cluster.num_devices):
            raise PlacementError(f"pool {k} {pool}: devices overlap another pool or exceed the cluster's {cluster.num_devices}")
        seen |= set(pool.devices)
    for rp in placement.roles:
        role, size = workload.role(rp.role), placement.pools[rp.pool].size
        problem = layout_problem(rp.layout, role.model, cluster.devices_per_node)
        if rp.layout.size != size or problem:
            raise PlacementError(f"role {rp.role!r}: layout {rp.layout} does not fit its {size}-device pool ({problem or 'dp·tp·pp must equal the pool size'})")
        if rp.engine not in TRAIN_ENGINES:
            raise PlacementError(f"role {rp.role!r}: unknown training engine {rp.engine!r}; use one of {', '.join(TRAIN_ENGINES)}")
        reachable = generation_layouts(role.model, rp.layout, cluster.devices_per_node, rp.engine)
        if role.generates and rp.gen_layout not in reachable:
            raise PlacementError(f"role {rp.role!r}: generation layout {rp.gen_layout} is not reachable from {rp.layout} under the {rp.engine} engine; choose one of {[str(g) for g in reachable]}")


def evaluate(placement: Placement, workload: Workload, cluster: ClusterSpec, options: CostOptions | None = None) -> PlacementCost:
    """Simulate one iteration of ``workload`` under ``placement`` (infeasible pools give an infinite time and a ``problem``)."""
    options = options or DEFAULT_OPTIONS
    check_placement(placement, workload, cluster)
    groups = []
    for k, pool in enumerate(placement.pools):
        members = tuple((workload.role(rp.role), rp.layout, rp.gen_layout, rp.engine) for rp in placement.roles if rp.pool == k)
        if members:
            groups.append(group_cost(members, pool.size, placement.offload[k], workload.generation, cluster, options))
    compute = controller_time(workload, cluster, options)
    total, stage = combine([g.stage_times for g in groups], compute)
    return PlacementCost(total, stage, compute, tuple(groups))
