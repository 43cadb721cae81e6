"""A run's step set against its plan: measured time per op, the critical path, and the cost model's largest errors.

Pure functions of an :class:`~hybridflow.compiler.plan.ExecutionPlan` and the per-op spans of the iterations
(:func:`~.run_folder.iteration_spans`); ``hybridflow explain`` prints them.

* :func:`op_timings` — per plan op, its predicted seconds (``predicted_end_s - predicted_start_s``) and its measured
  seconds in each iteration (the sum of its spans there: a dynamic-sampling op may run several rounds), with the
  median and the spread (min–max under 10 iterations, p10–p90 from 10 on);
* :func:`critical_path` — the longest chain through the plan's ops weighted by the measured medians, along the
  ``deps`` alone or along the ``deps`` and each pool's op order (an op waits for the one before it on its pool:
  the interpreter sends a pool's ops in plan order and a slot runs one call at a time);
* :func:`cost_model_errors` — the ops by how far measured / predicted is from 1, each with the first cause of
  :data:`CAUSES` that fits it.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ..runtime.spans import Span

__all__ = ["OpTiming", "StepTiming", "CriticalPath", "CostError", "Cause", "CAUSES", "op_timings", "step_timing",
           "critical_path", "cost_model_errors", "quantile"]

SPREAD_QUANTILES_FROM = 10
"""From this many iterations on the spread is p10–p90; below, min–max."""


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by linear interpolation between the sorted values (q=0: min, 1: max)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _spread(values: Sequence[float]) -> tuple[float, float]:
    if len(values) >= SPREAD_QUANTILES_FROM:
        return quantile(values, 0.1), quantile(values, 0.9)
    return min(values), max(values)


class _Measured:
    """The median and spread of ``measured_s`` (seconds per iteration; None when never measured)."""

    measured_s: tuple[float, ...]

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.measured_s) if self.measured_s else None

    @property
    def spread_s(self) -> tuple[float, float] | None:
        return _spread(self.measured_s) if self.measured_s else None


@dataclass(frozen=True)
class OpTiming(_Measured):
    """One plan op: predicted seconds against its measured seconds per iteration."""

    name: str
    kind: str
    """The plan op's kind (node, weight_sync, offload, onload), or the node's kind (generate, infer, ...)."""
    role: str
    pool: str | None
    predicted_s: float
    measured_s: tuple[float, ...]
    """Seconds in each iteration the op ran in (empty: never measured)."""

    @property
    def ratio(self) -> float | None:
        """measured median / predicted (None where either is missing or the prediction is 0)."""
        median = self.median_s
        return median / self.predicted_s if median is not None and self.predicted_s > 0 else None


@dataclass(frozen=True)
class StepTiming(_Measured):
    """The step: predicted (the plan's makespan) against each step's first op start to last op end (:func:`step_timing`)."""

    predicted_s: float
    measured_s: tuple[float, ...]
    iterations: tuple[int, ...]
    """The steps measured: the ``run_iteration`` calls (the iterations, at staleness 0)."""


def op_timings(plan, spans: Iterable[Span]) -> list[OpTiming]:
    """Every op of ``plan`` in plan order with its measured seconds per iteration (module docstring)."""
    from ..runtime.staged_sync import plan_op_name  # (here: `hybridflow explain` imports this module without torch)

    per_iteration: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    names = frozenset(op.name for op in plan.ops)
    for span in spans:  # a staged weight sync's two halves count as its plan op
        per_iteration[plan_op_name(span.op, names)][span.iteration] += span.end - span.start
    rows = []
    for op in plan.ops:
        kind = plan.graph.node(op.node).kind if op.node else op.kind
        measured = tuple(seconds for _, seconds in sorted(per_iteration.get(op.name, {}).items()))
        rows.append(OpTiming(op.name, kind, op.role, op.pool, op.predicted_end_s - op.predicted_start_s, measured))
    return rows


def step_timing(plan, spans: Iterable[Span]) -> StepTiming:
    """The plan's predicted step against each step's measured one: from the first start of the ops sent during one
    ``run_iteration`` call (a span's ``call``; its iteration in a trace without calls) to the last end among those
    the call waits for. With staleness 1 a call also starts the next step's generation (ops with an
    ``iteration_offset``), which runs on while the next call trains: it opens the step, it does not close it; and a
    call that sent only such ops (the warm-up's, whose own iteration is left out) is no step."""
    from ..runtime.staged_sync import plan_op_name  # (as in op_timings)

    ahead = {op.name for op in plan.ops if op.iteration_offset}
    names = frozenset(op.name for op in plan.ops)
    bounds: dict[int, list] = {}
    for span in spans:
        bound = bounds.setdefault(_step_key(span), [math.inf, -math.inf])
        bound[0] = min(bound[0], span.start)
        if plan_op_name(span.op, names) not in ahead:  # (a staged sync's halves: its plan op's)
            bound[1] = max(bound[1], span.end)
    steps = tuple(k for k in sorted(bounds) if bounds[k][1] > -math.inf)
    return StepTiming(plan.predicted_iteration_s or 0.0, tuple(bounds[k][1] - bounds[k][0] for k in steps), steps)


@dataclass(frozen=True)
class CriticalPath:
    """The longest chain of ops by their measured medians, and how much of each measured step it took."""

    ops: tuple[str, ...]
    seconds: float
    """The chain's length: the sum of its ops' medians (what chose it)."""
    step_s: float | None
    with_pool_order: bool
    shares: tuple[float, ...] = ()
    """Per measured step: the chain's ops' seconds in that step over the step's seconds. The chain's ops run one
    after another, so each share is at most 1 (a sum of medians against a median step need not be)."""

    @property
    def fraction(self) -> float | None:
        """The median share of the measured steps the chain explains (None without a measured step)."""
        return statistics.median(self.shares) if self.shares else None


def _step_key(span: Span) -> int:
    """The step a span belongs to: its ``run_iteration`` call (its iteration in a trace without calls)."""
    return span.call if span.call is not None else span.iteration


def _edges(plan, with_pool_order: bool) -> dict[str, set[str]]:
    """op -> the ops it waits for: its deps, and (``with_pool_order``) the op before it on each of its pools."""
    before: dict[str, set[str]] = {op.name: set(op.deps) for op in plan.ops}
    if with_pool_order:
        last_on: dict[str, str] = {}
        for op in plan.ops:
            for pool in filter(None, (op.pool, op.target_pool)):
                if pool in last_on:
                    before[op.name].add(last_on[pool])
                last_on[pool] = op.name
    return before


def critical_path(plan, timings: Sequence[OpTiming], step: StepTiming, spans: Iterable[Span] = (), *,
                  with_pool_order: bool = True) -> CriticalPath:
    """The longest chain through ``plan``'s ops weighted by the measured medians (an op never measured weighs its
    prediction); ``with_pool_order`` adds each pool's op order to the ``deps`` (module docstring). ``spans`` (those
    :func:`step_timing` measured ``step`` from) give the chain's share of each step."""
    weight = {t.name: (t.median_s if t.median_s is not None else t.predicted_s) for t in timings}
    before = _edges(plan, with_pool_order)
    finish: dict[str, float] = {}
    previous: dict[str, str | None] = {}
    pending = [op.name for op in plan.ops]
    while pending:  # plan order has deps first; pool order follows plan order: one pass settles all but odd plans
        waiting = []
        for name in pending:
            if not before[name] <= finish.keys():
                waiting.append(name)
                continue
            longest = max(before[name], key=lambda d: finish[d], default=None)
            finish[name] = weight[name] + (finish[longest] if longest is not None else 0.0)
            previous[name] = longest
        if len(waiting) == len(pending):
            from ..errors import PlanError

            raise PlanError(f"ops {waiting} of the plan wait on each other (a cycle through their deps and pool order); "
                            "the plan is broken: compile it again")
        pending = waiting
    end = max(finish, key=lambda name: finish[name], default=None)
    chain = []
    while end is not None:
        chain.append(end)
        end = previous[end]
    ops = tuple(reversed(chain))
    on_chain: dict[int, float] = defaultdict(float)
    for span in spans:
        if span.op in ops:
            on_chain[_step_key(span)] += span.end - span.start
    shares = tuple(on_chain[k] / seconds for k, seconds in zip(step.iterations, step.measured_s)
                   if seconds > 0 and k in on_chain)
    return CriticalPath(ops, finish[chain[0]] if chain else 0.0, step.median_s, with_pool_order, shares)


@dataclass(frozen=True)
class Cause:
    """A likely cause of a cost-model error: ``fits(op, context)`` says whether it explains ``op``'s error."""

    name: str
    fits: Callable[["OpTiming", "ErrorContext"], bool]
    explanation: str
    """What to tell the user; ``{factor}`` is the op's measured spread (high / low)."""


@dataclass(frozen=True)
class ErrorContext:
    """What the causes look at besides the op: whether the plan was calibrated, and the step's measured / predicted."""

    calibrated: bool
    step_ratio: float | None


TINY_OP_S = 0.002
"""An op measured under this many seconds is dominated by the runtime's fixed cost per op."""
NOISY_FACTOR = 1.5
"""An op whose spread (high / low) is over this varied with something else than its work."""


def _uniform(op: OpTiming, ctx: ErrorContext) -> bool:
    return op.ratio is not None and ctx.step_ratio is not None and ctx.step_ratio > 1.15 and \
        abs(math.log(op.ratio / ctx.step_ratio)) < math.log(1.25)


def _noisy(op: OpTiming, ctx: ErrorContext) -> bool:
    low, high = op.spread_s or (0.0, 0.0)
    return low > 0 and high / low > NOISY_FACTOR


CAUSES: tuple[Cause, ...] = (
    Cause("priced as free", lambda op, ctx: op.predicted_s == 0 and bool(op.measured_s),
          "the cost model prices it at 0 s (e.g. a weight sync between identical layouts); what it costs is the "
          "runtime's fixed cost of an op"),
    Cause("dispatch overhead", lambda op, ctx: (op.median_s or 0.0) < TINY_OP_S,
          "dispatch overhead: a tiny op, whose time is the runtime's fixed cost per op (sending it, splitting and "
          "merging its batch, recording it), which the cost model does not price"),
    Cause("uncalibrated model", lambda op, ctx: not ctx.calibrated,
          "uncalibrated model: the plan was priced with datasheet figures (calibrate=false, or models that are not "
          "local folders); calibrate=true fits the cost model to this machine"),
    Cause("machine slower than calibrated", _uniform,
          "the whole step is slower than predicted by about the same factor: the machine was busier (or slower) "
          "than when it was calibrated; a run calibrated under the same load predicts it"),
    Cause("contention", _noisy,
          "contention: its time varied {factor:.1f}-fold over the iterations (other processes on the same cores, "
          "or ops of other pools running at the same time)"),
    Cause("cost rule", lambda op, ctx: True,
          "the cost rule of this kind of op misprices it at this size (see docs/cost_model.md); "
          "`hybridflow profile` shows the calibrated factors"),
)
"""Likely causes, most specific first: an error gets the first that fits it."""


@dataclass(frozen=True)
class CostError:
    """One op's error: measured / predicted, and the likely cause."""

    op: OpTiming
    ratio: float
    cause: Cause
    explanation: str


SIGNIFICANT_SHARE = 0.01
"""An error of less than this share of the measured step (|measured - predicted|) is listed after the others."""


def cost_model_errors(timings: Sequence[OpTiming], step: StepTiming, *, calibrated: bool) -> list[CostError]:
    """The measured ops, largest error first, each with its likely cause (:data:`CAUSES`).

    Errors are ranked by how far measured / predicted is from 1, either way (3x too slow and 3x too fast weigh the
    same; an op predicted at 0 s that took time is infinitely off), among the ops whose error is at least
    :data:`SIGNIFICANT_SHARE` of the measured step; the ops whose error is smaller follow, ranked the same way."""
    context = ErrorContext(calibrated, (step.median_s / step.predicted_s) if step.median_s and step.predicted_s else None)
    errors = []
    for op in timings:
        if op.median_s is None:
            continue
        ratio = op.ratio if op.ratio is not None else (math.inf if op.median_s > 0 else 1.0)
        cause = next(c for c in CAUSES if c.fits(op, context))
        low, high = op.spread_s
        errors.append(CostError(op, ratio, cause, cause.explanation.format(factor=high / low if low > 0 else math.inf)))
    floor = SIGNIFICANT_SHARE * (step.median_s or 0.0)

    def rank(error: CostError) -> tuple[bool, float]:
        small = abs(error.op.median_s - error.op.predicted_s) < floor
        return small, -abs(math.log(error.ratio)) if 0 < error.ratio < math.inf else -math.inf

    return sorted(errors, key=rank)
