"""The graph layer: typed values, the Node/Graph IR, the tracing DSL, validation, JSON and text forms.

Write an algorithm::

    import hybridflow as hf

    @hf.algorithm
    def grpo(prompts, actor, reward, *, n=8):
        rollout = actor.generate(prompts, n=n)
        old_logp = actor.logprob(rollout)
        adv = hf.compute("grpo_advantage", rollout, reward.score(rollout))
        actor.update(rollout, adv, old_logp, loss="ppo_clip")

    graph = grpo.build(n=4)          # a frozen, validated Graph
    graph.to_json(); graph.to_text(); graph.to_networkx()

See :mod:`.ir` for the records, :mod:`.signature` for the typing rules and
:mod:`.validate` for the checks. This package imports no torch of its own
(``hybridflow_ops.registry`` is read for op signatures).
"""
from .algorithm import GRAPH_INPUTS, ROLE_KINDS_BY_NAME, Algorithm, algorithm
from .attrs import ComputeAttrs, GenerateAttrs, InferAttrs, LossTerm, ScoreAttrs, UpdateAttrs
from .errors import (
    AmbiguousFieldError, CycleError, DoubleUpdateError, DuplicateNodeError, FrozenRoleUpdateError, GroupSizeError, MissingFieldError,
    NodeOrderError, OpKindError, RoleKindError, TypeMismatchError, UndeclaredRoleError, UnknownAttrError, UnknownOpError,
    UnusedValueWarning, UpdateOrderError,
)
from .ir import CONTROLLER, NODE_KINDS, ROLE_KINDS, Graph, GraphInput, Input, Node, Role
from .resampling import Resample, ResampleError, resample
from .schema import ADVANTAGES, LOG_PROBS, OLD_LOG_PROBS, PROMPTS, REF_LOG_PROBS, ROLLOUT, SCORES, VALUES, FieldSpec, Schema
from .staleness import Edge, check_staleness, edge_lags, lagged_edges
from .state import StateRule
from .trace import compute
from .validate import validate
from .values import LossSpec, Value, loss

__all__ = [
    "Algorithm", "algorithm", "compute", "loss", "validate", "resample", "Resample", "ResampleError", "StateRule", "Edge", "edge_lags", "lagged_edges", "check_staleness", "GRAPH_INPUTS", "ROLE_KINDS_BY_NAME",
    "Graph", "GraphInput", "Input", "Node", "Role", "CONTROLLER", "NODE_KINDS", "ROLE_KINDS",
    "GenerateAttrs", "InferAttrs", "ScoreAttrs", "ComputeAttrs", "LossTerm", "UpdateAttrs", "LossSpec", "Value",
    "FieldSpec", "Schema", "PROMPTS", "ROLLOUT", "LOG_PROBS", "OLD_LOG_PROBS", "REF_LOG_PROBS", "VALUES", "SCORES", "ADVANTAGES",
    "CycleError", "NodeOrderError", "DuplicateNodeError", "MissingFieldError", "AmbiguousFieldError", "TypeMismatchError",
    "UnknownOpError", "OpKindError", "UnknownAttrError", "UndeclaredRoleError", "RoleKindError", "FrozenRoleUpdateError", "GroupSizeError",
    "DoubleUpdateError", "UpdateOrderError", "UnusedValueWarning",
]
