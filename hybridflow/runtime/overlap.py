"""Bounded-staleness overlap (``staleness`` k >= 1): generation runs up to k steps ahead of training.

The compiler marks the generation ops (a policy's weight sync and its generate
nodes) of a ``staleness=k`` plan with ``iteration_offset`` k and drops the
edges from them to the ops that read the rollout, which must run on a pool of
its own. The executor keeps a bounded buffer, :attr:`PlanExecutor.ahead`: the
generations of the next steps, in step order, at most k of them, each in flight
or finished. A call ``run_iteration(inputs_i, next_inputs=[inputs_i+1, ...,
inputs_i+k])`` (the following steps' inputs, in order; fewer near the end of a
run, a single mapping for k = 1)

1. takes the generation for ``inputs_i`` from the front of the buffer (or, on
   the first call, runs it now: that rollout is on-policy) and drives every
   generation of the buffer to its end, so the generation pool is idle (with the
   staged weight sync only that one: the others go on, see below);
2. sends the generation of the first step of ``next_inputs`` that is not in the
   buffer yet: its weight sync is queued on the train pool ahead of this step's
   ops, so it carries the weights after step i-1 (version i: step i's update
   comes after it) and finds the generation pool idle, so no collective of the
   sync waits on a long generation. While the buffer is still filling (the
   first call) the further steps' generations are sent too, behind it on the
   generation pool, without a sync of their own: no update comes between, so
   they would carry the very same weights;
3. runs step i's other ops on the rollout of ``inputs_i`` while the new
   generations run on the generation pool, and returns as soon as step i is
   done and the new generations have been sent (their weight sync is done by
   then), leaving them in the buffer for the next calls.

**Lag.** In the steady state the generation for step j = i+k is sent in the call
that trains step i with weights of version i, so the rollout step j trains on
lags by exactly k updates — the lag :func:`hybridflow.graph.staleness.edge_lags`
gives the rollout edges of the plan. While the buffer fills, step j < k trains on
a rollout of version 0 (lag j). Each token's version is in the rollout's
``policy_version`` field (:mod:`.policy_version`); the trainer reports the lag as
``rollout/staleness``. A graph with ``truncated_is_weight`` and ``ppo_clip_is``
corrects the policy loss for it.

**What k > 1 buys** depends on the weight sync (:attr:`PlanExecutor.weight_sync`, config
``async_weight_sync``). *Collective* (the default): the generation pool is made idle before
each sync, so one generation runs beside each training step, as with k = 1; a larger k keeps
finished rollouts ready but does not let a sync pass a generation in flight (a broadcast needs
both sides). *Staged* (:mod:`.staged_sync`): the sync of step i+k's generation is cut into a
stage op on the train pool (queued where the sync was, ahead of step i's update, so the
version is the same) and a load op on the rollout pool, which waits for the generation before
it; step 1 drives only step i's own rollout, and the buffer's generations, their loads and the
new one go on while step i trains and after the call returns. The rollout pool thus runs up to
k generations ahead, bounded by data, as in ``async_cost``'s ``sync="staged"`` model, so a
larger k can absorb generation times that vary. ``tools/bench_async.py`` measures the
throughput against k for both, predicted beside measured.

With ``partial_rollouts: continue`` (:mod:`.partial`) each generation sent ahead runs in segments, and
once step i's update is done the rest of it is decoded with the weights after step i; each token's
``policy_version`` says which weights decoded it.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Mapping, Sequence

from ..errors import ExecutionError
from ..batch import Batch
from .interpreter import IterationResult, IterationState, Stream
from .partial import segment_generation
from .staged_sync import check_weight_sync, stage_syncs

if TYPE_CHECKING:
    from .interpreter import PlanExecutor

__all__ = ["run_overlapped", "following_inputs"]

Inputs = Mapping[str, Batch]


def _same_inputs(a: Inputs, b: Inputs) -> bool:
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def following_inputs(next_inputs: Inputs | Sequence[Inputs] | None) -> list[Inputs]:
    """``next_inputs`` of :meth:`~.interpreter.PlanExecutor.run_iteration` as a list: the following steps' inputs."""
    if next_inputs is None:
        return []
    if isinstance(next_inputs, Mapping):
        return [next_inputs]
    return list(next_inputs)


def _generation(ex: "PlanExecutor", inputs: Inputs, iteration: int, *, with_sync: bool,
                after: Stream | None = None) -> Stream:
    """A stream of the plan's ahead ops for ``inputs``; without its weight syncs when ``with_sync`` is False (they
    are marked done: the generation pool keeps the weights the sync before it brought). With a staged weight sync
    (:mod:`.staged_sync`) its syncs are cut into stage and load ops, and it keeps the pool order of ``after``."""
    ahead = [op for op in ex.plan.ops if op.iteration_offset > 0]
    stream = Stream(ahead, IterationState(env=dict(inputs)), iteration, inputs=inputs)
    if not with_sync:
        syncs = {op.name for op in ahead if op.kind == "weight_sync"}
        stream.pending = [op for op in ahead if op.name not in syncs]
        stream.done.update(syncs)
    if ex.weight_sync == "staged":
        stage_syncs(ex, stream)
        stream.after = after
    return stream


def run_overlapped(ex: "PlanExecutor", inputs: Inputs, next_inputs: Inputs | Sequence[Inputs] | None) -> IterationResult:
    """One call of a plan with staleness k >= 1 (see the module docstring)."""
    k = ex.plan.staleness
    offsets = {op.iteration_offset for op in ex.plan.ops if op.iteration_offset > 0}
    if offsets != {k}:
        raise ExecutionError(f"plan staleness {k}: its generation ops work at offsets {sorted(offsets)}, not {k}; "
                             "compile the plan with hybridflow.compiler (the schedule pass sets them)")
    following = following_inputs(next_inputs)
    if len(following) > k:
        raise ExecutionError(f"run_iteration: {len(following)} next_inputs for a plan with staleness {k}; give at most "
                             f"the next {k} steps' inputs")
    buffer: deque[Stream] = deque(ex.ahead or ())
    if buffer and not _same_inputs(buffer[0].inputs, inputs):
        raise ExecutionError("run_iteration: these inputs are not the next_inputs given to the previous call, whose "
                             "generation is in flight; pass each step's inputs as next_inputs of the steps before")
    current = buffer.popleft() if buffer else _generation(ex, inputs, ex.iteration, with_sync=True)
    for stream, given in zip(buffer, following):
        if not _same_inputs(stream.inputs, given):
            raise ExecutionError("run_iteration: next_inputs must list the following steps' inputs in order, starting "
                                 "with the ones given before (whose generations are in flight)")
    if len(following) < len(buffer):
        raise ExecutionError(f"run_iteration: {len(buffer)} generation(s) are in flight for the following steps, but "
                             f"next_inputs lists {len(following)}; list every one of them")
    staged = ex.weight_sync == "staged"
    if staged:
        check_weight_sync(ex.weight_sync, staleness=k, partial_rollouts=getattr(ex.partial_rollouts, "mode", "finish"))
    ex.ahead = []  # (a bad call above leaves the buffer as it was)
    # 1. this step's rollout; collective sync: the generation pool idle (every generation of the buffer finished);
    #    staged: the buffer's generations go on
    if staged:
        ex.drive([current, *buffer], current)
        current.after = None  # finished: the chain of streams ahead stays at most k + 1 long
    else:
        for stream in [current, *buffer]:
            ex.drive([stream], stream)
    rollout = {name: batch for name, batch in current.state.env.items() if name not in inputs}
    step = Stream([op for op in ex.plan.ops if op.iteration_offset == 0],
                  IterationState(env={**inputs, **rollout}, metrics=dict(current.state.metrics)), ex.iteration)
    # 2. the generations not yet in the buffer; the first one's weight sync queued ahead of this step's update
    base, new, last = ex.iteration + 1, [], (buffer[-1] if buffer else current)
    for j, given in enumerate(following):
        if j >= len(buffer):
            new.append(_generation(ex, given, base + j, with_sync=(j == len(buffer)), after=last))
            last = new[-1]
    for generation in new:  # partial_rollouts: continue -> in segments, newer weights mid-way
        segment_generation(ex, generation, step)
    # 3. this step, with the new generations sent before it (sends keep each pool's order: syncs first);
    #    staged: the buffer's generations and the new one's load go on as the rollout pool gets to them
    if staged:
        ex.drive([*buffer, *new, step], step, send=[*buffer, *new])
    else:
        ex.drive([*new, step], step, settle=new)
    ex.ahead = [*buffer, *new]
    ex.iteration += 1
    return IterationResult(env=step.state.env, metrics=step.state.metrics)
