"""Tracing: calls on role handles and ``hybridflow.compute`` record nodes.

While an algorithm is built (see :mod:`hybridflow.graph.algorithm`), a
:class:`Tracer` is current. Each call checks the node it would add with the
same rules as :func:`hybridflow.graph.validate` (signature, field resolution,
dtypes and dims), appends it, and returns a :class:`Value` for its outputs,
so a mistake is reported at the line of the algorithm that makes it.

An op's inputs are resolved *by field name* from the union of the values
given to it: ``compute("gae", rollout, rewards, values)`` reads
``response_mask`` from ``rollout``, ``token_rewards`` from ``rewards`` and
``values`` from ``values``. A field found in none of them, or supplied by two
different producers, is an error naming the op, the field and the values.
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Iterable

from hybridflow_ops.registry import FieldSpec

from ..errors import TraceError
from . import dims as D
from .attrs import ComputeAttrs, GenerateAttrs, InferAttrs, LossTerm, NodeAttrs, ScoreAttrs, UpdateAttrs, is_scalar, make_params
from .errors import AmbiguousFieldError, MissingFieldError, UnknownAttrError
from .ir import Graph, GraphInput, Input, Node, Role
from .schema import Schema
from .signature import SCORE_FIELD, Signature, bind_inputs, node_signature, output_fields
from .values import Entry, LossSpec, Value

__all__ = ["Tracer", "RoleHandle", "compute", "current_tracer"]

_CURRENT: ContextVar["Tracer | None"] = ContextVar("hybridflow_tracer", default=None)


def current_tracer(what: str) -> "Tracer":
    tracer = _CURRENT.get()
    if tracer is None:
        raise TraceError(f"{what} can only be called inside an @hybridflow.algorithm function while it is built (Algorithm.build())")
    return tracer


def _describe(values: Iterable[Value]) -> str:
    return "; ".join(v.describe() for v in values) or "no values"


class Tracer:
    """Collects the nodes of one graph while its algorithm function runs."""

    def __init__(self, name: str, roles: dict[str, Role], inputs: tuple[GraphInput, ...]):
        self.name, self.roles, self.inputs = name, roles, inputs
        self.nodes: list[Node] = []
        self.resample: list = []
        """Dynamic-sampling regions closed so far (:mod:`.resampling`)."""
        self.resample_region = None
        """The open ``with hf.resample(...)`` block, if any."""
        self._token = None

    def __enter__(self) -> "Tracer":
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._token)

    def input_value(self, graph_input: GraphInput) -> Value:
        return Value(self, tuple(Entry(f, graph_input.name, f.name) for f in graph_input.schema))

    def graph(self, attrs: tuple) -> Graph:
        used = {n.role for n in self.nodes}
        roles = tuple(r for r in self.roles.values() if r.name in used)
        if self.resample_region is not None:
            raise TraceError("a with hf.resample(...) block is still open at the end of the algorithm")
        return Graph(name=self.name, roles=roles, inputs=self.inputs, nodes=tuple(self.nodes), attrs=attrs,
                     resample=tuple(self.resample))

    # -- recording ---------------------------------------------------------------------
    def _unique(self, base: str) -> str:
        taken = {n.name for n in self.nodes} | {i.name for i in self.inputs}
        name, k = base, 2
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        return name

    def _check_values(self, op: str, values: tuple) -> tuple[Value, ...]:
        for value in values:
            if not isinstance(value, Value):
                raise TraceError(f"{op}: expected traced values (what role calls and hybridflow.compute return), got {value!r}; "
                                 "pass attributes by keyword")
            if value.tracer is not self:
                raise TraceError(f"{op}: {value!r} comes from another build of an algorithm; values cannot be shared between graphs")
        return values

    def _resolve(self, node: str, op: str, sig: Signature, values: tuple[Value, ...]) -> tuple[tuple[Input, ...], dict[str, FieldSpec]]:
        inputs, given = [], {}
        for want in sig.inputs:
            found = {(e.source, e.field): e.spec for v in values for e in v.entries if e.spec.name == want.name}
            if not found:
                raise MissingFieldError(
                    f"op {op!r} needs field {want.name!r} ({want}), but none of the given values has it; given: {_describe(values)}",
                    node=node, field=want.name, hint=f"pass the value that carries {want.name!r}, or rename a field with value.rename(old={want.name!r})",
                )
            if len(found) > 1:
                sources = ", ".join(f"{s}.{f}" for s, f in found)
                raise AmbiguousFieldError(
                    f"op {op!r} could read field {want.name!r} from any of {sources}", node=node, field=want.name,
                    hint="pass only one value that carries it, or narrow a value with value.select(...)",
                )
            (source, field), spec = next(iter(found.items()))
            inputs.append(Input(want.name, source, field))
            given[want.name] = spec
        return tuple(inputs), given

    def _fresh(self, sig: Signature, bindings: dict[str, str], fields: tuple[FieldSpec, ...]) -> Schema:
        """Give each unbound output symbol (a new response length R) a name no earlier dim uses: R, R2, R3, ..."""
        used = {s for schema in [i.schema for i in self.inputs] + [n.outputs for n in self.nodes] for f in schema for d in f.dims for s in D.symbols(d)}
        fresh: dict[str, str] = {}
        for op_field in sig.outputs:
            for dim in op_field.dims:
                if D.is_symbol(dim) and dim not in bindings and dim not in fresh:
                    name, k = dim, 2
                    while name in used:
                        name, k = f"{dim}{k}", k + 1
                    fresh[dim] = name
                    used.add(name)
        return Schema(tuple(FieldSpec(f.name, f.dtype, tuple(D.substitute(d, fresh) for d in f.dims)) for f in fields))

    def record(self, base: str, kind: str, op: str, role: Role | None, attrs: NodeAttrs, values: tuple) -> Value:
        """Check and append one node; return the value of its outputs."""
        values = self._check_values(op, values)
        name = self._unique(base)
        sig = node_signature(name, kind, op, role, attrs)
        inputs, given = self._resolve(name, op, sig, values)
        bindings = bind_inputs(name, sig, given)
        outputs = self._fresh(sig, bindings, output_fields(sig, bindings))
        node = Node(name=name, kind=kind, role=role.name if role else "controller", op=op, inputs=inputs, outputs=outputs, attrs=attrs)
        self.nodes.append(node)
        return Value(self, tuple(Entry(f, name, f.name) for f in outputs))


class RoleHandle:
    """What an algorithm function receives for each role; its methods record model nodes."""

    def __init__(self, tracer: Tracer, role: Role):
        self._tracer, self.role = tracer, role

    def __repr__(self) -> str:
        return f"<role {self.role.name}: {self.role.kind}, {'trainable' if self.role.trainable else 'frozen'}>"

    def generate(self, prompts: Value, *, n: int = 1, greedy: bool = False, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
                 env: str | None = None, max_turns: int | None = None, max_tokens_per_turn: int | None = None,
                 max_total_tokens: int | None = None, observation_role: str | None = None) -> Value:
        """Sample ``n`` responses per prompt (a Rollout whose batch dim is the prompts' B times n); ``seed`` gives
        the node a sampling stream of its own (validation samples apart from training's).

        With ``env`` (a registered environment or ``'package.module:Class'``), each response is a multi-turn
        trajectory against the environment, within ``max_turns`` model turns of at most ``max_tokens_per_turn``
        tokens and ``max_total_tokens`` in all (``observation_role``: observations rendered as chat messages of
        that role by the tokenizer's template); the rollout then also has the AgentRollout fields
        (``turn_index``, ``num_turns``, ``env_reward``, ``tool_calls``, ``tool_errors``) and its
        ``response_mask`` is 1 on model tokens only."""
        attrs = GenerateAttrs(n=n, greedy=greedy, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              seed=seed, env=env, max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn,
                              max_total_tokens=max_total_tokens, observation_role=observation_role)
        base = f"{self.role.name}.generate" + ("_greedy" if greedy else "")
        return self._tracer.record(base, "generate", "generate", self.role, attrs, (prompts,))

    def logprob(self, rollout: Value) -> Value:
        """Per-token log-probs of the rollout: ``old_log_probs`` for a policy, ``ref_log_probs`` for a reference."""
        return self._tracer.record(f"{self.role.name}.logprob", "infer", "logprob", self.role, InferAttrs(), (rollout,))

    def values(self, rollout: Value) -> Value:
        """Per-token value estimates of a critic (``values``)."""
        return self._tracer.record(f"{self.role.name}.values", "infer", "values", self.role, InferAttrs(), (rollout,))

    def score(self, rollout: Value, *, as_: str | None = None) -> Value:
        """One float per response: ``scores`` (reward), ``costs`` (cost model), or the field named by ``as_``.

        The node is named ``ROLE.score``, or ``ROLE.FIELD`` when ``as_`` renames it (``reward.baseline_scores``).
        """
        attrs = ScoreAttrs(field=as_ or SCORE_FIELD.get(self.role.kind, "scores"))
        return self._tracer.record(f"{self.role.name}.{as_ or 'score'}", "score", "score", self.role, attrs, (rollout,))

    def update(self, *values: Value, loss: "str | LossSpec", **params: object) -> None:
        """One optimisation step of this role on ``loss``.

        ``loss`` is a loss op name (with its attributes as keywords:
        ``loss="ppo_clip", clip_ratio=0.2``) or a sum of ``hybridflow.loss(...)``
        terms. The loss's model inputs (log_probs, value_preds, entropy) come
        from the model being trained; its other inputs are resolved from
        ``values`` by field name, as in ``hybridflow.compute``.
        """
        if isinstance(loss, LossSpec):
            if params:
                raise TraceError(f"{self.role.name}.update: with loss=hybridflow.loss(...) terms, put attributes {sorted(params)} inside the terms")
            terms = loss.terms
        elif isinstance(loss, str):
            terms = (LossTerm(op=loss, params=make_params(params, f"loss {loss!r}")),)
        else:
            raise TraceError(f"{self.role.name}.update: loss must be a loss op name or hybridflow.loss(...) terms, got {loss!r}")
        self._tracer.record(f"{self.role.name}.update", "update", "update", self.role, UpdateAttrs(terms), values)


def compute(op: str, *values: Value, **attrs: object) -> Value:
    """Record a compute node running registered op ``op`` on the controller.

    Its input fields are resolved by name from the union of ``values``;
    ``attrs`` are the op's keyword hyper-parameters (JSON scalars).
    """
    tracer = current_tracer("hybridflow.compute")
    if not isinstance(op, str):
        raise TraceError(f"hybridflow.compute: the first argument is the op name, got {op!r}")
    for key, value in attrs.items():
        if not is_scalar(value):
            raise UnknownAttrError(f"op {op!r}: attribute {key}={value!r} is not a JSON scalar", field=key,
                                   hint="pass values positionally and attributes as None, bool, int, finite float or str")
    return tracer.record(op, "compute", op, None, ComputeAttrs(make_params(attrs, f"op {op!r}")), values)
