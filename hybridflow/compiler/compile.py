"""``compile(graph, cluster, models)``: run the compiler passes and return the ExecutionPlan.

The pass manager (:func:`run_pipeline`) runs :data:`~hybridflow.compiler.passes.PIPELINE`
— lower, placement, reuse, reshard, offload, schedule — threading the plan through
pure passes. In debug mode (``debug=True`` or ``HYBRIDFLOW_DEBUG=1``) it runs
:func:`~hybridflow.compiler.plan.verify_plan` after every pass, so an invariant
broken by a pass is reported with the pass's name; the final plan is always
verified. Timing and IR dumps are hooks (:class:`PassTimer`, :class:`IRDump`)
called before and after each pass, not code inside the passes.

With ``placement="auto"`` the search (:func:`hybridflow.compiler.placement.search`)
ranks placements by its stage model; ``compile`` then schedules the search's
best, its runners-up and the three fixed strategies and keeps the plan with
the smallest scheduled ``predicted_iteration_s``, so the automatic plan is
never slower than a fixed strategy's plan. With ``staleness > 0`` the
candidates give the rollout devices of its own (generation can only
overlap training on separate devices): whole nodes of a multi-node cluster,
or part of the one node; a fixed strategy then places the other roles on
the rest (``split`` with staleness means training and generation apart: the
roles are split as usual where that applies, else colocated, as for GRPO);
``colocate`` and ``standalone`` keep generation on the policy's own pool,
where it cannot overlap, which the schedule pass reports.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol

from ..errors import PlacementError, PlanError
from ..graph import Graph
from .async_placement import rollout_carve_outs
from .cluster import ClusterSpec
from .cost import CostOptions
from .models import ModelSpec
from .engine import DEFAULT_ENGINE, check_engines
from .placement import SearchResult, search
from .placement.search import place_fixed
from .plan import ExecutionPlan, verify_plan
from .passes import PIPELINE, BatchShape, CompileContext, ResolvedPlacement, RolloutPool, parse_placement, resolve_models
from .passes.placement import with_rollout, without_generation

__all__ = ["PassHook", "PassTimer", "IRDump", "CompileReport", "run_pipeline", "compile_report", "compile"]


class PassHook(Protocol):
    """Called around every pass: ``before(name, plan)`` (plan is None before the first) and ``after(name, plan)``."""

    def before(self, name: str, plan: ExecutionPlan | None) -> None: ...

    def after(self, name: str, plan: ExecutionPlan) -> None: ...


@dataclass
class PassTimer:
    """Accumulates wall seconds per pass name over every pipeline run it observes."""

    seconds: dict[str, float] = field(default_factory=dict)
    _start: float = 0.0

    def before(self, name: str, plan: ExecutionPlan | None) -> None:
        self._start = time.perf_counter()

    def after(self, name: str, plan: ExecutionPlan) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - self._start


@dataclass
class IRDump:
    """Writes ``NN-PASS.txt`` (the plan's text form) into ``directory`` after every pass of one pipeline run."""

    directory: Path
    count: int = 0

    def before(self, name: str, plan: ExecutionPlan | None) -> None:
        pass

    def after(self, name: str, plan: ExecutionPlan) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"{self.count:02d}-{name}.txt").write_text(plan.to_text())
        self.count += 1


def _debug_default() -> bool:
    return os.environ.get("HYBRIDFLOW_DEBUG", "").lower() in ("1", "true", "yes")


def run_pipeline(ctx: CompileContext, *, verify: bool = True, hooks: tuple = (), pipeline=None) -> ExecutionPlan:
    """Run the passes in order; with ``verify``, check the plan after each one and name the pass that broke it."""
    plan = None
    for name, run_pass in pipeline or PIPELINE:
        for hook in hooks:
            hook.before(name, plan)
        plan = run_pass(plan, ctx)
        if verify:
            verify_plan(plan, after=name)
        for hook in hooks:
            hook.after(name, plan)
    return plan


@dataclass(frozen=True)
class CompileReport:
    """A compiled plan and how it was found."""

    plan: ExecutionPlan
    search: SearchResult | None
    """The placement search (None for manual placements, or the last one searched with staleness)."""
    search_s: float
    """Seconds spent in placement search."""
    candidates: tuple[tuple[str, float], ...]
    """(label, scheduled predicted iteration seconds) of every placement tried; the plan is the fastest."""
    seconds: float
    """Total compile time."""


def _auto_candidates(ctx: CompileContext) -> tuple[list[tuple[str, ResolvedPlacement]], SearchResult | None, float]:
    """Placements worth scheduling for ``auto`` (module docstring) and the search that found them."""
    result = search(ctx.workload, ctx.cluster, ctx.options)
    found = [("auto", result.best)] + [(f"auto#{k + 2}", sp) for k, sp in enumerate(result.runners_up)]
    found += [(name, sp) for name, sp in result.fixed if sp is not None]
    return [(label, ResolvedPlacement(sp.placement, None, "auto", result.seconds)) for label, sp in found], result, result.seconds


def _stale_candidates(ctx: CompileContext, strategy: str) -> tuple[list[tuple[str, ResolvedPlacement]], SearchResult | None, float]:
    """Placements for ``staleness > 0``: the rollout on devices of its own, the other roles placed by ``strategy``
    on the rest (``split`` falls back to colocating them when it does not apply to them, e.g. GRPO's actor and ref)."""
    generating = [r.name for r in ctx.workload.roles if r.generates]
    found, last, spent = [], None, 0.0
    for rollout_devices, rest in rollout_carve_outs(ctx.cluster) if generating else ():
        workload = without_generation(ctx.workload)
        try:
            if strategy == "auto":
                last = search(workload, rest, ctx.options)
                spent += last.seconds
                chosen = last.best.placement
            else:
                scored = place_fixed(strategy, workload, rest, ctx.options)
                if scored is None and strategy == "split":
                    scored = place_fixed("colocate", workload, rest, ctx.options)
                if scored is None:
                    continue
                chosen = scored.placement
            found.append((f"{strategy}+rollout@{rollout_devices}",
                          with_rollout(chosen, RolloutPool(generating[0], rollout_devices), ctx, strategy)))
        except PlacementError:
            continue
    if not found:
        raise PlanError(f"staleness={ctx.staleness} needs the rollout on devices of its own (whole nodes on a multi-node "
                        f"cluster) and the other roles on the rest; {ctx.cluster.describe()} has no such '{strategy}' "
                        "placement that fits. Use more devices (cpu_slots=2 or more on a CPU machine), staleness 0, or a "
                        "manual spec with a rollout pool, e.g. 'actor+ref@4;critic+reward@2;actor.generate@2'")
    return found, last, spent


def as_graph(graph: Any) -> Graph:
    """``graph`` as a Graph: a Graph as it is, an algorithm built (``.build()``); PlanError otherwise."""
    if isinstance(graph, Graph):
        return graph
    if hasattr(graph, "build"):
        return graph.build()
    raise PlanError(f"compile needs a Graph or an algorithm (with .build()); got {type(graph).__name__}")


def compile_report(graph: Graph, cluster: ClusterSpec | str, models: Mapping[str, ModelSpec | str] | ModelSpec | str, *,
                   placement: Any = "auto", staleness: int = 0, batch: BatchShape | None = None,
                   options: CostOptions | None = None, debug: bool | None = None, hooks: tuple = (),
                   engines: tuple[str, ...] = (DEFAULT_ENGINE,),
                   allow_uncorrected_staleness: bool = False) -> CompileReport:
    """Compile and say how: the plan, the search, the candidates tried (see :func:`compile`)."""
    start = time.perf_counter()
    graph = as_graph(graph)
    cluster = ClusterSpec.parse(cluster) if isinstance(cluster, str) else cluster
    if isinstance(models, (str, ModelSpec)):
        from .passes.lower import actor_role

        models = {actor_role(graph): models}
    if staleness < 0:
        raise PlanError(f"staleness must be >= 0, got {staleness}")
    if staleness and graph.resample:
        raise PlanError(f"graph {graph.name!r} resamples part of each iteration (dynamic sampling: "
                        f"{', '.join(graph.resample[0].nodes)}); its rounds cannot overlap the next step's generation. "
                        "Compile it with staleness 0")
    ctx = CompileContext(graph=graph, cluster=cluster, models=resolve_models(graph, models), batch=batch or BatchShape(),
                         options=options or CostOptions(), placement=parse_placement(placement), staleness=staleness,
                         engines=check_engines(engines, "compile(engines=...)"),
                         allow_uncorrected_staleness=allow_uncorrected_staleness)
    verify = _debug_default() if debug is None else debug
    strategy = ctx.placement if isinstance(ctx.placement, str) else None
    if strategy is None or (strategy != "auto" and not (staleness and strategy == "split")):
        plan = run_pipeline(ctx, verify=verify, hooks=hooks)
        tried, result, search_s = ((plan.strategy, plan.predicted_iteration_s),), None, 0.0
    else:
        candidates, result, search_s = _stale_candidates(ctx, strategy) if staleness else _auto_candidates(ctx)
        plans = [(label, run_pipeline(ctx.with_placement(c), verify=verify, hooks=hooks)) for label, c in candidates]
        tried = tuple((label, p.predicted_iteration_s) for label, p in plans)
        plan = min(plans, key=lambda lp: lp[1].predicted_iteration_s)[1].model_copy(update={"strategy": strategy})
    verify_plan(plan, after="compile")
    return CompileReport(plan=plan, search=result, search_s=search_s, candidates=tried, seconds=time.perf_counter() - start)


def compile(graph: Graph, cluster: ClusterSpec | str, models: Mapping[str, ModelSpec | str] | ModelSpec | str, *,
            placement: Any = "auto", staleness: int = 0, batch: BatchShape | None = None,
            options: CostOptions | None = None, debug: bool | None = None, hooks: tuple = (),
            engines: tuple[str, ...] = (DEFAULT_ENGINE,), allow_uncorrected_staleness: bool = False) -> ExecutionPlan:
    """The ExecutionPlan of ``graph`` on ``cluster``.

    - ``models``: role -> model preset name, ``config.json`` path, ModelSpec or
      ``"rule"`` (a rule function, ~0 cost); roles left out use the actor's
      model; a single name or ModelSpec is the actor's (and so everyone's).
    - ``placement``: ``"auto"`` | ``"colocate"`` | ``"split"`` | ``"standalone"``,
      a pool spec (``"actor+ref@8;critic+reward@8"``, optionally with a rollout
      pool ``actor.generate@N``) or list of PoolSpec/RolloutPool, or a device map.
    - ``staleness``: k > 0 overlaps generation of iteration i+k with iteration i
      (needs generation on its own devices; PlanError says why not otherwise). A policy-gradient loss must
      then be corrected for the lagged rollout (StalenessError otherwise, :mod:`hybridflow.graph.staleness`);
      ``allow_uncorrected_staleness=True`` compiles it anyway, with a warning.
    - ``batch``: prompts, lengths, epochs and mini-batches (the paper's workload by default).
    - ``debug``: verify after every pass (default: ``HYBRIDFLOW_DEBUG``); ``hooks``: :class:`PassHook` objects.
    - ``engines``: training engines the trainable roles may use (``fsdp``, ``megatron``; the search picks
      one per role, recorded as ``RolePlacement.train_engine``); hybridflow's runtime runs ``fsdp`` only,
      so :func:`~hybridflow.compiler.machine.bind` refuses a plan with another.
    """
    return compile_report(graph, cluster, models, placement=placement, staleness=staleness, batch=batch,
                          options=options, debug=debug, hooks=hooks, engines=engines,
                          allow_uncorrected_staleness=allow_uncorrected_staleness).plan
