"""Run state: scalars an algorithm carries from step to step and feeds to its compute nodes.

Some algorithms adapt a hyper-parameter to what the run observes: Safe-RLHF's
Lagrange multiplier grows while the mean episode cost is over its limit; an
adaptive KL controller (Ziegler et al. 2019) moves the KL coefficient toward a
target. The graph does not change — only a compute node's parameter does, from
one iteration to the next. A :class:`StateRule`, declared with the algorithm
(``@hf.algorithm(state=(rule,))``), says how:

* ``name`` — the graph attribute holding the initial value; it also names the state;
* ``observes`` — the step metric the update reads (e.g. ``critic/costs/mean``);
* ``update(value, observed, **hyper)`` — the next value, a pure function of scalars;
  ``hyper`` names the graph attributes passed to it as keywords;
* ``feeds`` — the ``(op, parameter)`` pairs of the compute nodes that take the value;
* ``metric`` — the name under which the value a step ran with is logged.

The values live in the run, not in the graph or a global: the trainer holds them
(:class:`hybridflow.trainer.algorithm_state.AlgorithmState`), gives
:func:`node_params` to ``executor.run_iteration(inputs, params=...)`` (both
executors apply them with :meth:`Graph.with_params`), calls :func:`advance`
after each step, and checkpoints them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ..errors import GraphError
from .attrs import Scalar
from .ir import Graph

__all__ = ["StateRule", "initial_state", "node_params", "advance"]


@dataclass(frozen=True)
class StateRule:
    """How one scalar of run state starts, is updated from a step's metrics, and reaches the graph."""

    name: str
    """Graph attribute with the initial value; the state's name in checkpoints."""
    observes: str
    """Step metric the update reads."""
    update: Callable[..., float]
    """``update(value, observed, **{h: graph.attr(h) for h in hyper}) -> next value``."""
    feeds: tuple[tuple[str, str], ...]
    """``(op, parameter)`` of the compute nodes that run with the current value."""
    metric: str
    """Metric name of the value each step ran with."""
    hyper: tuple[str, ...] = ()
    """Graph attributes passed to ``update`` as keyword arguments."""


def initial_state(rules: tuple[StateRule, ...], graph: Graph) -> dict[str, float]:
    """Each rule's starting value: its graph attribute."""
    return {rule.name: float(graph.attr(rule.name)) for rule in rules}


def node_params(rules: tuple[StateRule, ...], graph: Graph, state: Mapping[str, float]) -> dict[str, dict[str, Scalar]]:
    """Node name -> {parameter: value} for :meth:`Graph.with_params`; GraphError if a rule feeds no node."""
    params: dict[str, dict[str, Scalar]] = {}
    for rule in rules:
        fed = False
        for op, param in rule.feeds:
            for node in graph.nodes:
                if node.kind == "compute" and node.op == op and param in dict(node.attrs.params):
                    params.setdefault(node.name, {})[param] = state[rule.name]
                    fed = True
        if not fed:
            raise GraphError(f"state {rule.name!r} feeds {list(rule.feeds)}, but graph {graph.name!r} has no compute "
                             "node with that op and parameter")
    return params


def advance(rules: tuple[StateRule, ...], graph: Graph, state: Mapping[str, float],
            metrics: Mapping[str, float]) -> dict[str, float]:
    """The state after a step that reported ``metrics``; GraphError naming a metric the step did not report."""
    new = dict(state)
    for rule in rules:
        if rule.observes not in metrics:
            raise GraphError(f"state {rule.name!r} is updated from metric {rule.observes!r}, which the step of graph "
                             f"{graph.name!r} did not report; it reported {', '.join(sorted(metrics))}")
        hyper = {h: graph.attr(h) for h in rule.hyper}
        new[rule.name] = float(rule.update(state[rule.name], float(metrics[rule.observes]), **hyper))
    return new
