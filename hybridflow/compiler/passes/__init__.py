"""The compiler passes, one per file, each a pure function ``pass(plan, ctx) -> plan``.

In pipeline order (:data:`PIPELINE`; :func:`hybridflow.compiler.compile` runs it):

1. :func:`~.lower.lower` — graph -> workload, and the plan skeleton;
2. :func:`~.placement.placement` — roles -> pools and layouts;
   :func:`~.reuse.reuse` — logprob nodes served from the rollout where provably the same;
3. :func:`~.reshard.reshard` — weight-sync ops (hybrid engine or cross-pool broadcast);
4. :func:`~.offload.offload` — offload/onload brackets where roles cannot be resident together;
5. :func:`~.schedule.schedule` — per-pool order, overlap, predicted timeline.

Each pass's docstring says what it requires and what it guarantees; the
shared context is :class:`~.context.CompileContext`. Helpers that are not
passes: :mod:`.spec` (placement requests), :mod:`.timing` (op costs),
:mod:`.order` (priority order).
"""
from . import lower, offload, placement, reshard, reuse, schedule
from .context import BatchShape, CompileContext
from .lower import lower_workload, resolve_models
from .spec import ResolvedPlacement, RolloutPool, parse_placement

PIPELINE = (
    ("lower", lower.lower),
    ("placement", placement.placement),
    ("reuse", reuse.reuse),
    ("reshard", reshard.reshard),
    ("offload", offload.offload),
    ("schedule", schedule.schedule),
)
"""(name, pass) in the order the compiler runs them; the names appear in verifier errors and IR dumps."""

__all__ = ["PIPELINE", "BatchShape", "CompileContext", "ResolvedPlacement", "RolloutPool", "parse_placement",
           "lower_workload", "resolve_models"]
