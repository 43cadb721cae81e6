"""Typed attribute records, one per node kind.

Attributes are frozen records, not dicts: a generate node carries
:class:`GenerateAttrs`, an update node :class:`UpdateAttrs`, and so on. Op
hyper-parameters (which differ per op) are a sorted tuple of ``(name, value)``
pairs whose values are JSON scalars (None, bool, int, finite float, str), so
every graph has an exact JSON form.

``ATTRS_BY_KIND`` maps a node kind to its record type; ``attrs_to_dict`` and
``attrs_from_dict`` are the JSON form shared by the JSON and text writers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping, Union

from ..errors import GraphError

__all__ = [
    "Scalar", "Params", "is_scalar", "make_params",
    "GenerateAttrs", "AGENT_ATTRS", "InferAttrs", "ScoreAttrs", "ComputeAttrs", "LossTerm", "UpdateAttrs",
    "NodeAttrs", "ATTRS_BY_KIND", "attrs_to_dict", "attrs_from_dict",
]

Scalar = Union[None, bool, int, float, str]
Params = tuple[tuple[str, Scalar], ...]


def is_scalar(value: object) -> bool:
    """JSON scalars only; floats must be finite (``nan != nan`` would break record equality)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int, str))


def make_params(values: Mapping[str, object], where: str) -> Params:
    """Check and sort hyper-parameters into a ``((name, value), ...)`` tuple."""
    for name, value in values.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(f"{where}: attribute name {name!r} is not an identifier")
        if not is_scalar(value):
            raise GraphError(
                f"{where}: attribute {name}={value!r} is not a JSON scalar; "
                "use None, a bool, an int, a finite float or a str (write None for 'no limit')"
            )
    return tuple(sorted(values.items()))  # type: ignore[arg-type]


def _params_of(record: Any, name: str) -> Params:
    params = getattr(record, name)
    if not isinstance(params, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in params):
        raise GraphError(f"{type(record).__name__}.{name} must be a tuple of (name, value) pairs, got {params!r}")
    return make_params(dict(params), type(record).__name__)


@dataclass(frozen=True)
class GenerateAttrs:
    """Sampling settings of a generate node; None means "as configured for the rollout engine"."""

    n: int = 1
    """Responses sampled per prompt: the rollout's batch dim is the prompts' B times n."""
    greedy: bool = False
    """Decode greedily (argmax) instead of sampling; used for ReMax's baseline."""
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    """Seed of this node's sampling stream (continued across iterations); None: the rollout engine's own."""
    env: str | None = None
    """A multi-turn rollout against this environment (a registered name or 'package.module:Class'); None: one turn."""
    max_turns: int | None = None
    """Model turns per trajectory at most (env only; None: the engine's default)."""
    max_tokens_per_turn: int | None = None
    """Tokens one model turn may sample (env only)."""
    max_total_tokens: int | None = None
    """Tokens of a whole trajectory, model and observation tokens together (env only): the rollout's R."""
    observation_role: str | None = None
    """env only: render each observation with the tokenizer's chat template as a message of this role
    ('user', 'tool'); None: append its text as it is."""

    def __post_init__(self) -> None:
        self._check_agent()
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise GraphError(f"GenerateAttrs.n must be a positive int, got {self.n!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise GraphError(f"GenerateAttrs.seed must be an int or None, got {self.seed!r}")
        if not isinstance(self.greedy, bool):
            raise GraphError(f"GenerateAttrs.greedy must be a bool, got {self.greedy!r}")
        if self.max_new_tokens is not None and (isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1):
            raise GraphError(f"GenerateAttrs.max_new_tokens must be a positive int or None, got {self.max_new_tokens!r}")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not is_scalar(value) or value < 0):
                raise GraphError(f"GenerateAttrs.{name} must be a non-negative number or None, got {value!r}")


    def _check_agent(self) -> None:
        budgets = ("max_turns", "max_tokens_per_turn", "max_total_tokens")
        if self.env is None:
            given = [name for name in budgets + ("observation_role",) if getattr(self, name) is not None]
            if given:
                raise GraphError(f"GenerateAttrs: {', '.join(given)} apply to a multi-turn rollout only; give env=...")
            return
        if not isinstance(self.env, str) or not self.env.strip():
            raise GraphError(f"GenerateAttrs.env must be an environment name or 'module:Class', got {self.env!r}")
        if self.observation_role is not None and (not isinstance(self.observation_role, str) or not self.observation_role):
            raise GraphError(f"GenerateAttrs.observation_role must be a chat role or None, got {self.observation_role!r}")
        for name in budgets:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise GraphError(f"GenerateAttrs.{name} must be a positive int or None, got {value!r}")

    @property
    def agent(self) -> dict[str, object] | None:
        """The multi-turn settings given (``env`` and the budgets that are not None), or None for one turn."""
        if self.env is None:
            return None
        return {name: getattr(self, name) for name in AGENT_ATTRS if getattr(self, name) is not None}


AGENT_ATTRS = ("env", "max_turns", "max_tokens_per_turn", "max_total_tokens", "observation_role")
"""The generate attributes of a multi-turn rollout; absent from the JSON form of a one-turn node."""


@dataclass(frozen=True)
class InferAttrs:
    """An infer node (log-probs, values) has no attributes yet; the record keeps the IR uniform."""


@dataclass(frozen=True)
class ScoreAttrs:
    """A score node writes one float per response into ``field`` (``scores``, ``costs``, ``baseline_scores``)."""

    field: str = "scores"

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field.isidentifier():
            raise GraphError(f"ScoreAttrs.field must be an identifier, got {self.field!r}")


@dataclass(frozen=True)
class ComputeAttrs:
    """Hyper-parameters passed to a compute op as keyword arguments."""

    params: Params = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _params_of(self, "params"))


@dataclass(frozen=True)
class LossTerm:
    """One term ``weight * op(model_inputs, inputs; **params)`` of an update's loss."""

    op: str
    weight: float = 1.0
    params: Params = ()

    def __post_init__(self) -> None:
        if not isinstance(self.op, str) or not self.op:
            raise GraphError(f"LossTerm.op must be a loss op name, got {self.op!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not is_scalar(self.weight):
            raise GraphError(f"loss term {self.op!r}: weight must be a finite number, got {self.weight!r}")
        object.__setattr__(self, "weight", float(self.weight))
        object.__setattr__(self, "params", _params_of(self, "params"))
        if "coef" in dict(self.params):
            raise GraphError(f"loss term {self.op!r}: a term is scaled by its weight, not by a coef parameter; write "
                             f"hf.loss({self.op!r}, weight={dict(self.params)['coef']!r}, ...) (the update's loss is "
                             "sum(weight * op(...)) over its terms)")


@dataclass(frozen=True)
class UpdateAttrs:
    """The loss of an update node: the weighted sum of its terms."""

    terms: tuple[LossTerm, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.terms, tuple) or not self.terms or not all(isinstance(t, LossTerm) for t in self.terms):
            raise GraphError(f"UpdateAttrs.terms must be a non-empty tuple of LossTerm, got {self.terms!r}")


NodeAttrs = Union[GenerateAttrs, InferAttrs, ScoreAttrs, ComputeAttrs, UpdateAttrs]

ATTRS_BY_KIND: dict[str, type] = {
    "generate": GenerateAttrs,
    "infer": InferAttrs,
    "score": ScoreAttrs,
    "compute": ComputeAttrs,
    "update": UpdateAttrs,
}


def attrs_to_dict(attrs: NodeAttrs) -> dict[str, Any]:
    """The JSON form of an attribute record."""
    if isinstance(attrs, ComputeAttrs):
        return dict(attrs.params)
    if isinstance(attrs, UpdateAttrs):
        return {"terms": [{"op": t.op, "weight": t.weight, "params": dict(t.params)} for t in attrs.terms]}
    data = {f.name: getattr(attrs, f.name) for f in fields(attrs)}
    if isinstance(attrs, GenerateAttrs) and attrs.env is None:
        for name in AGENT_ATTRS:
            del data[name]
    return data


def _term_from_dict(data: object, where: str) -> LossTerm:
    if not isinstance(data, dict) or set(data) - {"op", "weight", "params"} or "op" not in data:
        raise GraphError(f"{where}: a loss term is an object {{op, weight, params}}, got {data!r}")
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise GraphError(f"{where}: loss term params must be an object, got {params!r}")
    return LossTerm(op=data["op"], weight=data.get("weight", 1.0), params=make_params(params, where))


def attrs_from_dict(kind: str, data: object, where: str) -> NodeAttrs:
    """Read the JSON form of the attribute record of a node of ``kind``; GraphError if malformed."""
    if kind not in ATTRS_BY_KIND:
        raise GraphError(f"{where}: unknown node kind {kind!r}; use one of {', '.join(ATTRS_BY_KIND)}")
    if not isinstance(data, dict):
        raise GraphError(f"{where}: attrs must be a JSON object, got {data!r}")
    if kind == "compute":
        return ComputeAttrs(make_params(data, where))
    if kind == "update":
        terms = data.get("terms")
        if set(data) != {"terms"} or not isinstance(terms, list):
            raise GraphError(f"{where}: update attrs are {{\"terms\": [...]}}, got {data!r}")
        return UpdateAttrs(tuple(_term_from_dict(t, where) for t in terms))
    record = ATTRS_BY_KIND[kind]
    known = {f.name for f in fields(record)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise GraphError(f"{where}: {kind} attrs take {', '.join(sorted(known)) or 'nothing'}, not {', '.join(map(str, unknown))}")
    return record(**data)
