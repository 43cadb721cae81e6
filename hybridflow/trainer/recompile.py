"""What the calibrated cost model would choose now for a finished run: its config compiled again, here.

:func:`recompile_run` compiles the run's graph (its ``plan.json``'s) with the run's config (``config.json``) by the
route ``hybridflow run`` takes (:func:`~.run_spec.derive`, then :meth:`RunSpec.compile`), with calibration on and
any ``plan=`` dropped: the plan the run would get if it started now on this machine, priced with this machine's
current calibration. When that plan places the roles otherwise than the run's, the run's own placement is compiled
too (as a pool spec, :func:`pool_spec`), so that the two are priced by the same model and the gain is a like-for-like
figure.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..compiler.plan import ExecutionPlan
from ..errors import HybridflowError
from .run_folder import RunConfigRecord

__all__ = ["Recompiled", "recompile_run", "pool_spec", "same_placement"]


@dataclass(frozen=True)
class Recompiled:
    """The plan chosen now, and the run's placement priced now (None: the same placement, or it cannot be compiled)."""

    plan: ExecutionPlan
    candidates: tuple[tuple[str, float], ...]
    calibrated: bool
    run_placement_now_s: float | None
    run_placement_problem: str | None = None
    """Why the run's placement could not be priced now (a placement the compiler no longer accepts, ...)."""


def pool_spec(plan: ExecutionPlan) -> str:
    """The plan's placement as a manual pool spec (``actor(dp1,tp1,pp1)+ref(dp1,tp1,pp1)@1;actor.generate@1``);
    pools without device memory (the host pool of rule rewards) are left to the compiler, which puts them there."""
    parts = []
    for pool in plan.pools:
        if pool.memory_bytes is None:
            continue
        roles = [f"{p.role}(dp{p.layout.dp},tp{p.layout.tp},pp{p.layout.pp})" for p in plan.placements if p.pool == pool.name]
        roles += [f"{p.role}.generate" for p in plan.placements if p.generation_pool == pool.name]
        if roles:
            parts.append(f"{'+'.join(roles)}@{len(pool.devices)}")
    return ";".join(parts)


def _signature(plan: ExecutionPlan) -> tuple:
    pools = {p.name: len(p.devices) for p in plan.pools}
    members = {p.name: frozenset(r.role for r in plan.placements if r.pool == p.name) for p in plan.pools}
    return tuple(sorted((p.role, members[p.pool], pools[p.pool], str(p.layout), str(p.generation_layout),
                         pools.get(p.generation_pool or "", 0)) for p in plan.placements))


def same_placement(a: ExecutionPlan, b: ExecutionPlan) -> bool:
    """Whether two plans place every role with the same companions, device count and layouts."""
    return _signature(a) == _signature(b)


def recompile_run(record: RunConfigRecord, run_plan: ExecutionPlan) -> Recompiled:
    """Compile the run again here, now (module docstring)."""
    from .config import PPOConfig
    from .planning import run_machine
    from .run_spec import derive, set_process_threads
    from .setup import run_inputs

    config = PPOConfig(**record.config).model_copy(update={"plan": None, "calibrate": True})
    machine = run_machine(config)
    set_process_threads(config, machine)
    with tempfile.TemporaryDirectory(prefix="hybridflow-explain-") as scratch:
        spec = derive(config, run_plan.graph, machine, run_inputs(config, Path(scratch)))
    report = spec.compile()
    repriced, problem = None, None
    if not same_placement(report.plan, run_plan):
        try:
            repriced = replace(spec, placement=pool_spec(run_plan)).compile().plan.predicted_iteration_s
        except HybridflowError as err:
            problem = str(err).splitlines()[0]
    return Recompiled(report.plan, report.candidates, spec.calibrated, repriced, problem)
