"""Candidate layouts per role and per colocated group, with exact dominance pruning (cached per model and device count).

A role's candidates on ``n`` devices are its valid layouts, under each of its
training engines (``RoleWork.search_engines``), whose work fits in memory
alone. A candidate is dropped when another is at least as good in every
respect that can matter to any placement: time in every stage, resident
states, the memory its work needs beyond them and — for the generating role —
every generation layout it can reach, each with a weight sync no slower. The
sync is compared layout by layout because its cost depends on the training
layout, not only on the generation layout and pool size: under ``fsdp`` a
rank receives ``M/(tg·pg) − M/n`` (the same for every training layout on
``n`` devices), under ``megatron`` ``M/(tg·pg) − M/(t·p)`` over links set by
``t·p``, so two megatron candidates with different ``(t, p)`` differ in it
and the comparison keys on ``(t, p)`` in effect. A group's options on ``n`` devices are the feasible
combinations of its roles' candidates, resident or offloaded, built role by
role with dominated partial sums dropped, and kept when their stage-time
vectors are Pareto-optimal: that is all the cross-group search needs.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from functools import lru_cache

from ..cluster import ClusterSpec
from ..cost import CostOptions, Offload, estimate, generation_time, waves_for
from ..memory import generation_weight_bytes, kv_bytes_per_sequence
from ..rollout_engines import rollout_engine_cost
from ..layout import Layout, generation_layouts, valid_layouts
from ..workload import STAGES, GenerationWork, RoleWork
from .evaluate import GEN, RoleEstimate, generation_estimate, member_stages, role_estimate, weight_sync_estimate

__all__ = ["RoleCandidate", "GroupOption", "make_candidate", "role_candidates", "group_options", "group_combinations", "best_generation", "pareto"]


@dataclass(frozen=True)
class RoleCandidate:
    """A layout and engine of one role with its estimate and (for the generating role) reachable generation layouts."""

    estimate: RoleEstimate
    gen_layouts: frozenset[Layout] = frozenset()
    sync_s: tuple[tuple[Layout, float], ...] = ()
    """Weight-sync seconds per reachable generation layout whose sync is feasible (generating role only)."""

    @property
    def layout(self) -> Layout:
        return self.estimate.layout

    @property
    def engine(self) -> str:
        return self.estimate.engine


@dataclass(frozen=True)
class GroupOption:
    """One feasible way to run a group of roles on ``size`` devices."""

    size: int
    offload: bool
    times: tuple[float, ...]
    layouts: tuple[tuple[Layout, Layout | None, str], ...]
    """(layout, generation layout, training engine) per role of the group, in group order."""


def _dominates(role: RoleWork, a: RoleCandidate, b: RoleCandidate) -> bool:
    ea, eb = a.estimate, b.estimate
    if not (ea.resident <= eb.resident and all(x <= y for x, y in zip(ea.times, eb.times))
            and _excess(role, a) <= _excess(role, b) and b.gen_layouts <= a.gen_layouts):
        return False
    if not role.generates:
        return True
    sync_a = dict(a.sync_s)
    return all(g in sync_a and sync_a[g] <= t for g, t in b.sync_s)


def make_candidate(role: RoleWork, layout: Layout, engine: str, gen: GenerationWork, cluster: ClusterSpec,
                   options: CostOptions) -> RoleCandidate:
    """``role`` on ``layout`` under ``engine``: its estimate, reachable generation layouts and their sync times."""
    est = role_estimate(role, layout, gen, cluster, options, engine)
    if not role.generates:
        return RoleCandidate(est)
    gens = frozenset(g for g in generation_layouts(role.model, layout, cluster.devices_per_node, engine)
                     if not options.data_parallel_only or g.size == g.dp)
    syncs = ((g, weight_sync_estimate(role.model, layout, g, cluster, options, engine)) for g in sorted(gens))
    return RoleCandidate(est, gens, tuple((g, rec.time_s) for g, rec in syncs if not rec.problem))


@lru_cache(maxsize=100_000)
def role_candidates(role: RoleWork, n: int, gen: GenerationWork, cluster: ClusterSpec, options: CostOptions) -> tuple[RoleCandidate, ...]:
    """Non-dominated (layout, engine) candidates of ``role`` on ``n`` devices whose work fits in memory when the role is alone."""
    usable = cluster.usable_memory_bytes
    found = []
    for engine in role.search_engines:
        for layout in valid_layouts(role.model, n, cluster.devices_per_node):
            if options.data_parallel_only and layout.size != layout.dp:
                continue
            cand = make_candidate(role, layout, engine, gen, cluster, options)
            est = cand.estimate
            if est.problem or max(est.peaks) > usable or est.resident > usable:
                continue
            if role.generates and not cand.gen_layouts:
                continue
            found.append(cand)
    return tuple(c for i, c in enumerate(found)
                 if not any(j != i and _dominates(role, o, c) and (j < i or not _dominates(role, c, o)) for j, o in enumerate(found)))


@dataclass(frozen=True)
class _GenerationTable:
    """Per candidate: reachable generation layouts with their weight-sync time, and a memo of wave times."""

    entries: tuple[tuple[Layout, float, float, float, int], ...]
    """(generation layout, sync seconds, weight bytes, KV bytes per sequence, sequences per replica)."""
    memo: dict


@lru_cache(maxsize=100_000)
def _generation_table(role: RoleWork, candidate: RoleCandidate, gen: GenerationWork, cluster: ClusterSpec,
                      options: CostOptions) -> _GenerationTable:
    entries = []
    for g in sorted(candidate.gen_layouts):
        sync = weight_sync_estimate(role.model, candidate.layout, g, cluster, options, candidate.engine)
        if not sync.problem:
            entries.append((g, sync.time_s, generation_weight_bytes(role.model, g),
                            kv_bytes_per_sequence(role.model, g, gen.seq_len), math.ceil(gen.sequences / g.dp)))
    return _GenerationTable(tuple(entries), {})


def best_generation(role: RoleWork, candidate: RoleCandidate, memory_used: float, gen: GenerationWork,
                    cluster: ClusterSpec, options: CostOptions) -> tuple[float, Layout | None]:
    """Fastest (weight sync + generation) over the reachable generation layouts, given ``memory_used`` per device.

    Computes exactly what :func:`~.evaluate.generation_estimate` does, with the
    wave times memoised per (layout, batch).
    """
    table = _generation_table(role, candidate, gen, cluster, options)
    best: tuple[float, Layout | None] = (math.inf, None)
    usable = cluster.usable_memory_bytes
    for g, sync_s, weights, per_seq, seqs in table.entries:
        plan = waves_for(usable - memory_used - weights, per_seq, seqs)
        if plan is None:
            continue
        waves, batch = plan
        parts = table.memo.get((g, batch))
        if parts is None:
            factor = rollout_engine_cost(options.rollout_engine).time_factor
            parts = table.memo[(g, batch)] = tuple(factor * t for t in generation_time(
                role.model, g, batch, gen.prompt_len, gen.response_len, cluster))
        t = sync_s + gen.generations * waves * (parts[0] + parts[1])
        if t < best[0]:
            best = (t, g)
    return best


def pareto(items: list, key) -> list:
    """Items whose ``key`` vector no other item dominates (<= everywhere); of equal vectors the first (by sum) is kept."""
    keyed = sorted(((key(it), it) for it in items), key=lambda kv: (sum(kv[0]), kv[0]))
    kept_keys: list = []
    kept: list = []
    le = operator.le
    for v, it in keyed:
        # a dominating vector has a smaller or equal sum, so only kept (earlier) ones can dominate v
        if not any(all(map(le, k, v)) for k in kept_keys):
            kept_keys.append(v)
            kept.append(it)
    return kept


def _excess(role: RoleWork, cand: RoleCandidate) -> float:
    """Largest (own peak − own resident states) over the role's non-generation stages: what it needs beyond the states."""
    e = cand.estimate
    return max((e.peaks[s] - e.resident for s in member_stages(role) if s != GEN), default=-math.inf)


def _transfers(role: RoleWork, cand: RoleCandidate, cluster: ClusterSpec, options: CostOptions) -> tuple[float, ...]:
    """Per-stage onload + offload time of the role's states in offload mode (one round trip per stage it works in)."""
    t = 2 * estimate(Offload(cand.estimate.resident), cluster, options).time_s
    stages = member_stages(role)
    return tuple(t if s in stages else 0.0 for s in range(len(STAGES)))


@dataclass(frozen=True)
class _Partial:
    times: tuple[float, ...]
    resident: float
    headroom: float
    picks: tuple[tuple[int, Layout, Layout | None, str], ...]


def _combine(roles, n, per_role, offload, gen, cluster, options, gen_layout) -> list[GroupOption]:
    """Add the roles one at a time (generating role last), keeping only non-dominated partial sums.

    A partial sum is (stage times, resident states, headroom = usable − the
    largest excess so far); in resident mode it must keep resident <= headroom.
    Later roles only add time and states and lower the headroom, so a
    dominated partial sum can never complete to a better option.
    """
    usable = cluster.usable_memory_bytes
    states = [_Partial((0.0,) * len(STAGES), 0.0, usable, ())]
    for i in sorted(range(len(roles)), key=lambda k: roles[k].generates):
        role, grown = roles[i], []
        for cand in per_role[i]:
            e, excess = cand.estimate, _excess(role, cand)
            extra = _transfers(role, cand, cluster, options) if offload else (0.0,) * len(STAGES)
            if offload and excess + e.resident > usable:
                continue
            for st in states:
                resident, headroom = st.resident + e.resident, min(st.headroom, usable - excess)
                if not offload and resident > headroom:
                    continue
                times = tuple(a + b + c for a, b, c in zip(st.times, e.times, extra))
                chosen = None
                if role.generates:
                    used = e.resident if offload else resident
                    if gen_layout is None:
                        t_gen, chosen = best_generation(role, cand, used, gen, cluster, options)
                    else:
                        t_gen, _, problem = generation_estimate(role.model, e.layout, gen_layout, gen, used, cluster, options, e.engine)
                        chosen = None if problem or gen_layout not in cand.gen_layouts else gen_layout
                    if chosen is None:
                        continue
                    times = (times[GEN] + t_gen,) + times[GEN + 1:]
                grown.append(_Partial(times, resident, headroom, st.picks + ((i, e.layout, chosen, e.engine),)))
        key = (lambda p: p.times) if offload else (lambda p: p.times + (p.resident, -p.headroom))
        states = pareto(grown, key=key)
    return [GroupOption(n, offload, st.times, tuple((l, g, en) for _, l, g, en in sorted(st.picks, key=lambda x: x[0])))
            for st in states]


def group_combinations(roles: tuple[RoleWork, ...], n: int, per_role: list[tuple[RoleCandidate, ...]], gen: GenerationWork,
                       cluster: ClusterSpec, options: CostOptions, gen_layout: Layout | None = None) -> list[GroupOption]:
    """Non-dominated feasible options of ``roles`` on ``n`` devices from the given candidates, resident and offloaded.

    The generating role takes ``gen_layout`` when given, else its fastest
    reachable generation layout for the memory its mode leaves.
    """
    found = _combine(roles, n, per_role, False, gen, cluster, options, gen_layout)
    if len(roles) > 1:
        found += _combine(roles, n, per_role, True, gen, cluster, options, gen_layout)
    return found


@lru_cache(maxsize=20_000)
def group_options(roles: tuple[RoleWork, ...], n: int, gen: GenerationWork, cluster: ClusterSpec,
                  options: CostOptions) -> tuple[GroupOption, ...]:
    """Pareto-optimal (by stage times) feasible options of the colocated ``roles`` on ``n`` devices."""
    per_role = [role_candidates(r, n, gen, cluster, options) for r in roles]
    return tuple(pareto(group_combinations(roles, n, per_role, gen, cluster, options), key=lambda o: o.times))
