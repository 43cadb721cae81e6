"""The run state an algorithm declares (:mod:`hybridflow.graph.state`), held by the trainer.

One object per run: it starts from the graph's attributes, gives the executor
each step's compute-node parameters, advances from the step's metrics, and is
saved in and restored from the checkpoint's JSON, so a resumed run continues
with the value the interrupted one would have used. Algorithms without state
rules hold an empty state and pass no parameters.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import CheckpointError
from ..graph import Graph, StateRule
from ..graph.attrs import Scalar
from ..graph.state import advance, initial_state, node_params

__all__ = ["AlgorithmState"]


class AlgorithmState:
    """The values of ``rules`` over a run of ``graph``."""

    def __init__(self, rules: tuple[StateRule, ...], graph: Graph):
        self.rules, self.graph = tuple(rules), graph
        self.values = initial_state(self.rules, graph)

    def node_params(self) -> dict[str, dict[str, Scalar]]:
        """This step's ``params`` for ``executor.run_iteration``."""
        return node_params(self.rules, self.graph, self.values)

    def advance(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Update from a finished step's metrics; returns the values that step ran with, by metric name."""
        ran_with = {rule.metric: self.values[rule.name] for rule in self.rules}
        self.values = advance(self.rules, self.graph, self.values, metrics)
        return ran_with

    def state_dict(self) -> dict[str, float]:
        return dict(self.values)

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; CheckpointError if a value of this algorithm's state is missing."""
        missing = [rule.name for rule in self.rules if rule.name not in saved]
        if missing:
            raise CheckpointError(f"the checkpoint holds no value for the run state {missing} of graph "
                                  f"{self.graph.name!r}; it was written without it (resume='never' overwrite=true starts over)")
        self.values = {rule.name: float(saved[rule.name]) for rule in self.rules}
