"""What every compiler pass may read besides the plan: the graph, the cluster, the models and the options.

A :class:`CompileContext` is frozen; passes never change it (``with_placement``
makes a new one, which is how ``compile`` tries several placements). The
workload (:func:`~.lower.lower_workload`) is derived from the graph, the models
and the batch shape, and computed once per context.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any


from ...graph import Graph
from ..cluster import ClusterSpec
from ..cost import CostOptions
from ..models import ModelSpec
from ..workload import BatchShape, Workload

__all__ = ["BatchShape", "CompileContext"]  # BatchShape is defined in ..workload, beside the presets


@dataclass(frozen=True, eq=False)
class CompileContext:
    """Inputs of one compilation, shared read-only by every pass.

    ``models`` maps every role of the graph to its :class:`ModelSpec`, or to
    None for a rule function (a reward computed by code, costing ~0);
    :func:`~.lower.resolve_models` fills it from the user's partial mapping.
    ``placement`` is the request the placement pass resolves: ``"auto"``, a
    fixed strategy name, a manual spec, a ``device_map`` dict, or an
    already-chosen placement (see :mod:`.placement`).
    """

    graph: Graph
    cluster: ClusterSpec
    models: dict[str, ModelSpec | None]
    batch: BatchShape = field(default_factory=BatchShape)
    options: CostOptions = field(default_factory=CostOptions)
    placement: Any = "auto"
    staleness: int = 0
    allow_uncorrected_staleness: bool = False
    """With ``staleness > 0``, compile a graph whose policy-gradient loss has no off-policy correction (biased
    gradient, knowingly) instead of raising StalenessError (:mod:`hybridflow.graph.staleness`)."""
    engines: tuple[str, ...] = ("fsdp",)
    """Training engines the trainable roles may use (:mod:`hybridflow.compiler.engine`); the placement pass picks one per role."""

    @cached_property
    def workload(self) -> Workload:
        """The graph lowered to per-role work (rule roles left out: they run no model)."""
        from .lower import lower_workload

        return lower_workload(self.graph, self.models, self.batch).with_engines(self.engines)

    @property
    def rule_roles(self) -> tuple[str, ...]:
        """Roles computed by rule functions (no model, no devices)."""
        return tuple(r.name for r in self.graph.roles if self.models.get(r.name) is None)

    def with_placement(self, placement: Any) -> "CompileContext":
        """The same context with another placement request (the workload is recomputed lazily)."""
        return replace(self, placement=placement)
