"""What the DSL's calls return: traced values, and loss specifications.

A :class:`Value` stands for a batch that a node will produce when the graph
runs. It remembers, for each field it exposes, which producer and which of
the producer's fields supplies it, so ``hybridflow.compute`` can resolve an
op's inputs by field name. Values carry no data: using one as a bool, or
iterating over it, is a :class:`TraceError` (data-dependent control flow
cannot be traced; branch on algorithm attributes instead).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridflow_ops.registry import FieldSpec

from ..errors import TraceError
from .attrs import LossTerm, make_params
from .schema import Schema

if TYPE_CHECKING:
    from .trace import Tracer

__all__ = ["Value", "Entry", "LossSpec", "loss"]


@dataclass(frozen=True)
class Entry:
    """One field of a value: its spec (under the name the value exposes) and where it comes from."""

    spec: FieldSpec
    source: str
    field: str


class Value:
    """A traced batch: named, typed fields, each read from a producer's field."""

    __slots__ = ("_tracer", "_entries")

    def __init__(self, tracer: "Tracer", entries: tuple[Entry, ...]):
        self._tracer = tracer
        self._entries = entries
        Schema(tuple(e.spec for e in entries))  # distinct names

    @property
    def tracer(self) -> "Tracer":
        """The tracer (one build of an algorithm) that made this value."""
        return self._tracer

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Each field with the producer (node or graph input) and producer field it is read from."""
        return self._entries

    @property
    def fields(self) -> Schema:
        """The fields this value exposes."""
        return Schema(tuple(e.spec for e in self._entries))

    @property
    def producers(self) -> tuple[str, ...]:
        """The nodes (or graph inputs) whose outputs this value exposes."""
        return tuple(dict.fromkeys(e.source for e in self._entries))

    def rename(self, **mapping: str) -> "Value":
        """The same fields with some renamed: ``costs.rename(costs="scores")`` feeds an op that reads ``scores``."""
        unknown = sorted(set(mapping) - set(self.fields.names))
        if unknown:
            raise TraceError(f"cannot rename {', '.join(unknown)}: {self!r} has no such field; it has {', '.join(self.fields.names)}")
        entries = tuple(Entry(FieldSpec(mapping.get(e.spec.name, e.spec.name), e.spec.dtype, e.spec.dims), e.source, e.field) for e in self._entries)
        try:
            return Value(self._tracer, entries)
        except Exception as err:  # duplicate names after renaming
            raise TraceError(f"renaming {mapping} in {self!r}: {err}") from None

    def select(self, *names: str) -> "Value":
        """A value exposing only ``names``: ``rollout.select("response_mask")``."""
        unknown = [n for n in names if n not in self.fields]
        if unknown:
            raise TraceError(f"cannot select {', '.join(unknown)}: {self!r} has no such field; it has {', '.join(self.fields.names)}")
        return Value(self._tracer, tuple(e for e in self._entries if e.spec.name in names))

    def describe(self) -> str:
        """``actor.generate(prompt_ids, prompt_mask, ...)``."""
        return " + ".join(f"{p}({', '.join(e.spec.name for e in self._entries if e.source == p)})" for p in self.producers)

    def __repr__(self) -> str:
        return f"<Value {self.describe()}>"

    def __bool__(self) -> bool:
        raise TraceError(
            f"{self!r} has no data while the algorithm is traced, so it cannot decide an if/while; "
            "branch on an algorithm attribute instead, or compute the choice in an op"
        )

    def __iter__(self):
        raise TraceError(f"{self!r} is one batch value and cannot be unpacked or iterated; use value.select(...) to pick fields")


@dataclass(frozen=True)
class LossSpec:
    """The loss of an update: a weighted sum of loss-op terms. Add specs with ``+``."""

    terms: tuple[LossTerm, ...]

    def __add__(self, other: "LossSpec") -> "LossSpec":
        if not isinstance(other, LossSpec):
            raise TraceError(f"can only add hybridflow.loss(...) terms together, not {other!r}")
        return LossSpec(self.terms + other.terms)


def loss(op: str, weight: float = 1.0, **params: object) -> LossSpec:
    """One loss term: ``hybridflow.loss("kl_loss", weight=0.001, kl_type="low_var_kl")``.

    The op is a registered loss op; ``params`` are its keyword attributes
    (checked when the update is traced). Sum terms with ``+``.
    """
    return LossSpec((LossTerm(op=op, weight=weight, params=make_params(params, f"loss {op!r}")),))
