"""Staleness as a type: the maximal policy lag of every edge, and the checks that use it.

**Lag.** An edge ``producer.field -> consumer`` has lag L when the value was produced by weights L policy
updates older than the weights the consumer runs with. A plan runs some nodes *ahead*: with ``staleness=k``
the generate nodes (and their weight syncs) work for iteration ``i + k`` (``iteration_offset = k``), so the
rollout the rest of iteration i reads was sampled by weights k updates old. Each node runs at an offset
``o(n)`` (0 unless ahead); the weights behind a value are those of the offset it *originates* at:

- a generate or infer node evaluates a model on the weights of its own offset: ``origin(n) = o(n)``
  (``actor.logprob`` recomputed at training time has origin 0 even though it reads an old rollout);
- a score or compute node derives its value from its inputs' data (rewards of old samples are old):
  ``origin(n) = max(o(n), origin of each producer it reads)``;
- a graph input (the prompts) has origin 0.

The lag of an edge is ``max(0, origin(producer) - o(consumer))``: values made ahead and read ahead (the
rollout read by a generation-side node) have lag 0. With k > 1 or per-node offsets nothing changes.

**Checks** (:func:`check_staleness`):

1. a correction op (registry ``correction`` with a ``rollout_input``) must read that input from a rollout
   node (a generate node) that emits it, or from a graph input; otherwise the weights it computes compare the
   trained policy with something that is not the behaviour policy;
2. a policy-gradient loss (:attr:`~hybridflow_ops.registry.OpSpec.policy_gradient`) whose update reads a
   lagged edge must read, for its loss, a value computed by a compute correction (truncated IS weights, a
   rejection mask, ...), or take its importance ratio against the behaviour policy itself: every policy-
   gradient term declares a ``ratio_input`` (``old_log_probs`` of PPO, GSPO, CISPO, ...) and reads it straight
   from a correction whose ``behaviour_output`` it is (``old_log_probs_from_rollout``: GRPO with
   ``recompute_old_log_probs=False``). The ratio ``pi_theta / mu`` is then the importance weight of the
   sampled tokens, clipped by the loss (verl's "bypass mode"); a loss without such a ratio (``reinforce``,
   ``gpg``, ``dro``) is not corrected by it, and a behaviour-log-probs op reached any other way (e.g. through
   the advantages) counts for nothing.

Both raise :class:`~hybridflow.errors.StalenessError` naming the node, the edge and its lag, and the
corrections the registry holds. Corrections are declared in the op registry, never recognised by name here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from hybridflow_ops.registry import OpSpec, get_op, has_op, list_ops

from ..errors import StalenessError
from .ir import Graph, Node

__all__ = ["Edge", "node_offsets", "edge_lags", "lagged_edges", "check_rollout_inputs", "check_staleness",
           "corrections_available"]

MODEL_KINDS = ("generate", "infer")
"""Node kinds that evaluate a model's weights: their outputs originate at their own offset."""


@dataclass(frozen=True, order=True)
class Edge:
    """Field ``field`` of ``producer`` read by ``consumer`` (as its input ``name``)."""

    producer: str
    field: str
    consumer: str
    name: str

    def __str__(self) -> str:
        return f"{self.producer}.{self.field} -> {self.consumer}"


def node_offsets(graph: Graph, staleness: int) -> dict[str, int]:
    """Each node's iteration offset with ``staleness=k``: k for generate nodes (they run ahead), 0 for the rest.

    This is the split :func:`~hybridflow.compiler.passes.schedule.overlap_generation` makes; a plan's own
    offsets (``PlanOp.iteration_offset``) can be passed to :func:`edge_lags` instead."""
    return {n.name: staleness if n.kind == "generate" else 0 for n in graph.nodes}


def _origins(graph: Graph, offsets: Mapping[str, int]) -> dict[str, int]:
    origin = {i.name: 0 for i in graph.inputs}
    for node in graph.nodes:  # validated graphs list nodes in a topological order
        own = offsets.get(node.name, 0)
        if node.kind in MODEL_KINDS:
            origin[node.name] = own
        else:
            origin[node.name] = max([own] + [origin.get(s, 0) for s in node.sources])
    return origin


def edge_lags(graph: Graph, staleness: int = 0, offsets: Mapping[str, int] | None = None) -> dict[Edge, int]:
    """The maximal lag of every edge of ``graph`` (module docstring), in node order.

    ``offsets``: node name -> iteration offset (default :func:`node_offsets` of ``staleness``)."""
    offsets = node_offsets(graph, staleness) if offsets is None else offsets
    origin = _origins(graph, offsets)
    return {Edge(i.source, i.field, node.name, i.name): max(0, origin.get(i.source, 0) - offsets.get(node.name, 0))
            for node in graph.nodes for i in node.inputs}


def lagged_edges(graph: Graph, staleness: int = 0, offsets: Mapping[str, int] | None = None) -> dict[Edge, int]:
    """The edges of :func:`edge_lags` whose lag is above 0."""
    return {e: lag for e, lag in edge_lags(graph, staleness, offsets).items() if lag}


def _spec(op: str) -> OpSpec | None:
    return get_op(op) if has_op(op) else None


def corrections_available() -> str:
    """The registry's off-policy corrections, one ``name (what it does)`` per op, compute ops first."""
    found = sorted((s for s in list_ops() if s.correction), key=lambda s: (s.kind != "compute", s.name))
    return "; ".join(f"{s.name} ({s.kind}: {s.correction})" for s in found) or "none registered"


def check_rollout_inputs(graph: Graph) -> None:
    """Check 1 of the module docstring: a correction reads the behaviour log-probs from the rollout."""
    by_name = {n.name: n for n in graph.nodes}
    for node in graph.nodes:
        spec = _spec(node.op) if node.kind == "compute" else None
        if spec is None or spec.rollout_input is None:
            continue
        item = next((i for i in node.inputs if i.name == spec.rollout_input), None)
        source = by_name.get(item.source) if item is not None else None
        if source is None or (source.kind == "generate" and item.field in source.outputs):
            continue  # a graph input (recorded behaviour log-probs), or missing (MissingFieldError says so)
        what = (f"rollout node {source.name!r}, which does not emit {item.field!r} (it emits "
                f"{', '.join(source.outputs.names) or 'nothing'})" if source.kind == "generate"
                else f"{source.kind} node {source.name!r}, which is not the rollout that sampled the responses")
        raise StalenessError(
            f"correction {node.op!r} needs the rollout's log-probs as {spec.rollout_input!r}, but reads "
            f"{item.source}.{item.field} from {what}", node=node.name, field=spec.rollout_input,
            hint="read rollout_log_probs from the generate node (a rollout engine that returns the sampled tokens' "
                 "log-probs: hf, vllm), or drop the correction and use staleness 0")


def _loss_inputs(graph: Graph, update: Node) -> set[str]:
    names: set[str] = set()
    for term in update.attrs.terms:
        spec = _spec(term.op)
        if spec is not None:
            names.update(spec.input_names)
    return names


def _corrected(graph: Graph, update: Node, read: set[str]) -> bool:
    """Whether a value the update's loss reads was computed by (or from) a compute correction."""
    by_name = {n.name: n for n in graph.nodes}
    todo = [i.source for i in update.inputs if i.name in read]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        node = by_name.get(name)
        if node is None or name in seen:
            continue
        seen.add(name)
        spec = _spec(node.op) if node.kind == "compute" else None
        if spec is not None and spec.correction and spec.behaviour_output is None:
            return True
        todo.extend(node.sources)
    return False


def _ratio_against_behaviour(graph: Graph, update: Node, pg: list[OpSpec]) -> bool:
    """Whether every policy-gradient term takes its ratio against the behaviour log-probs (check 2, second case)."""
    by_name = {n.name: n for n in graph.nodes}

    def behaviour(input_name: str) -> bool:
        item = next((i for i in update.inputs if i.name == input_name), None)
        node = by_name.get(item.source) if item is not None else None
        spec = _spec(node.op) if node is not None and node.kind == "compute" else None
        return spec is not None and spec.behaviour_output == item.field

    return bool(pg) and all(s.ratio_input is not None and behaviour(s.ratio_input) for s in pg)


def check_staleness(graph: Graph, staleness: int = 0, offsets: Mapping[str, int] | None = None) -> dict[Edge, int]:
    """Run both checks (module docstring) for a plan with ``staleness`` (or these offsets); return the lags.

    Raises StalenessError naming the first update whose policy-gradient loss reads lagged data uncorrected."""
    check_rollout_inputs(graph)
    lags = edge_lags(graph, staleness, offsets)
    for update in (n for n in graph.nodes if n.kind == "update"):
        pg_specs = [s for t in update.attrs.terms if (s := _spec(t.op)) is not None and s.policy_gradient]
        pg = [s.name for s in pg_specs]
        read = _loss_inputs(graph, update)
        late = sorted(((lag, e) for e, lag in lags.items() if e.consumer == update.name and e.name in read and lag),
                      key=lambda le: (-le[0], le[1].name != "advantages", str(le[1])))
        if not pg or not late or _corrected(graph, update, read) or _ratio_against_behaviour(graph, update, pg_specs):
            continue
        lag, edge = late[0]
        others = ", ".join(f"{e} (lag {n})" for n, e in late[1:])
        raise StalenessError(
            f"loss {' + '.join(pg)} trains on lagged data: {edge} has lag {lag} (from responses sampled by weights "
            f"{lag} update(s) older than the ones it trains)" + (f"; also {others}" if others else "") +
            ", and no off-policy correction reaches the loss. Corrections available: " + corrections_available(),
            node=update.name, field=edge.name, lag=lag,
            hint="add hf.compute('truncated_is_weight', old_logp, rollout) and use the loss's '_is' op ('ppo_clip_is', "
                 "'gspo_is', ...; algorithm grpo_is does), or take PPO's old log-probs from the rollout "
                 "(old_log_probs_from_rollout; grpo with recompute_old_log_probs=false), or use staleness 0, or "
                 "accept the biased gradient knowingly "
                 "(config allow_uncorrected_staleness: true; hybridflow compile --allow-uncorrected-staleness; "
                 "compile(..., allow_uncorrected_staleness=True))")
    return lags
