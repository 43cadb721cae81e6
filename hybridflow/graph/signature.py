"""What a node reads and writes: its typed signature, and the type check.

The signature of a node follows from its kind, op, role and attributes alone:

* model ops (generate, logprob, values, score, update) from the table
  :data:`MODEL_OPS` below; nodes that run a model over responses (logprob,
  values, score, update) read the sequence fields ``prompt_ids``,
  ``prompt_mask``, ``response_ids``, ``response_mask`` explicitly, and an
  update reads the inputs of its loss terms besides (their ``model_inputs``,
  e.g. ``log_probs``, are computed by the model during the update);
* compute ops and loss terms from :mod:`hybridflow_ops.registry`.

:func:`node_signature` builds it (rejecting unknown ops, wrong op kinds,
unknown attributes, roles that cannot run the node); :func:`bind_inputs`
checks the fields a node is given against it (dtype, and dims by
unification, see :mod:`hybridflow.graph.dims`); :func:`output_fields`
substitutes the bindings into the declared outputs. The tracer and the
validator share these three functions, so a traced graph and a loaded one are
checked by the same rules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from hybridflow_ops.registry import FieldSpec, OpSpec, get_op, has_op

from . import dims as D
from .attrs import ComputeAttrs, GenerateAttrs, NodeAttrs, ScoreAttrs, UpdateAttrs
from .errors import (
    FrozenRoleUpdateError, MissingFieldError, OpKindError, RoleKindError, TypeMismatchError,
    UnknownAttrError, UnknownOpError,
)
from .ir import CONTROLLER, Role
from .schema import AGENT_ROLLOUT, LOG_PROBS, PROMPTS, ROLLOUT, VALUES, parse_field

__all__ = [
    "ModelOp", "MODEL_OPS", "LOGPROB_FIELD", "SCORE_FIELD", "MODEL_PROVIDES",
    "Signature", "node_signature", "bind_inputs", "output_fields",
]


@dataclass(frozen=True)
class ModelOp:
    """A node op that runs on a model's workers rather than on the controller."""

    kind: str
    """The node kind that runs this op."""
    role_kinds: tuple[str, ...]
    """The role kinds that can run it."""
    inputs: tuple[FieldSpec, ...]
    outputs: Callable[[Role, NodeAttrs], tuple[FieldSpec, ...]]
    """Declared outputs, from the role and the node's attributes."""


def _with_batch(spec: FieldSpec, batch: str) -> FieldSpec:
    return FieldSpec(spec.name, spec.dtype, (batch,) + spec.dims[1:] if spec.dims[:1] == ("B",) else spec.dims)


_SEQUENCE = tuple(ROLLOUT.get(n) for n in ("prompt_ids", "prompt_mask", "response_ids", "response_mask"))

LOGPROB_FIELD = {kind: schema.fields[0] for kind, schema in LOG_PROBS.items()}
"""Which log-prob field a role kind's ``logprob`` writes."""

SCORE_FIELD = {"reward": "scores", "cost": "costs"}
"""The default field a role kind's ``score`` writes (``ScoreAttrs.field`` may rename it)."""

MODEL_PROVIDES = {"policy": ("log_probs", "entropy"), "critic": ("value_preds",)}
"""The loss ``model_inputs`` each trainable role kind computes inside an update."""

def _rollout_fields(role: Role, attrs: NodeAttrs) -> tuple[FieldSpec, ...]:
    """A rollout; one with an environment (``env=``) adds its turns, rewards and tool counts (AGENT_ROLLOUT)."""
    fields = ROLLOUT.fields + (AGENT_ROLLOUT.fields if getattr(attrs, "env", None) else ())
    return tuple(_with_batch(f, "B*n") for f in fields)


MODEL_OPS: dict[str, ModelOp] = {
    "generate": ModelOp("generate", ("policy",), PROMPTS.fields, _rollout_fields),
    "logprob": ModelOp("infer", ("policy", "reference"), _SEQUENCE,
                       lambda role, attrs: (LOGPROB_FIELD[role.kind],)),
    "values": ModelOp("infer", ("critic",), _SEQUENCE, lambda role, attrs: VALUES.fields),
    "score": ModelOp("score", ("reward", "cost"), _SEQUENCE,
                     lambda role, attrs: (parse_field(f"{attrs.field}: float32[B]"),)),  # type: ignore[union-attr]
    "update": ModelOp("update", ("policy", "critic"), (), lambda role, attrs: ()),
}


@dataclass(frozen=True)
class Signature:
    inputs: tuple[FieldSpec, ...]
    outputs: tuple[FieldSpec, ...]
    bindings: Mapping[str, str] = field(default_factory=dict)
    """Dims fixed by attributes before any input is seen (``n`` of generate)."""


def _registered(node: str, op: str, kind: str, expected: str, hint: str) -> OpSpec:
    if not has_op(op):
        raise UnknownOpError(
            f"op {op!r} is not registered", node=node,
            hint="check the spelling, import the module that registers it, or register it with @hybridflow.register_op",
        )
    spec = get_op(op)
    if spec.kind != expected:
        raise OpKindError(f"op {op!r} is a {spec.kind} op; a {kind} node needs a {expected} op", node=node, hint=hint)
    return spec


def _check_params(node: str, spec: OpSpec, params: tuple[tuple[str, object], ...]) -> None:
    unknown = [name for name, _ in params if name not in spec.attrs]
    if unknown:
        raise UnknownAttrError(
            f"op {spec.name!r} takes no attribute {', '.join(map(repr, unknown))}", node=node,
            hint=f"its attributes are: {', '.join(spec.attrs) or '(none)'}",
        )


def _update_inputs(node: str, role: Role, attrs: UpdateAttrs) -> tuple[FieldSpec, ...]:
    """The sequences the trained model runs over, then the union of the loss terms' inputs."""
    merged: dict[str, FieldSpec] = {f.name: f for f in _SEQUENCE}
    for term in attrs.terms:
        spec = _registered(node, term.op, "update", "loss", "an update's terms must be loss ops (ppo_clip, kl_loss, value_clip, ...)")
        _check_params(node, spec, term.params)
        for needed in spec.model_inputs:
            if needed.name not in MODEL_PROVIDES.get(role.kind, ()):
                raise RoleKindError(
                    f"loss {term.op!r} needs {needed.name!r} from the model being trained, which a {role.kind} role "
                    f"({role.name!r}) does not compute", node=node, field=needed.name,
                    hint=f"a {role.kind} provides {', '.join(MODEL_PROVIDES.get(role.kind, ())) or 'nothing'}; use this loss on another role",
                )
        for spec_field in spec.inputs:
            seen = merged.setdefault(spec_field.name, spec_field)
            if seen != spec_field:
                raise TypeMismatchError(f"loss terms disagree on field {spec_field.name!r}: {seen} vs {spec_field}", node=node, field=spec_field.name)
    return tuple(merged.values())


def node_signature(node: str, kind: str, op: str, role: Role | None, attrs: NodeAttrs) -> Signature:
    """The typed signature of a node; raises if the op, role or attributes do not fit."""
    if kind == "compute":
        if role is not None:
            raise RoleKindError(f"compute nodes run on the {CONTROLLER}, not on role {role.name!r}", node=node, hint=f"set the node's role to {CONTROLLER!r}")
        spec = _registered(node, op, kind, "compute", "loss ops go into an update's loss=..., not into compute")
        _check_params(node, spec, attrs.params)  # type: ignore[union-attr]
        return Signature(spec.inputs, spec.outputs)
    model_op = MODEL_OPS.get(op)
    if model_op is None or model_op.kind != kind:
        valid = [name for name, m in MODEL_OPS.items() if m.kind == kind]
        raise UnknownOpError(f"a {kind} node cannot run op {op!r}", node=node, hint=f"a {kind} node runs {' or '.join(valid)}")
    if role is None:
        raise RoleKindError(f"a {kind} node runs on a model role, not on the {CONTROLLER}", node=node, hint="set the node's role to one of the graph's roles")
    if kind == "update" and not role.trainable:
        raise FrozenRoleUpdateError(
            f"role {role.name!r} ({role.kind}) is declared frozen and cannot be updated", node=node,
            hint=f"remove the update of {role.name!r}, or declare the role trainable",
        )
    if role.kind not in model_op.role_kinds:
        raise RoleKindError(
            f"role {role.name!r} is a {role.kind} model; op {op!r} runs on {' or '.join(model_op.role_kinds)} roles", node=node,
            hint=f"run {op!r} on a role of kind {' or '.join(model_op.role_kinds)}",
        )
    if kind == "update":
        return Signature(_update_inputs(node, role, attrs), ())  # type: ignore[arg-type]
    bindings = {"n": str(attrs.n)} if isinstance(attrs, GenerateAttrs) else {}
    return Signature(model_op.inputs, model_op.outputs(role, attrs), bindings)


def bind_inputs(node: str, sig: Signature, given: Mapping[str, FieldSpec]) -> dict[str, str]:
    """Check the fields a node is given against its signature; return the dim bindings.

    ``given`` maps each input name to the producer's field spec. Every declared
    input must be present, with the declared dtype and rank, and dims that
    unify consistently across all inputs (the same ``B`` everywhere).
    """
    bindings = dict(sig.bindings)
    origin: dict[str, str] = {}
    for want in sig.inputs:
        have = given.get(want.name)
        if have is None:
            raise MissingFieldError(f"needs field {want.name!r} ({want}), which it is not given", node=node, field=want.name,
                                    hint="pass a value that carries it (or rename one with value.rename(...))")
        if have.dtype != want.dtype or len(have.dims) != len(want.dims):
            raise TypeMismatchError(f"expects {want} but is given {have}", node=node, field=want.name,
                                    hint="pass a field of the declared dtype and rank, or convert it with a compute op")
        for declared, actual in zip(want.dims, have.dims):
            before = dict(bindings)
            expected = D.unify(declared, actual, bindings)
            if expected is not None:
                first = origin.get(declared, "its declaration")
                raise TypeMismatchError(
                    f"dim {declared!r} is {actual!r} in field {want.name!r} but {expected!r} in {first}", node=node, field=want.name,
                    hint="values of different batch sizes cannot be mixed (e.g. n responses per prompt vs one); make their dims agree",
                )
            origin.update((s, f"field {want.name!r}") for s in bindings if s not in before)
    return bindings


def output_fields(sig: Signature, bindings: Mapping[str, str]) -> tuple[FieldSpec, ...]:
    """Declared outputs with bound dims substituted; unbound symbols (a new ``R``) stay as they are."""
    return tuple(FieldSpec(f.name, f.dtype, tuple(D.substitute(d, bindings) for d in f.dims)) for f in sig.outputs)
