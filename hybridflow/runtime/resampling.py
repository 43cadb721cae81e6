"""Running a graph's dynamic-sampling region (:mod:`hybridflow.graph.resampling`) inside the plan interpreter.

A :class:`ResampleRun` rides on one :class:`~hybridflow.runtime.interpreter.Stream`. It splits the
plan's ops three ways:

* **body ops**: the ops of the region's nodes, and any weight-sync / offload / onload op that
  sits between two of them in the plan's dependencies; they run once per round;
* **held ops**: every other op that depends, directly or not, on a body op; none is sent until
  the region is finished, so nothing after the body (an offload after generation, the update)
  runs while rounds are still generating;
* the rest run as usual.

When the filter's op has run, :meth:`ResampleRun.filter_done` records the round (every body
node's batch, the keep mask and the group labels) and either puts the body ops back in the
stream for another round, on fresh graph inputs from ``refill(round)`` (the same inputs when
there is no ``refill``), or finishes: each body node's environment entry becomes the selected
rows of every round, one batch (selection rule in :func:`select_groups`), and the held ops are
released. Metrics: ``{name}/rounds``, ``{name}/extra_rounds``, ``{name}/dropped_group_frac``
(dropped groups over generated groups, all rounds), ``{name}/filled_frac`` (share of the final
groups that passed the filter).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..compiler.plan import PlanOp
from ..errors import ExecutionError
from ..graph import Graph
from ..graph.resampling import Resample
from ..batch import Batch

__all__ = ["ResampleRun", "Round", "select_groups", "concat_padded", "Refill"]

Refill = Callable[[int], Mapping[str, Batch]]
"""``refill(round)`` -> the graph inputs of round ``round`` (2, 3, ...): e.g. the next prompts of the data loader."""


@dataclass
class Round:
    """What one round of the body produced."""

    outputs: dict[str, Batch]
    keep: np.ndarray
    groups: np.ndarray

    def group_order(self) -> list[int]:
        """Group labels in order of first appearance."""
        return list(dict.fromkeys(self.groups.tolist()))

    def kept_groups(self) -> list[int]:
        kept = set(self.groups[self.keep].tolist())
        return [g for g in self.group_order() if g in kept]

    def dropped_groups(self) -> list[int]:
        kept = set(self.kept_groups())
        return [g for g in self.group_order() if g not in kept]


def select_groups(rounds: Sequence[Round], target: int) -> list[tuple[int, int]]:
    """The (round, group) pairs of the final batch: kept groups in round order, up to ``target``;
    if fewer than ``target`` were kept, topped up with dropped groups, latest round first."""
    chosen = [(k, g) for k, r in enumerate(rounds) for g in r.kept_groups()][:target]
    for k in reversed(range(len(rounds))):
        for g in rounds[k].dropped_groups():
            if len(chosen) >= target:
                return chosen
            chosen.append((k, g))
    return chosen


LEFT_PADDED = ("prompt_ids", "prompt_mask")
"""Fields padded on the left: prompts are left-padded (the rollout engines' convention, so that every prompt
ends where its response starts); every other field is padded on the right."""


def _pad(tensor: torch.Tensor, target: Sequence[int], left: bool) -> torch.Tensor:
    grown = tensor.new_zeros((tensor.shape[0], *target))
    grown[(slice(None), *(slice(t - s, t) if left else slice(0, s) for s, t in zip(tensor.shape[1:], target)))] = tensor
    return grown


def concat_padded(parts: Sequence[Batch]) -> Batch:
    """:meth:`Batch.concat` after padding every tensor with zeros to the parts' largest trailing dims: rounds
    may have prompts and responses of different lengths (:data:`LEFT_PADDED` fields on the left, the rest on
    the right; padding is masked by ``prompt_mask`` and ``response_mask``)."""
    names = parts[0].tensors.keys()
    padded = []
    for part in parts:
        fields = {}
        for name in names:
            tensor = part[name]
            target = [max(p[name].shape[d] for p in parts) for d in range(1, tensor.dim())]
            if list(tensor.shape[1:]) != target:
                fields[name] = _pad(tensor, target, name in LEFT_PADDED)
        padded.append(part.with_fields(**fields) if fields else part)
    return Batch.concat(padded)


def _between(ops: Sequence[PlanOp], body_nodes: set[str]) -> set[str]:
    """Names of the body's node ops and of the plan ops on a dependency path from one of them to another."""
    by_name = {op.name: op for op in ops}
    core = {op.name for op in ops if op.kind == "node" and op.node in body_nodes}
    ancestors: set[str] = set()
    stack = [d for name in core for d in by_name[name].deps]
    while stack:
        name = stack.pop()
        if name not in ancestors and name in by_name:
            ancestors.add(name)
            stack.extend(by_name[name].deps)
    return core | (_descendants(ops, core) & ancestors)


def _descendants(ops: Sequence[PlanOp], roots: set[str]) -> set[str]:
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for op in ops:
            if op.name not in found and op.name not in roots and any(d in roots or d in found for d in op.deps):
                found.add(op.name)
                changed = True
    return found


@dataclass
class ResampleRun:
    """The state of one iteration's dynamic-sampling region (module docstring)."""

    spec: Resample
    graph: Graph
    body_ops: list[PlanOp]
    held: set[str]
    refill: Refill | None
    inputs: Mapping[str, Batch]
    rounds: list[Round] = field(default_factory=list)
    finished: bool = False

    @classmethod
    def start(cls, graph: Graph, ops: Sequence[PlanOp], inputs: Mapping[str, Batch], refill: Refill | None) -> "ResampleRun | None":
        """The run of ``graph``'s region over plan ``ops``, or None when the graph has none."""
        if not graph.resample:
            return None
        spec = graph.resample[0]
        body = _between(ops, set(spec.nodes))
        held = _descendants(ops, body) - body
        return cls(spec, graph, [op for op in ops if op.name in body], held, refill, inputs)

    def holds(self, op: PlanOp) -> bool:
        """Whether ``op`` must wait for the region to finish."""
        return not self.finished and op.name in self.held

    # -- one round done ------------------------------------------------------------------------
    def _record_round(self, env: Mapping[str, Batch]) -> Round:
        spec, node = self.spec, self.graph.node(self.spec.filter)
        keep = env[node.name][spec.keep_field]
        source = next((i for i in node.inputs if i.name == spec.group_field), None)
        if source is None:
            raise ExecutionError(f"resample filter {node.name!r} reads no {spec.group_field!r}; its groups are unknown")
        groups = env[source.source][source.field]
        if keep.dtype != torch.bool or keep.shape != groups.shape:
            raise ExecutionError(f"resample filter {node.name!r} gave {spec.keep_field!r} of {keep.dtype}{list(keep.shape)}; "
                                 f"it must be bool with one entry per row of {spec.group_field!r} ({list(groups.shape)})")
        outputs = {name: env[name] for name in spec.nodes}
        return Round(outputs, keep.cpu().numpy(), groups.cpu().numpy())

    def filter_done(self, env: dict[str, Batch], metrics: dict[str, float]) -> list[PlanOp]:
        """Record the round just filtered; return the body ops to run again (empty: the region is finished)."""
        self.rounds.append(self._record_round(env))
        target = len(self.rounds[0].group_order())
        kept = sum(len(r.kept_groups()) for r in self.rounds)
        if kept < target and len(self.rounds) < self.spec.max_rounds:
            fresh = self.refill(len(self.rounds) + 1) if self.refill is not None else self.inputs
            reads = {i.source for n in self.spec.nodes for i in self.graph.node(n).inputs} & set(self.inputs)
            missing = sorted(reads - set(fresh))
            if missing:
                raise ExecutionError(f"resample refill gave inputs {sorted(fresh)}, but the body reads {missing}")
            env.update({name: fresh[name] for name in reads})
            return list(self.body_ops)
        self._finish(env, metrics, target)
        return []

    def _finish(self, env: dict[str, Batch], metrics: dict[str, float], target: int) -> None:
        chosen = select_groups(self.rounds, target)
        label = {pair: new for new, pair in enumerate(chosen)}
        offsets = np.cumsum([0] + [len(r.groups) for r in self.rounds])
        rows = sorted(((label[(k, g)], offsets[k] + i) for k, r in enumerate(self.rounds)
                       for i, g in enumerate(r.groups.tolist()) if (k, g) in label))
        index = np.asarray([row for _, row in rows], dtype=np.int64)
        labels = torch.tensor([new for new, _ in rows], dtype=torch.int64)
        for name in self.spec.nodes:
            batch = concat_padded([r.outputs[name] for r in self.rounds])[index]
            if self.spec.group_field in batch:
                batch = batch.with_fields(**{self.spec.group_field: labels.to(batch[self.spec.group_field].dtype)})
            env[name] = batch
        generated = sum(len(r.group_order()) for r in self.rounds)
        kept_final = sum(1 for k, g in chosen if g in set(self.rounds[k].kept_groups()))
        prefix = self.spec.name
        metrics[f"{prefix}/rounds"] = float(len(self.rounds))
        metrics[f"{prefix}/extra_rounds"] = float(len(self.rounds) - 1)
        metrics[f"{prefix}/dropped_group_frac"] = sum(len(r.dropped_groups()) for r in self.rounds) / generated
        metrics[f"{prefix}/filled_frac"] = kept_final / target
        self.finished = True
