"""One registry of RL operators, keyed by name.

Every op in :mod:`hybridflow_ops` is a pure function of tensors. Registering it
records which *fields* it reads and writes, each with a dtype and symbolic dims
(``"advantages: float32[B, R]"``), so that the graph layer can type-check
``compute`` and ``update`` nodes without running anything.

An op's positional parameters correspond, in order, to ``model_inputs`` (fields
the model under training produces inside an update: ``log_probs``,
``value_preds``, ``entropy``) followed by ``inputs`` (fields read from graph
values). Trailing positional parameters that default to ``None`` are optional tensors:
one function may be registered twice, once without them and once (under another name)
declaring them, e.g. ``gspo`` and ``gspo_is`` (:mod:`hybridflow_ops.losses.is_weighted`). Its keyword-only parameters are its hyper-parameters (``attrs``). Its
result is a named tuple whose first ``len(outputs)`` entries are the outputs in
order; loss ops return ``loss`` first and may add scalar metrics after it.

This module imports nothing from ``hybridflow``.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Callable, Iterator

__all__ = [
    "FieldSpec",
    "OpSpec",
    "OpRegistryError",
    "register_op",
    "get_op",
    "has_op",
    "list_ops",
    "unregister_op",
]

OP_KINDS = ("compute", "loss", "reward")
DTYPES = ("float32", "float64", "bfloat16", "float16", "int64", "int32", "bool", "str", "object")

_FIELD_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([A-Za-z0-9_]+)\s*(?:\[([^\]]*)\])?\s*$")
_DIM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\s*\*\s*[A-Za-z0-9_]+)*$|^[0-9]+$")


class OpRegistryError(ValueError):
    """A malformed field declaration, a duplicate op name, or an unknown op."""


@dataclass(frozen=True)
class FieldSpec:
    """A named, typed field of a batch: ``name: dtype[dim, ...]``.

    Dims are symbols (``B``, ``R``), integers, or products (``B*n``). A
    field with no dims is a scalar per batch.
    """

    name: str
    dtype: str
    dims: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: "str | FieldSpec") -> "FieldSpec":
        """Parse ``"advantages: float32[B, R]"``; a FieldSpec passes through."""
        if isinstance(text, FieldSpec):
            return text
        if not isinstance(text, str):
            raise OpRegistryError(f"field declaration must be a string like 'scores: float32[B]', got {text!r}")
        match = _FIELD_RE.match(text)
        if not match:
            raise OpRegistryError(
                f"cannot parse field declaration {text!r}; write it as 'name: dtype[dim, ...]', "
                "e.g. 'advantages: float32[B, R]'"
            )
        name, dtype, dims_text = match.groups()
        if dtype not in DTYPES:
            raise OpRegistryError(f"field {name!r} has unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        dims: tuple[str, ...] = ()
        if dims_text is not None and dims_text.strip():
            dims = tuple(re.sub(r"\s+", "", d) for d in dims_text.split(","))
            for dim in dims:
                if not _DIM_RE.match(dim):
                    raise OpRegistryError(f"field {name!r} has a malformed dim {dim!r}; use a symbol, an integer or a product like 'B*n'")
        return cls(name=name, dtype=dtype, dims=dims)

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(self.dims)}]" if self.dims else f"{self.name}: {self.dtype}"


@dataclass(frozen=True)
class OpSpec:
    """What the registry knows of one op."""

    name: str
    fn: Callable
    kind: str
    inputs: tuple[FieldSpec, ...]
    outputs: tuple[FieldSpec, ...]
    model_inputs: tuple[FieldSpec, ...] = ()
    attrs: tuple[str, ...] = ()
    attr_defaults: tuple[tuple[str, object], ...] = ()
    doc: str = ""
    vanishes_with: str | None = None
    """Loss ops: an input field such that a row whose values are all zero there adds exactly
    zero loss and zero gradient (e.g. ``advantages`` for the PPO surrogate). Engines may skip
    the forward/backward of such rows, keeping the global token/sequence counts."""
    finite_outputs: tuple[str, ...] = ()
    """Outputs that must hold only finite values (no NaN, no inf); the runtime's contract
    checks raise when one does not. By default every floating-point output."""
    correction: str | None = None
    """An off-policy correction: one line saying what it corrects with (``"token-level truncated importance
    weights"``). Compute corrections turn the rollout's log-probs into weights or masks; a loss correction
    applies them. A policy-gradient loss that reads lagged data (a plan with staleness) must read a value
    computed by a compute correction (:mod:`hybridflow.graph.staleness`)."""
    rollout_input: str | None = None
    """Corrections: the input that must be the behaviour policy's log-probs, read from the rollout node
    that sampled the responses (``rollout_log_probs``)."""
    behaviour_output: str | None = None
    """Compute corrections whose output *is* the behaviour policy's log-probs (``old_log_probs_from_rollout``):
    they correct nothing by themselves, only through a loss whose importance ratio is taken against that
    value (its :attr:`ratio_input`); :mod:`hybridflow.graph.staleness` checks the pairing."""
    ratio_input: str | None = None
    """Policy-gradient losses: the input ``x`` of the ratio ``pi_theta / pi_x`` that weights the gradient
    (``old_log_probs`` for PPO, GSPO, GMPO, CISPO, ...). When ``x`` holds the behaviour policy's log-probs
    the ratio is itself the importance weight of the sampled tokens (verl's "bypass mode")."""

    @property
    def policy_gradient(self) -> bool:
        """A loss whose gradient is an expectation over responses sampled from the policy it trains: it reads
        the trained model's ``log_probs`` and the ``advantages``. On lagged samples it needs a correction."""
        return self.kind == "loss" and "log_probs" in {f.name for f in self.model_inputs} and "advantages" in self.input_names

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.outputs)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


_REGISTRY: dict[str, OpSpec] = {}


def _keyword_attrs(fn: Callable, n_positional: int, name: str) -> tuple[tuple[str, ...], tuple[tuple[str, object], ...]]:
    sig = inspect.signature(fn)
    positional = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    optional_ok = all(p.default is None for p in positional[len(required):]) and positional[:len(required)] == required
    if not (len(required) <= n_positional <= len(positional)) or not optional_ok:
        raise OpRegistryError(
            f"op {name!r}: the function takes {len(positional)} positional tensors "
            f"({', '.join(p.name for p in positional)}) but {n_positional} fields were declared; "
            "declare one field per positional parameter, in order (model_inputs first); trailing positional "
            "tensors that default to None may be left undeclared (the op is then called without them)"
        )
    kw = [p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]
    defaults = tuple((p.name, p.default) for p in kw if p.default is not p.empty)
    return tuple(p.name for p in kw), defaults


_FLOAT_DTYPES = ("float32", "float64", "bfloat16", "float16")


def _finite_outputs(name: str, finite: object, outputs: tuple[FieldSpec, ...]) -> tuple[str, ...]:
    if finite is True:
        return tuple(f.name for f in outputs if f.dtype in _FLOAT_DTYPES)
    if finite is False:
        return ()
    names = {f.name for f in outputs}
    if not isinstance(finite, tuple) or not all(isinstance(n, str) and n in names for n in finite):
        raise OpRegistryError(f"op {name!r}: finite={finite!r} must be True, False or a tuple of its output names "
                              f"({', '.join(sorted(names))})")
    return finite


def _same_definition(old: Callable, new: Callable) -> bool:
    """Whether ``new`` is ``old`` defined again: the same function of the same module, imported a second
    time (``importlib.reload`` in a notebook, or a module dropped from ``sys.modules`` and imported again)."""
    return (getattr(old, "__module__", None), getattr(old, "__qualname__", None)) == \
        (getattr(new, "__module__", None), getattr(new, "__qualname__", None))


def register_op(
    name: str,
    *,
    inputs: tuple = (),
    outputs: tuple = (),
    model_inputs: tuple = (),
    kind: str = "compute",
    replace: bool = False,
    vanishes_with: str | None = None,
    finite: bool | tuple[str, ...] = True,
    correction: str | None = None,
    rollout_input: str | None = None,
    behaviour_output: str | None = None,
    ratio_input: str | None = None,
) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn`` under ``name`` with its typed fields.

    ``finite`` says which outputs must hold only finite values: True (the default) every
    floating-point output, False none, or a tuple of output names.
    ``correction`` marks an off-policy correction (a one-line description) and ``rollout_input`` names the
    input that must be the rollout's own log-probs (see :attr:`OpSpec.correction`).
    ``behaviour_output`` and ``ratio_input`` pair a correction that passes the behaviour log-probs through
    with the losses whose ratio reads them (see :attr:`OpSpec.behaviour_output`). A name already taken is an
    OpRegistryError unless ``replace``, or unless it is the same function of the same module
    registering again (a reloaded module replaces its own ops).

    >>> @register_op("my_adv", inputs=("scores: float32[B]",), outputs=("advantages: float32[B]",))
    ... def my_adv(scores, *, scale=1.0): ...
    """
    if kind not in OP_KINDS:
        raise OpRegistryError(f"op {name!r}: kind must be one of {OP_KINDS}, got {kind!r}")
    in_specs = tuple(FieldSpec.parse(f) for f in inputs)
    out_specs = tuple(FieldSpec.parse(f) for f in outputs)
    model_specs = tuple(FieldSpec.parse(f) for f in model_inputs)
    if not out_specs:
        raise OpRegistryError(f"op {name!r} declares no outputs; every op must produce at least one field")
    if vanishes_with is not None and vanishes_with not in {f.name for f in in_specs}:
        raise OpRegistryError(f"op {name!r}: vanishes_with={vanishes_with!r} must name one of its inputs "
                              f"({', '.join(f.name for f in in_specs)})")
    finite_outputs = _finite_outputs(name, finite, out_specs)
    if rollout_input is not None and (correction is None or rollout_input not in {f.name for f in in_specs}):
        raise OpRegistryError(f"op {name!r}: rollout_input={rollout_input!r} must name one of its inputs "
                              f"({', '.join(f.name for f in in_specs)}) and come with correction='...'")

    if behaviour_output is not None and (correction is None or behaviour_output not in {f.name for f in out_specs}):
        raise OpRegistryError(f"op {name!r}: behaviour_output={behaviour_output!r} must name one of its outputs "
                              f"({', '.join(f.name for f in out_specs)}) and come with correction='...'")
    if ratio_input is not None and (kind != "loss" or ratio_input not in {f.name for f in in_specs}):
        raise OpRegistryError(f"op {name!r}: ratio_input={ratio_input!r} must name one of the inputs of a loss op "
                              f"({', '.join(f.name for f in in_specs)})")

    def decorate(fn: Callable) -> Callable:
        if name in _REGISTRY and not replace and not _same_definition(_REGISTRY[name].fn, fn):
            raise OpRegistryError(f"op {name!r} is already registered (by {_REGISTRY[name].fn.__module__}); pick another name or pass replace=True")
        attrs, defaults = _keyword_attrs(fn, len(model_specs) + len(in_specs), name)
        if kind == "loss" and "coef" in attrs:
            raise OpRegistryError(f"loss op {name!r} takes a 'coef' attribute; a loss term is scaled by its weight "
                                  f"(hf.loss({name!r}, weight=...)), so drop coef from the op and return the unscaled loss")
        _REGISTRY[name] = OpSpec(
            name=name, fn=fn, kind=kind, inputs=in_specs, outputs=out_specs,
            model_inputs=model_specs, attrs=attrs, attr_defaults=defaults,
            doc=inspect.getdoc(fn) or "", vanishes_with=vanishes_with, finite_outputs=finite_outputs,
            correction=correction, rollout_input=rollout_input, behaviour_output=behaviour_output,
            ratio_input=ratio_input,
        )
        return fn

    return decorate


def get_op(name: str) -> OpSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise OpRegistryError(f"unknown op {name!r}; registered ops are: {known}. Register your own with @hybridflow_ops.register_op") from None


def has_op(name: str) -> bool:
    return name in _REGISTRY


def unregister_op(name: str) -> None:
    _REGISTRY.pop(name, None)


def list_ops(kind: str | None = None) -> Iterator[OpSpec]:
    return iter(sorted((s for s in _REGISTRY.values() if kind is None or s.kind == kind), key=lambda s: s.name))
