"""One-step-off overlap (``staleness`` 1): generation of step i+1 runs while step i trains.

The compiler marks the generation ops (a policy's weight sync and its generate
nodes) of a ``staleness=1`` plan with ``iteration_offset`` 1 and drops the
edges from them to the ops that read the rollout, which must run on a pool of
its own. A call ``run_iteration(inputs_i, next_inputs=inputs_i+1)`` then

1. finishes the generation for ``inputs_i`` that the previous call started
   (or, on the first call, runs it now: that rollout is on-policy);
2. sends the generation for ``inputs_i+1``: its weight sync is queued on the
   train pool ahead of this step's ops, so it carries the weights after step
   i-1 — step i's update comes after it — and finds the generation pool idle,
   so no collective of the sync waits on a long generation;
3. runs step i's other ops on the rollout of ``inputs_i`` while step i+1's
   generation runs on the generation pool, and returns as soon as step i is
   done and step i+1's generation has been sent (its weight sync, queued before
   step i's update, is done by then), leaving the generation in flight for the
   next call.

So the rollout trained at step i was sampled with weights one update older
than the ones training on it; a graph with ``truncated_is_weight`` and
``ppo_clip_is`` corrects the policy loss for that (truncated importance
sampling between the rollout's and the current old log-probs). The step's
metrics record it: ``rollout/staleness`` is 1 for a rollout generated during
the previous step and 0 for one generated in this call.

With ``partial_rollouts: continue`` (:mod:`.partial`) the generation sent ahead runs in segments, and
once step i's update is done the rest of it is decoded with the weights after step i; each token's
``policy_version`` says which weights decoded it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from ..errors import ExecutionError
from ..batch import Batch
from .interpreter import IterationResult, IterationState, Stream
from .partial import segment_generation

if TYPE_CHECKING:
    from .interpreter import PlanExecutor

__all__ = ["run_overlapped"]


def _same_inputs(a: Mapping[str, Batch], b: Mapping[str, Batch]) -> bool:
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def run_overlapped(ex: "PlanExecutor", inputs: Mapping[str, Batch], next_inputs: Mapping[str, Batch] | None) -> IterationResult:
    """One call of a staleness-1 plan (see the module docstring)."""
    ahead_ops = [op for op in ex.plan.ops if op.iteration_offset > 0]
    if any(op.iteration_offset > 1 for op in ahead_ops):
        raise ExecutionError(f"plan staleness {ex.plan.staleness}: the executor overlaps one step (staleness 1); "
                             "compile with staleness=1")
    current_ops = [op for op in ex.plan.ops if op.iteration_offset == 0]
    carried, ex.ahead = ex.ahead, None
    if carried is not None and not _same_inputs(carried.inputs, inputs):
        raise ExecutionError("run_iteration: these inputs are not the next_inputs given to the previous call, whose "
                             "generation is in flight; pass each step's inputs as next_inputs of the step before")
    generation = carried or Stream(list(ahead_ops), IterationState(env=dict(inputs)), ex.iteration, inputs=inputs)
    ex.drive([generation], generation)
    rollout = {name: batch for name, batch in generation.state.env.items() if name not in inputs}
    step = Stream(list(current_ops), IterationState(env={**inputs, **rollout}, metrics=dict(generation.state.metrics)),
                  ex.iteration)
    step.state.metrics["rollout/staleness"] = 1.0 if carried is not None else 0.0
    streams = [step]
    following = None
    if next_inputs is not None:
        # Sent first, so its weight sync is queued on the train pool ahead of this step's update; sent after this
        # step's rollout is in, so the generation pool is free to receive at once (no collective waits on it).
        following = Stream(list(ahead_ops), IterationState(env=dict(next_inputs)), ex.iteration + 1, inputs=next_inputs)
        segment_generation(ex, following, step)  # partial_rollouts: continue -> in segments, newer weights mid-way
        streams.insert(0, following)
    ex.drive(streams, step, settle=[following] if following else [])
    ex.ahead = following
    ex.iteration += 1
    return IterationResult(env=step.state.env, metrics=step.state.metrics)
