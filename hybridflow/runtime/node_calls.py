"""What each graph node asks of the workers, whatever executor runs the plan.

Both executors interpret the same plan through this module, so neither has its
own idea of the algorithm. A node op is run in three
steps:

1. :func:`node_call` gathers the node's inputs from the environment (producer
   name -> :class:`Batch`) and says which :class:`~hybridflow.runtime.worker.Worker`
   method to call on which role with which batch (a :class:`WorkerCall`);
2. the executor calls it: the LocalExecutor directly on its one worker, the
   RayExecutor on every data-parallel rank of the role's pool, each with its
   slice of the batch, merging the slices' results afterwards;
3. :func:`node_output` turns the (merged) result into the node's output batch
   and adds the node's metrics.

Controller nodes (``compute``) need no worker: :func:`run_compute` calls the
registered op on the gathered tensors.

Inputs are gathered by the node's :class:`~hybridflow.graph.Input` records;
the non-tensor columns of its producers (decoded responses, ground truths,
data sources) travel along. Nodes that run a model over the responses (infer,
update) also get the sequence fields (``prompt_ids``, ``prompt_mask``,
``response_ids``, ``response_mask``) of the rollout their ``response_mask``
comes from.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from hybridflow_ops.registry import get_op

from ..errors import ExecutionError, RewardError
from ..graph import Node
from . import contracts
from .agent_metrics import agent_metrics
from ..batch import Batch

__all__ = ["SEQUENCE_FIELDS", "WorkerCall", "gather", "node_call", "node_output", "read_by_update", "run_compute", "reused_log_probs",
           "CALL_BUILDERS", "OUTPUT_READERS"]

SEQUENCE_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


@dataclass(frozen=True)
class WorkerCall:
    """``Worker.<method>(role, batch, *args)``: what a node asks of the worker(s) hosting its role."""

    method: str
    role: str
    batch: Batch
    args: tuple = ()


def gather(node: Node, env: Mapping[str, Batch], *, sequence: bool = False) -> Batch:
    """The node's input batch: its declared inputs, its producers' columns, and (``sequence``) the rollout fields."""
    tensors: dict[str, torch.Tensor] = {}
    columns: dict[str, object] = {}
    for inp in node.inputs:
        producer = env[inp.source]
        tensors[inp.name] = producer[inp.field]
        for name, values in producer.columns.items():
            columns.setdefault(name, values)
    if sequence:
        source = next((i.source for i in node.inputs if i.name == "response_mask"), None)
        if source is None:
            raise ExecutionError(f"node {node.name!r} runs a model over responses but reads no response_mask; "
                                 "pass the rollout to it in the algorithm")
        for name in SEQUENCE_FIELDS:
            tensors.setdefault(name, env[source][name])
    return Batch(tensors, columns)


# -- step 1: the call, by node kind ---------------------------------------------------------------

def _generate_call(node: Node, env: Mapping[str, Batch]) -> WorkerCall:
    a = node.attrs
    overrides = {"n": a.n, "greedy": a.greedy or None, "max_new_tokens": a.max_new_tokens,
                 "temperature": a.temperature, "top_p": a.top_p, "seed": a.seed}
    if a.env is not None:  # a multi-turn rollout: the worker runs the agent loop with these settings
        return WorkerCall("generate", node.role, gather(node, env), (overrides, a.agent))
    return WorkerCall("generate", node.role, gather(node, env), (overrides,))


def read_by_update(graph, node: Node) -> bool:
    """Whether an update of ``node``'s role trains on ``node``'s rollout rows: its ``response_mask`` comes from
    ``node``, directly or through nodes that each take theirs from the one before (filters, joins)."""
    for update in graph.nodes:
        if update.kind != "update" or update.role != node.role:
            continue
        seen, source = set(), _response_source(update)
        while source is not None and source not in seen:
            if source == node.name:
                return True
            seen.add(source)
            source = _response_source(graph.node(source))
    return False


def _response_source(node: Node) -> str | None:
    return next((i.source for i in node.inputs if i.name == "response_mask"), None)


def _infer_call(node: Node, env: Mapping[str, Batch]) -> WorkerCall:
    if node.op not in ("logprob", "values"):
        raise ExecutionError(f"node {node.name!r}: infer op {node.op!r} is not one of logprob, values")
    return WorkerCall(node.op, node.role, gather(node, env, sequence=True))


def _score_call(node: Node, env: Mapping[str, Batch]) -> WorkerCall:
    return WorkerCall("score", node.role, gather(node, env))


def _update_call(node: Node, env: Mapping[str, Batch]) -> WorkerCall:
    terms = [(t.op, t.weight, dict(t.params)) for t in node.attrs.terms]
    return WorkerCall("update", node.role, gather(node, env, sequence=True), (terms,))


CALL_BUILDERS: dict[str, Callable[[Node, Mapping[str, Batch]], WorkerCall]] = {
    "generate": _generate_call, "infer": _infer_call, "score": _score_call, "update": _update_call,
}
"""Node kind -> the worker call that runs it (``compute`` nodes run on the controller: :func:`run_compute`)."""


def node_call(node: Node, env: Mapping[str, Batch]) -> WorkerCall:
    """The worker call of a non-controller node; ExecutionError for a kind no worker runs."""
    builder = CALL_BUILDERS.get(node.kind)
    if builder is None:
        raise ExecutionError(f"node {node.name!r} of kind {node.kind!r} runs on no worker; kinds: {', '.join(CALL_BUILDERS)}")
    return builder(node, env)


# -- step 3: the output batch and metrics, by node kind ------------------------------------------

def _generate_output(node: Node, rollout: Batch, metrics: dict[str, float]) -> Batch:
    lengths = rollout["response_mask"].sum(-1)
    metrics.setdefault("response_length/mean", float(lengths.mean()))
    if "turn_index" in rollout:
        for name, value in agent_metrics(rollout).items():
            metrics.setdefault(name, value)
    return rollout


def _infer_output(node: Node, values: torch.Tensor, metrics: dict[str, float]) -> Batch:
    (field_spec,) = node.outputs.fields
    return Batch({field_spec.name: values})


def _score_output(node: Node, reward: Any, metrics: dict[str, float]) -> Batch:
    scores = reward.scores.to(torch.float32)
    if not torch.isfinite(scores).all():
        bad = int((~torch.isfinite(scores)).nonzero()[0])
        raise RewardError(f"node {node.name!r}: reward source returned a non-finite score at sample {bad}")
    # its mean is reported with the graph's other outputs (node_metrics: critic/score/mean with a critic)
    return Batch({node.attrs.field: scores})


def _update_output(node: Node, update_metrics: Mapping[str, float], metrics: dict[str, float]) -> Batch:
    metrics.update(update_metrics)
    return Batch({})


OUTPUT_READERS: dict[str, Callable[[Node, Any, dict[str, float]], Batch]] = {
    "generate": _generate_output, "infer": _infer_output, "score": _score_output, "update": _update_output,
}
"""Node kind -> turns the worker's result into the node's output batch (and adds metrics)."""


def node_output(node: Node, result: Any, metrics: dict[str, float]) -> Batch:
    output = OUTPUT_READERS[node.kind](node, result, metrics)
    if contracts.enabled():
        contracts.check_node_output(node, output, metrics)
    return output


def reused_log_probs(env: Mapping[str, Batch], rollout: str) -> torch.Tensor:
    """What a logprob node served from generate node ``rollout`` returns (plan op ``reuse``; compiler pass
    'reuse'): the rollout's log-probs, 0 at padding, as the train engine's ``compute_log_probs`` gives them."""
    from hybridflow_ops import old_log_probs_from_rollout

    produced = env[rollout]
    return old_log_probs_from_rollout(produced["rollout_log_probs"], produced["response_mask"]).old_log_probs


def run_compute(node: Node, env: Mapping[str, Batch]) -> Batch:
    """A controller node: the registered op on the gathered tensors, its outputs by their declared names."""
    spec = get_op(node.op)
    batch = gather(node, env)
    inputs = {f.name: batch[f.name] for f in spec.inputs}
    guard = contracts.InputGuard(node, inputs) if contracts.enabled() else None
    outputs = spec.fn(*inputs.values(), **dict(node.attrs.params))
    if isinstance(outputs, torch.Tensor) and len(spec.outputs) == 1:
        outputs = (outputs,)  # an op with one output may return the bare tensor
    if guard is not None:
        guard.check()
        contracts.check_compute_results(node, batch, outputs, spec.finite_outputs)
    return Batch({f.name: value for f, value in zip(spec.outputs, outputs)})
