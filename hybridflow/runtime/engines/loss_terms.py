"""Loss terms of an update: registered loss ops, weighted, fed from the model and the batch.

An update's objective is ``sum_i weight_i * loss_i`` where each ``loss_i`` is a
registered op of kind ``loss`` (``ppo_clip``, ``value_clip``, ``kl_loss``,
``entropy_bonus``, ...). The op's ``model_inputs`` (``log_probs``,
``value_preds``, ``entropy``) come from the model being trained; its other
inputs are batch fields of the same name; its attributes are the term's attrs
plus the global token / sequence counts of the mini-batch.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import torch
from hybridflow_ops.registry import OpRegistryError, OpSpec, get_op

from hybridflow.errors import OpError

__all__ = ["LossTerm", "ResolvedTerm", "resolve_loss_terms", "LOSS_METRIC_NAMES", "MetricMeans"]

# How the loss value of each op is named in the metrics (the field's usual names); an op's importance-weighted
# variant ``<op>_is`` (hybridflow_ops.losses.is_weighted) is named as the op.
LOSS_METRIC_NAMES: dict[str, str] = {
    "ppo_clip": "pg_loss",
    "gspo": "pg_loss",
    "value_clip": "vf_loss",
    "kl_loss": "kl_loss",
    "entropy_bonus": "entropy_loss",
    "nll": "sft_loss",
}

_COUNT_ATTRS = ("global_tokens", "global_seqs")


class LossTerm(NamedTuple):
    """One term of the objective: a loss op by name, its weight, and its hyper-parameters."""

    op: str
    weight: float = 1.0
    attrs: Mapping[str, Any] = {}


class ResolvedTerm(NamedTuple):
    spec: OpSpec
    weight: float
    attrs: dict[str, Any]
    metric_name: str

    def evaluate(self, model_outputs: Mapping[str, torch.Tensor], fields: Mapping[str, torch.Tensor],
                 counts: Mapping[str, torch.Tensor]):
        """Call the op: model inputs, then batch ``fields`` by name, then attrs and the global counts."""
        args = [model_outputs[f.name] for f in self.spec.model_inputs]
        args += [fields[f.name] for f in self.spec.inputs]
        result = self.spec.fn(*args, **self.attrs, **counts)
        result = LossOnly(result) if isinstance(result, torch.Tensor) else result
        loss = getattr(result, "loss", None)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = (f"a tensor of shape {list(loss.shape)} as its loss" if isinstance(loss, torch.Tensor)
                   else f"a {type(result).__name__} without a 'loss' tensor")
            raise OpError(f"loss op {self.spec.name!r} returned {got}; a loss op returns a scalar (0-dim) tensor: "
                          "alone, or as 'loss', the first field of a named tuple whose other fields are scalar "
                          "metrics. Reduce it over the batch, e.g. with hybridflow_ops.aggregate_loss")
        return result


class LossOnly(NamedTuple):
    """What a loss op that returns a bare scalar tensor (no metrics) is read as."""

    loss: torch.Tensor


def _resolve(term: LossTerm | Sequence) -> ResolvedTerm:
    term = LossTerm(*term)
    try:
        spec = get_op(term.op)
    except OpRegistryError as err:
        raise OpError(str(err)) from None
    if spec.kind != "loss":
        raise OpError(f"op {term.op!r} is a {spec.kind} op, not a loss; an update takes loss ops such as ppo_clip or value_clip")
    attrs = dict(term.attrs)
    unknown = sorted(set(attrs) - set(spec.attrs))
    if unknown:
        raise OpError(f"loss {term.op!r} got unknown attributes {unknown}; it accepts {list(spec.attrs)}")
    fixed = sorted(set(attrs) & set(_COUNT_ATTRS))
    if fixed:
        raise OpError(f"loss {term.op!r}: {fixed} are set by the train engine from the mini-batch; remove them from the attrs")
    missing = [c for c in _COUNT_ATTRS if c not in spec.attrs]
    if missing:
        raise OpError(f"loss {term.op!r} must accept keyword attributes {missing} (global counts) to be used in an update")
    base = term.op.removesuffix("_is")
    name = LOSS_METRIC_NAMES.get(base, base if base.endswith("loss") else f"{base}_loss")
    return ResolvedTerm(spec, float(term.weight), attrs, name)


def resolve_loss_terms(terms: Sequence[LossTerm | Sequence]) -> tuple[ResolvedTerm, ...]:
    """Look each term's op up in the registry and check its attributes; an error names the op."""
    if not terms:
        raise OpError("an update needs at least one loss term, e.g. [('ppo_clip', 1.0, {'clip_low': 0.2})]")
    return tuple(_resolve(t) for t in terms)


class MetricMeans:
    """Weighted means of scalar metrics: ``sum_i w_i x_i / sum_i w_i`` per key."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        self._sums[key] = self._sums.get(key, 0.0) + weight * float(value)
        self._weights[key] = self._weights.get(key, 0.0) + weight

    def add_all(self, values: Mapping[str, float], weight: float = 1.0) -> None:
        for key, value in values.items():
            self.add(key, value, weight)

    def means(self) -> dict[str, float]:
        return {k: (self._sums[k] / w if w > 0 else 0.0) for k, w in self._weights.items()}
