"""Run-time contract checks: every node's outputs against what its graph declares.

The type checker (:mod:`hybridflow.graph.signature`) proves a graph consistent
from its declarations; these checks hold the running ops to them. After a node's
output batch is made, each declared field is checked for

* presence and **dtype** (``float32`` means ``torch.float32``);
* **shape** against the graph's symbolic dims (``[B*8, R]``). The symbols of
  one iteration (``B`` prompts, ``P`` prompt length, ``R`` response length)
  are bound from the first tensors that carry them and every later tensor must
  agree, so a ``[B, R]`` where ``[B]`` is declared is caught at the op that made
  it, not at the next op that reads it;
* **finiteness** of the outputs a compute op declares finite
  (``register_op(..., finite=...)``; by default every floating-point output).
  Engine outputs (generate, log-probs, values) are checked for dtype and shape
  only: log-probs may hold ``-inf`` on padding, and scores are checked by the
  score reader itself.

* **untouched inputs** of a compute op: an op that writes into a tensor it was given
  (``scores.sub_(...)``, ``adv[mask == 0] = 0``) changes values other nodes read too. Each
  input's version counter (torch bumps it on every in-place write, through views as well) is
  read before and after the call; a tensor made under ``torch.inference_mode`` has none, so it
  is copied before and compared after (see :class:`InputGuard`).

A breach raises :class:`~hybridflow.errors.ContractError` naming the node, its
op, the field, what was declared and what came out.

**One iteration, one binding.** The executors hand :mod:`.node_calls` the
iteration's ``metrics`` dict with every worker node's result, and the
iteration's environment with every compute node; neither signature changes.
So a :class:`DimScope` is found by the identity of the ``metrics`` dict for
worker nodes, and for compute nodes from the tensors they read: every checked
output tensor is tagged (weakly, by identity) with the scope that checked it.
A compute node reading tensors of two scopes (the Ray executor's overlapped
generation of the next step) checks that their bindings agree.

**The switch.** :func:`set_enabled` turns the checks on or off for this
process (the trainer calls it with ``PPOConfig.check_contracts``);
``HYBRIDFLOW_CHECK_CONTRACTS=0`` turns them off whatever the config says.
"""
from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

import torch

from ..errors import ContractError
from ..graph import Node
from ..graph.dims import factors
from ..graph.schema import Schema
from ..batch import Batch

__all__ = ["ENV_VAR", "DimScope", "enabled", "set_enabled", "check_node_output", "check_compute_results", "InputGuard"]

ENV_VAR = "HYBRIDFLOW_CHECK_CONTRACTS"
"""Set to ``0`` (or ``false``, ``no``, ``off``) to turn the checks off in this process."""

_requested = True


def _env_allows() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def set_enabled(flag: bool) -> None:
    """Turn the checks on or off for this process (``HYBRIDFLOW_CHECK_CONTRACTS=0`` still turns them off)."""
    global _requested
    _requested = bool(flag)


def enabled() -> bool:
    """Whether the checks run: requested (:func:`set_enabled`, default on) and not turned off by the environment."""
    return _requested and _env_allows()


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
"""Declared dtype -> torch dtype; ``str`` and ``object`` fields are columns and are not checked."""


class DimScope:
    """The sizes the symbolic dims take in one iteration, and which field bound each one first."""

    __slots__ = ("sizes", "origin", "__weakref__")

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.origin: dict[str, str] = {}


# -- finding an iteration's scope --------------------------------------------------------------

_MAX_SCOPES = 8
_scopes: "OrderedDict[int, tuple[object, DimScope]]" = OrderedDict()
"""id(metrics dict) -> (that dict, kept alive so the id stays its own; its scope). The newest few only."""

_tags: dict[int, tuple[weakref.ref, DimScope]] = {}
"""id(tensor) -> (a weak reference to it, the scope that checked it); an entry goes when its tensor does."""


def _scope_of_iteration(key: object) -> DimScope:
    entry = _scopes.get(id(key))
    if entry is not None and entry[0] is key:
        _scopes.move_to_end(id(key))
        return entry[1]
    scope = DimScope()
    _scopes[id(key)] = (key, scope)
    while len(_scopes) > _MAX_SCOPES:
        _scopes.popitem(last=False)
    return scope


def _untag(key: int, ref: weakref.ref) -> None:
    entry = _tags.get(key)
    if entry is not None and entry[0] is ref:
        del _tags[key]


def _tag(tensors: Iterable[Any], scope: DimScope) -> None:
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            key = id(tensor)
            _tags[key] = (weakref.ref(tensor, lambda ref, key=key: _untag(key, ref)), scope)


def _scope_of_inputs(node: Node, tensors: Iterable[Any]) -> DimScope:
    """The scope of the tensors a compute node reads (merged and checked when they come from several)."""
    found: list[DimScope] = []
    for tensor in tensors:
        entry = _tags.get(id(tensor))
        if entry is not None and entry[0]() is tensor and all(entry[1] is not s for s in found):
            found.append(entry[1])
    if not found:
        return DimScope()
    scope = found[0]
    for other in found[1:]:
        for symbol, size in other.sizes.items():
            if symbol not in scope.sizes:
                scope.sizes[symbol], scope.origin[symbol] = size, other.origin[symbol]
            elif scope.sizes[symbol] != size:
                raise ContractError(
                    f"its inputs disagree on dim {symbol!r}: {scope.sizes[symbol]} (from {scope.origin[symbol]}) "
                    f"vs {size} (from {other.origin[symbol]}); values of different iterations or batches were mixed",
                    node=node.name, op=node.op)
    return scope


# -- the checks -----------------------------------------------------------------------------------

@lru_cache(maxsize=512)
def _declared(schema: Schema) -> tuple[tuple[str, str, torch.dtype | None, tuple[tuple[str, int, tuple[str, ...]], ...]], ...]:
    """Per field: name, declared text, torch dtype (None: not a tensor), and each dim as (text, coefficient, symbols)."""
    return tuple((f.name, str(f), _DTYPES.get(f.dtype), tuple((d, *factors(d)) for d in f.dims)) for f in schema.fields)


def _shape_text(dims: Sequence[tuple[str, int, tuple[str, ...]]], scope: DimScope) -> str:
    """The declared dims with the sizes this iteration has bound: ``[B*2=4, R]``."""
    def one(text: str, coefficient: int, names: tuple[str, ...]) -> str:
        if names and all(n in scope.sizes for n in names):
            size = coefficient
            for n in names:
                size *= scope.sizes[n]
            return f"{text}={size}"
        return text
    return "[" + ", ".join(one(*d) for d in dims) + "]"


def _check_dims(node: Node, name: str, declared: str, dims: Sequence[tuple[str, int, tuple[str, ...]]],
                shape: torch.Size, scope: DimScope) -> None:
    if len(shape) != len(dims):
        raise ContractError(f"declared {declared}, here {_shape_text(dims, scope)} (rank {len(dims)}), but got shape "
                            f"{list(shape)} (rank {len(shape)}); return the declared shape or fix the declaration",
                            node=node.name, op=node.op, field=name)
    for axis, ((text, coefficient, names), size) in enumerate(zip(dims, shape)):
        known, free = coefficient, [n for n in names if n not in scope.sizes]
        for n in names:
            known *= scope.sizes.get(n, 1)
        if not free:
            if known == size:
                continue
            bound = "; ".join(f"{n} = {scope.sizes[n]} bound by {scope.origin[n]}" for n in names)
            raise ContractError(
                f"declared {declared} but got shape {list(shape)}: dim {axis} is {size} but {text} = {known}"
                f"{f' in this iteration ({bound})' if names else ''}",
                node=node.name, op=node.op, field=name)
        if len(free) == 1:
            if size % known:
                raise ContractError(f"declared {declared} but got shape {list(shape)}: dim {axis} "
                                    f"({text}) must be a multiple of {known}, got {size}",
                                    node=node.name, op=node.op, field=name)
            scope.sizes[free[0]], scope.origin[free[0]] = size // known, f"{node.name}.{name}"
        # two or more unknown symbols in one dim: nothing to check until other fields bind them


def _check_fields(node: Node, outputs: Schema, tensors: Mapping[str, torch.Tensor], scope: DimScope,
                  finite: Sequence[str]) -> None:
    for name, declared, dtype, dims in _declared(outputs):
        if dtype is None:
            continue
        if name not in tensors.keys():
            raise ContractError(f"declared {declared} but the output has no tensor {name!r}; it has "
                                f"{', '.join(tensors.keys()) or 'none'}", node=node.name, op=node.op, field=name)
        tensor = tensors[name]
        if tensor.dtype != dtype:
            raise ContractError(
                f"declared {declared} but got {str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}; "
                f"return the declared dtype (e.g. tensor.to({dtype})) or declare the one it returns",
                node=node.name, op=node.op, field=name)
        _check_dims(node, name, declared, dims, tensor.shape, scope)
        if name in finite and not bool(torch.isfinite(tensor).all()):
            bad = (~torch.isfinite(tensor)).nonzero()[0].tolist()
            raise ContractError(
                f"declared finite but holds {tensor[tuple(bad)].item()} at index {bad}; check the op's divisions "
                "and logs (an empty group, a zero std), or register it with finite=False if inf/NaN is meant",
                node=node.name, op=node.op, field=name)


def check_node_output(node: Node, output: Batch, metrics: object) -> None:
    """Check a worker node's output batch against ``node.outputs``, in the scope of the iteration ``metrics`` belongs to."""
    if not node.outputs.fields:
        return
    scope = _scope_of_iteration(metrics)
    _check_fields(node, node.outputs, output.tensors, scope, ())
    _tag(output.tensors.values(), scope)


def check_compute_results(node: Node, inputs: Batch, results: Any, finite: Sequence[str]) -> None:
    """Check what a compute node's op returned (``results``, read positionally) against ``node.outputs``.

    ``inputs`` is the batch the op was given: the iteration's scope is found from its tensors.
    """
    declared = node.outputs.fields
    if isinstance(results, torch.Tensor) or not isinstance(results, Sequence) or len(results) < len(declared):
        got = (f"a tensor of shape {list(results.shape)}" if isinstance(results, torch.Tensor)
               else f"{len(results)} value(s)" if isinstance(results, Sequence) else f"a {type(results).__name__}")
        raise ContractError(f"the op returned {got}; an op with several outputs must return a tuple (a named tuple) that starts with "
                            f"its declared output(s) {', '.join(f.name for f in declared)}",
                            node=node.name, op=node.op)
    for spec, value in zip(declared, results):
        if _DTYPES.get(spec.dtype) is not None and not isinstance(value, torch.Tensor):
            raise ContractError(f"declared {spec} but the op returned a {type(value).__name__}",
                                node=node.name, op=node.op, field=spec.name)
    scope = _scope_of_inputs(node, inputs.tensors.values())
    output = {spec.name: value for spec, value in zip(declared, results)}
    _check_fields(node, node.outputs, output, scope, finite)
    _tag(output.values(), scope)


class InputGuard:
    """Notes a compute op's input tensors before the call; :meth:`check` raises ContractError for one it wrote into.

    ``inputs``: field name -> the tensor handed to the op. Writes through ``.data`` or numpy views escape the
    version counter; every in-place torch op is seen.
    """

    def __init__(self, node: Node, inputs: Mapping[str, Any]):
        self.node = node
        self._before: list[tuple[str, torch.Tensor, int | torch.Tensor]] = []
        for name, tensor in inputs.items():
            if not isinstance(tensor, torch.Tensor):
                continue
            mark = tensor.clone() if tensor.is_inference() else tensor._version
            self._before.append((name, tensor, mark))

    def check(self) -> None:
        for name, tensor, mark in self._before:
            if isinstance(mark, torch.Tensor):
                changed = not _same_values(mark, tensor)
            else:
                changed = tensor._version != mark
            if changed:
                raise ContractError(
                    f"the op wrote into its input {name!r} (in place); other nodes read the same tensor, so their "
                    "values changed too. Compute on a copy (x = x.clone()) or with out-of-place ops (x = x - y, "
                    "torch.where(...))", node=self.node.name, op=self.node.op, field=name, side="input")


def _same_values(before: torch.Tensor, after: torch.Tensor) -> bool:
    if before.shape != after.shape:
        return False
    if before.is_floating_point():
        return bool(((before == after) | (before.isnan() & after.isnan())).all())
    return torch.equal(before, after)
