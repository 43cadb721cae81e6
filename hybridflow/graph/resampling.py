"""Dynamic sampling in the IR: a data-dependent filter and a bounded repeat of part of the graph.

A :class:`Resample` record names a *body* of nodes (a generation, its scoring, and a
compute node that says which responses to keep) that the executor runs again, on fresh
graph inputs, until enough groups have passed the filter or ``max_rounds`` rounds have run:

    round k = 1, 2, ...:   run the body on inputs_k; keep the rows whose ``keep`` is True
    stop when kept groups >= target (the first round's groups) or k == max_rounds

Nodes after the body read the body's outputs as one batch: the kept rows of every round, in
order, cut to exactly the first round's group count (``group_field`` relabelled so that
groups of different rounds stay apart). A batch that is still short after ``max_rounds`` is
topped up with the most recent *dropped* groups, so its size is always the first round's
and the dims the type checker proved (``B*n``) hold; the ``{name}/filled_frac`` metric says
what share of it passed the filter. DAPO (Yu et al. 2025, arXiv 2503.14476, sec. 3.2) is
the use it was made for: its filter drops groups whose rewards are all equal.

In the DSL::

    with hf.resample(max_rounds=3) as rounds:
        rollout = actor.generate(prompts, n=n)
        scores = reward.score(rollout)
        rounds.keep(hf.compute("uniform_group_filter", rollout, scores))

The rules :func:`check_resample` enforces (raised as :class:`ResampleError`, naming the
node and a fix): one resample per graph; a body of existing, distinct nodes in graph order,
with a generate node, no update, and the filter among them; the filter a compute node whose
``keep_field`` is ``bool[D]``; every output of every body node row-aligned with it (leading
dim ``D``); the body closed (it reads only graph inputs and body nodes); and no node outside
the body reads a graph input the body reads (those inputs change every round).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import GraphValidationError, TraceError
from . import dims as D

if TYPE_CHECKING:
    from .ir import Graph
    from .values import Value

__all__ = ["Resample", "ResampleError", "check_resample", "expected_rounds", "resample", "resample_to_dict",
           "resample_from_dict"]


class ResampleError(GraphValidationError):
    """A malformed or misplaced dynamic-sampling region."""


@dataclass(frozen=True)
class Resample:
    """A bounded repeat of ``nodes`` until ``target`` groups pass ``filter`` (module docstring)."""

    nodes: tuple[str, ...]
    """The body, in graph order."""
    filter: str
    """The compute node of the body whose ``keep_field`` says which rows to keep."""
    max_rounds: int = 3
    """Most rounds of the body per iteration (1: filter only, never generate again)."""
    keep_field: str = "keep"
    group_field: str = "group_index"
    """The field that groups rows (responses to one prompt); groups are counted, kept and relabelled whole."""
    expected_keep: float = 0.5
    """The compiler's prior for the fraction of groups one round keeps (its cost model's expected rounds)."""
    name: str = "dynamic_sampling"
    """Prefix of the metrics the executor reports (``dynamic_sampling/dropped_group_frac``, ...)."""

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, tuple) or not self.nodes or not all(isinstance(n, str) for n in self.nodes):
            raise ResampleError(f"Resample.nodes must be a non-empty tuple of node names, got {self.nodes!r}")
        for what, value in (("filter", self.filter), ("keep_field", self.keep_field), ("group_field", self.group_field),
                            ("name", self.name)):
            if not isinstance(value, str) or not value:
                raise ResampleError(f"Resample.{what} must be a non-empty string, got {value!r}")
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise ResampleError(f"Resample.max_rounds must be an int >= 1, got {self.max_rounds!r}",
                                hint="max_rounds bounds the generation rounds of one iteration")
        keep = self.expected_keep
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0.0 < keep <= 1.0:
            raise ResampleError(f"Resample.expected_keep must be a number in (0, 1], got {keep!r}")
        object.__setattr__(self, "expected_keep", float(keep))

    def expected_rounds(self, groups: int) -> float:
        """The expected number of body rounds per iteration for ``groups`` groups a round (:func:`expected_rounds`)."""
        return expected_rounds(groups, self.expected_keep, self.max_rounds)


def expected_rounds(groups: int, keep: float, max_rounds: int) -> float:
    """Expected rounds when each of ``groups`` groups a round passes independently with probability ``keep``.

        E[rounds] = sum_{k=0}^{max_rounds-1} P(not full after k rounds)
                  = 1 + sum_{k=1}^{max_rounds-1} P(Binomial(k * groups, keep) < groups)

    Round k+1 runs exactly when the first k rounds kept fewer than ``groups`` groups.
    ``keep = 1`` gives 1; as ``groups`` grows it tends to ``min(max_rounds, ceil(1 / keep))``.
    """
    if groups < 1 or max_rounds < 1 or not 0.0 < keep <= 1.0:
        raise ValueError(f"need groups >= 1, max_rounds >= 1 and 0 < keep <= 1, got {groups}, {max_rounds}, {keep}")
    return 1.0 + sum(_binomial_cdf_below(k * groups, keep, groups) for k in range(1, max_rounds))


@functools.lru_cache(maxsize=256)
def _binomial_cdf_below(trials: int, p: float, below: int) -> float:
    """``P(Binomial(trials, p) < below)``, summed in log space (a million trials stay finite)."""
    if p >= 1.0:
        return 1.0 if trials < below else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_n = math.lgamma(trials + 1)
    terms = (log_n - math.lgamma(j + 1) - math.lgamma(trials - j + 1) + j * log_p + (trials - j) * log_q
             for j in range(min(below, trials + 1)))
    return min(1.0, sum(math.exp(t) for t in terms))


# -- validation --------------------------------------------------------------------------------

def _fail(message: str, node: str | None, hint: str) -> None:
    raise ResampleError(message, node=node, hint=hint)


def _check_filter(graph: "Graph", spec: Resample) -> str:
    """The filter is a compute node of the body with ``keep_field: bool[D]``; returns D."""
    if spec.filter not in spec.nodes:
        _fail(f"the filter {spec.filter!r} is not in the resampled nodes {list(spec.nodes)}", spec.filter,
              "the filter must be part of the repeated body (call rounds.keep(...) inside the with block)")
    node = graph.node(spec.filter)
    field = node.outputs.get(spec.keep_field)
    if node.kind != "compute" or field is None or field.dtype != "bool" or len(field.dims) != 1:
        _fail(f"the filter must be a compute node with an output '{spec.keep_field}: bool[D]', got a {node.kind} node "
              f"producing {node.outputs}", node.name, "filter with an op such as 'uniform_group_filter'")
    return D.canonical(field.dims[0])


def _check_body(graph: "Graph", spec: Resample, rows: str) -> None:
    names = [n.name for n in graph.nodes]
    if len(set(spec.nodes)) != len(spec.nodes) or any(n not in names for n in spec.nodes):
        _fail(f"resampled nodes {list(spec.nodes)} must be distinct nodes of the graph", None,
              "name each node of the body once")
    if list(spec.nodes) != [n for n in names if n in spec.nodes]:
        _fail(f"resampled nodes {list(spec.nodes)} are not in graph order", spec.nodes[0], "list the body in graph order")
    body = [graph.node(n) for n in spec.nodes]
    if not any(n.kind == "generate" for n in body):
        _fail("the resampled body has no generate node, so a new round would only repeat the last", spec.nodes[0],
              "put the generation inside the with hf.resample(...) block")
    inputs = {i.name for i in graph.inputs}
    for node in body:
        if node.kind == "update":
            _fail("an update cannot be resampled (a round must not change weights)", node.name,
                  "move the update after the with block")
        outside = [i.source for i in node.inputs if i.source not in spec.nodes and i.source not in inputs]
        if outside:
            _fail(f"reads {outside[0]!r}, which is outside the resampled body", node.name,
                  "a round may read only graph inputs and nodes of the body; compute it inside the block")
        for field in node.outputs:
            if not field.dims or D.canonical(field.dims[0]) != rows:
                _fail(f"output {field} is not row-aligned with the filter's {spec.keep_field!r} (leading dim {rows})",
                      node.name, "every output of the body must have one row per response")


def _check_readers(graph: "Graph", spec: Resample) -> None:
    fresh = {i.source for n in spec.nodes for i in graph.node(n).inputs if i.source not in spec.nodes}
    for node in graph.nodes:
        if node.name in spec.nodes:
            continue
        late = sorted(fresh & set(node.sources))
        if late:
            _fail(f"reads graph input {late[0]!r}, which the resampled body draws anew every round", node.name,
                  "read the body's outputs instead (the rollout carries the prompt fields)")


def check_resample(graph: "Graph") -> None:
    """Raise :class:`ResampleError` unless the graph's resample regions follow the rules (module docstring)."""
    if len(graph.resample) > 1:
        _fail(f"graph {graph.name!r} has {len(graph.resample)} resample regions; at most one is supported", None,
              "merge them into one body")
    for spec in graph.resample:
        rows = _check_filter(graph, spec) if spec.filter in [n.name for n in graph.nodes] else None
        if rows is None:
            _fail(f"the filter {spec.filter!r} is not a node of the graph", None, "name the body's compute filter node")
        _check_body(graph, spec, rows)
        _check_readers(graph, spec)


# -- JSON form -----------------------------------------------------------------------------------

_KEYS = ("nodes", "filter", "max_rounds", "keep_field", "group_field", "expected_keep", "name")


def resample_to_dict(spec: Resample) -> dict[str, Any]:
    return {"nodes": list(spec.nodes), "filter": spec.filter, "max_rounds": spec.max_rounds, "keep_field": spec.keep_field,
            "group_field": spec.group_field, "expected_keep": spec.expected_keep, "name": spec.name}


def resample_from_dict(data: object, where: str = "resample") -> Resample:
    if not isinstance(data, dict) or set(data) != set(_KEYS):
        raise ResampleError(f"{where}: a resample record is an object with keys {', '.join(_KEYS)}, got {data!r}")
    if not isinstance(data["nodes"], list):
        raise ResampleError(f"{where}: nodes must be a list of node names, got {data['nodes']!r}")
    return Resample(**{**data, "nodes": tuple(data["nodes"])})


# -- DSL -------------------------------------------------------------------------------------------

class ResampleRegion:
    """What ``with hf.resample(...) as rounds`` gives: the nodes recorded inside are the body."""

    def __init__(self, tracer, **settings: Any):
        self._tracer, self._settings = tracer, settings
        self._start = 0
        self._filter: str | None = None

    def keep(self, value: "Value") -> None:
        """Mark ``value`` (a compute node's output with a ``keep: bool[...]`` field) as the round's filter."""
        producers = getattr(value, "producers", None)
        if producers is None or len(producers) != 1:
            raise TraceError(f"rounds.keep takes the value of one compute node (e.g. hf.compute('uniform_group_filter', "
                             f"...)), got {value!r}")
        if self._filter is not None:
            raise TraceError(f"rounds.keep was already given {self._filter!r}; a resample region has one filter")
        self._filter = producers[0]

    def __enter__(self) -> "ResampleRegion":
        if self._tracer.resample_region is not None:
            raise TraceError("hf.resample blocks cannot be nested")
        self._start = len(self._tracer.nodes)
        self._tracer.resample_region = self
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self._tracer.resample_region = None
        if exc_type is not None:
            return
        if self._filter is None:
            raise TraceError("a with hf.resample(...) block must call rounds.keep(filter_value) for its filter")
        body = tuple(n.name for n in self._tracer.nodes[self._start:])
        self._tracer.resample.append(Resample(nodes=body, filter=self._filter, **self._settings))


def resample(*, max_rounds: int = 3, expected_keep: float = 0.5, keep_field: str = "keep",
             group_field: str = "group_index", name: str = "dynamic_sampling") -> ResampleRegion:
    """Open a dynamic-sampling region: ``with hf.resample(max_rounds=3) as rounds: ...; rounds.keep(filter)``."""
    from .trace import current_tracer

    return ResampleRegion(current_tracer("hybridflow.resample"), max_rounds=max_rounds, expected_keep=expected_keep,
                          keep_field=keep_field, group_field=group_field, name=name)
