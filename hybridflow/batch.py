"""The batch container that flows between nodes: tensors, aligned non-tensor columns, meta.

It sits below the layers that use it: the data layer makes batches of prompts (:mod:`hybridflow.data`), the
runtime's engines and executors pass them between nodes, the trainer reads them.

A :class:`Batch` of ``B`` samples holds

- ``tensors``: name -> tensor, each with first dim ``B`` (``prompt_ids [B, P]``,
  ``response_mask [B, R]``, ``scores [B]``, ...),
- ``columns``: per-sample values that are not tensors (prompt text, ground truths,
  ``data_source``, ``extra_info``), each a 1-D numpy array of length ``B``
  (``dtype=object`` unless given as a typed numpy array),
- ``meta``: a small dict that is not per sample (step, temperature, ...).

Every operation returns a new Batch and leaves its inputs alone (slices may share
memory with the original, as torch and numpy slices do). Row ``i`` of every tensor
and every column belongs to the same sample, and every operation keeps it so.
Wrong lengths, unknown fields and conflicting values raise :class:`BatchError`
naming the field and the sizes.

The tensors are a plain dict (treat it as read-only: build a new Batch with
:meth:`Batch.with_fields`). It used to be a ``tensordict.TensorDict``, of which
this class used only the batch-size check and row indexing; importing tensordict
imports ``torch._dynamo`` (about 1.3 s), which every process paid: the trainer,
each Ray worker, each command.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .errors import BatchError

__all__ = ["Batch"]


def _as_column(name: str, values: Any) -> np.ndarray:
    """A 1-D numpy array holding ``values`` one per row (object dtype for lists)."""
    if isinstance(values, torch.Tensor):
        raise BatchError(f"column {name!r} is a tensor; pass tensors in `tensors`, not `columns`.")
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise BatchError(f"column {name!r} must be 1-D (one value per sample), got shape {values.shape}.")
        return values
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise BatchError(f"column {name!r} must be a list with one value per sample, got {type(values).__name__}.")
    values = list(values)
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # element-wise, so lists and dicts stay single objects
        array[i] = value
    return array


def _values_equal(a: Any, b: Any) -> bool:
    """Exact equality of two field values (tensors: dtype, shape and values)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return all(_values_equal(x, y) for x, y in zip(a.ravel(), b.ravel()))
        return bool(np.array_equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _merge_meta(metas: Sequence[Mapping[str, Any]], what: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for meta in metas:
        for key, value in meta.items():
            if key in merged and not _values_equal(merged[key], value):
                raise BatchError(f"{what}: meta {key!r} differs between batches ({merged[key]!r} vs {value!r}).")
            merged.setdefault(key, value)
    return merged


class Batch:
    """A batch of samples: ``tensors`` (name -> tensor ``[B, ...]``), ``columns`` (name -> 1-D array), ``meta``.

    Args:
        tensors: name -> tensor whose first dim is ``B``.
        columns: name -> list / 1-D numpy array of ``B`` non-tensor values.
        meta: values that are not per sample.
        batch_size: ``B`` when there are no fields at all (default 0).
    """

    __slots__ = ("tensors", "columns", "meta", "_rows")

    def __init__(self, tensors: Mapping[str, torch.Tensor] | None = None,
                 columns: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None,
                 *, batch_size: int | None = None):
        tensors = dict(tensors.items()) if tensors is not None else {}
        columns = {name: _as_column(name, v) for name, v in (columns or {}).items()}
        both = sorted(set(tensors) & set(columns))
        if both:
            raise BatchError(f"field(s) {both} given both as tensors and as columns; a name must be one or the other.")
        lengths = self._field_lengths(tensors, columns)
        sizes = set(lengths.values()) | ({batch_size} if batch_size is not None else set())
        if len(sizes) > 1:
            extra = f", batch_size={batch_size}" if batch_size is not None else ""
            raise BatchError(f"fields have different lengths (first dim): {lengths}{extra}; every field needs B rows.")
        self._rows = sizes.pop() if sizes else 0
        self.tensors: dict[str, torch.Tensor] = tensors
        self.columns = columns
        self.meta = dict(meta or {})

    @staticmethod
    def _field_lengths(tensors: Mapping[str, Any], columns: Mapping[str, np.ndarray]) -> dict[str, int]:
        lengths = {}
        for name, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise BatchError(f"tensor field {name!r} is a {type(value).__name__}; put non-tensors in `columns`.")
            if value.dim() == 0:
                raise BatchError(f"tensor field {name!r} is a scalar; per-sample tensors need a first dim B, "
                                 "and a value for the whole batch goes in `meta`.")
            lengths[name] = value.shape[0]
        lengths.update({name: len(values) for name, values in columns.items()})
        return lengths

    # -- reading -------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._rows

    def keys(self) -> list[str]:
        """Tensor field names, then column names."""
        return [*self.tensors, *self.columns]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.columns or name in self.tensors)

    def _field(self, name: str) -> Any:
        if name in self.columns:
            return self.columns[name]
        if name in self.tensors:
            return self.tensors[name]
        raise BatchError(f"batch has no field {name!r}; it has tensors {list(self.tensors)} "
                         f"and columns {list(self.columns)}.")

    def __getitem__(self, key):
        """``batch["name"]`` -> that tensor or column; an int, slice, index or bool-mask -> a Batch of those rows.

        An int ``i`` gives a Batch of the single row ``i`` (the dimension is kept).
        """
        if isinstance(key, str):
            return self._field(key)
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            key, n = int(key), len(self)
            if not -n <= key < n:
                raise BatchError(f"row {key} is out of range for a batch of {n}.")
            key = slice(key % n, key % n + 1)
        if isinstance(key, slice):
            return self._take(key, key)
        index = self._as_index(key)
        return self._take(torch.from_numpy(index), index)

    def __iter__(self):
        raise TypeError("a Batch is not iterable (rows or fields?); use batch.keys() for field names "
                        "or batch.split(1) for one-row batches.")

    def _as_index(self, key: Any) -> np.ndarray:
        index = key.detach().cpu().numpy() if isinstance(key, torch.Tensor) else np.asarray(key)
        if index.ndim != 1:
            raise BatchError(f"row index must be 1-D, got shape {index.shape}.")
        if index.dtype == bool:
            if len(index) != len(self):
                raise BatchError(f"boolean row mask has length {len(index)}, batch has {len(self)} rows.")
            return np.flatnonzero(index)
        if index.size and not np.issubdtype(index.dtype, np.integer):
            raise BatchError(f"row index must hold integers or booleans, got dtype {index.dtype}.")
        index = index.astype(np.int64)
        if index.size and (index.max() >= len(self) or index.min() < -len(self)):
            raise BatchError(f"row index out of range [{-len(self)}, {len(self)}) for a batch of {len(self)}.")
        return index % max(len(self), 1)

    def _take(self, tensor_index: Any, column_index: Any) -> Batch:
        """The rows ``tensor_index`` (a slice or an int64 tensor) of the tensors, ``column_index`` of the columns."""
        tensors = {name: value[tensor_index] for name, value in self.tensors.items()}
        columns = {name: values[column_index] for name, values in self.columns.items()}
        rows = len(range(*column_index.indices(len(self)))) if isinstance(column_index, slice) else len(column_index)
        return Batch(tensors, columns, self.meta, batch_size=rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        return (len(self) == len(other) and list(self.tensors) == list(other.tensors)
                and list(self.columns) == list(other.columns)
                and all(_values_equal(self.tensors[k], other.tensors[k]) for k in self.tensors)
                and all(_values_equal(self.columns[k], other.columns[k]) for k in self.columns)
                and _values_equal(self.meta, other.meta))

    __hash__ = None  # mutable container

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
                            for k, v in self.tensors.items())
        return f"Batch(B={len(self)}, tensors={{{tensors}}}, columns={list(self.columns)}, meta={self.meta})"

    # -- new batches from this one -------------------------------------------------------------------

    def select(self, *names: str) -> Batch:
        """A batch with only the named fields (tensors or columns); meta is kept."""
        for name in names:
            self._field(name)  # raises for unknown names
        tensors = {n: self.tensors[n] for n in names if n not in self.columns}
        columns = {n: self.columns[n] for n in names if n in self.columns}
        return Batch(tensors, columns, self.meta, batch_size=len(self))

    def drop(self, *names: str) -> Batch:
        """A batch without the named fields."""
        for name in names:
            self._field(name)
        keep = [n for n in self.keys() if n not in names]
        return self.select(*keep)

    def with_fields(self, **fields: Any) -> Batch:
        """A batch with fields added or replaced: tensors go to ``tensors``, anything else to ``columns``."""
        tensors = {**{k: v for k, v in self.tensors.items() if k not in fields},
                   **{k: v for k, v in fields.items() if isinstance(v, torch.Tensor)}}
        columns = {**{k: v for k, v in self.columns.items() if k not in fields},
                   **{k: v for k, v in fields.items() if not isinstance(v, torch.Tensor)}}
        return Batch(tensors, columns, self.meta, batch_size=len(self))

    def with_meta(self, **meta: Any) -> Batch:
        """A batch whose meta has these entries added or replaced."""
        return Batch(self.tensors, self.columns, {**self.meta, **meta}, batch_size=len(self))

    def to(self, device: str | torch.device) -> Batch:
        """The same batch with every tensor on ``device`` (columns and meta unchanged)."""
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.columns, self.meta, batch_size=len(self))

    def split(self, size: int | Sequence[int]) -> list[Batch]:
        """Consecutive pieces: of ``size`` rows each (the last may be smaller), or of the given sizes.

        Given sizes must add up to ``len(self)``. An empty batch splits into one empty piece.
        """
        n = len(self)
        if isinstance(size, int):
            if size <= 0:
                raise BatchError(f"split size must be positive, got {size}.")
            sizes = [min(size, n - start) for start in range(0, n, size)] or [0]
        else:
            sizes = [int(s) for s in size]
            if any(s < 0 for s in sizes) or sum(sizes) != n:
                raise BatchError(f"split sizes {sizes} must be non-negative and add up to the batch size {n}.")
        bounds = np.cumsum([0, *sizes]).tolist()
        return [self[bounds[i]:bounds[i + 1]] for i in range(len(sizes))]

    def chunk(self, n: int) -> list[Batch]:
        """``n`` consecutive pieces whose sizes differ by at most one (earlier pieces are larger).

        For equal pieces, e.g. one per data-parallel rank, call :meth:`pad_to_divisor` first.
        """
        if n <= 0:
            raise BatchError(f"chunk count must be positive, got {n}.")
        base, extra = divmod(len(self), n)
        return self.split([base + (1 if i < extra else 0) for i in range(n)])

    def repeat_interleave(self, n: int) -> Batch:
        """Every row repeated ``n`` times in place: rows ``[a, b]`` become ``[a, a, b, b]`` for n=2.

        This is how ``n`` samples per prompt are laid out. ``group_index`` (int64[B*n]) says which
        row of this batch each new row came from; if the batch already has a ``group_index``, it
        is repeated along with the other fields, so existing groups are kept.
        """
        if n < 1:
            raise BatchError(f"repeat_interleave needs n >= 1, got {n}.")
        index = torch.arange(len(self)).repeat_interleave(n)
        out = self._take(index, index.numpy())
        if "group_index" not in self:
            out = out.with_fields(group_index=index.clone())
        return out

    def pad_to_divisor(self, divisor: int) -> tuple[Batch, int]:
        """``(padded, pad_count)``: the batch grown to a multiple of ``divisor`` by repeating its last row.

        Padding rows are copies of a real sample rather than zeros so that every worker
        receives well-formed input (valid token ids, non-empty masks, strings a reward
        function can read) and runs the same code path. They are not samples: call
        :meth:`unpad` with ``pad_count`` on the result before computing anything across
        the batch (group statistics, means), since the copies would count twice.
        """
        if divisor < 1:
            raise BatchError(f"pad_to_divisor needs a divisor >= 1, got {divisor}.")
        pad = -len(self) % divisor
        if pad == 0:  # includes the empty batch, which every divisor divides
            return self, 0
        index = torch.cat([torch.arange(len(self)), torch.full((pad,), len(self) - 1)])
        return self._take(index, index.numpy()), pad

    def unpad(self, pad_count: int) -> Batch:
        """The batch without its last ``pad_count`` rows (undoes :meth:`pad_to_divisor`)."""
        if not 0 <= pad_count <= len(self):
            raise BatchError(f"unpad: pad_count {pad_count} is not within [0, {len(self)}] for a batch of {len(self)}.")
        return self[: len(self) - pad_count]

    def union(self, other: Batch) -> Batch:
        """The fields of both batches (equal lengths); a field in both must hold equal values."""
        if len(self) != len(other):
            raise BatchError(f"union of batches of different lengths: {len(self)} and {len(other)}.")
        for name in other.keys():
            if name in self and not _values_equal(self[name], other[name]):
                raise BatchError(f"union: field {name!r} differs between the two batches; "
                                 "rename one of them or drop it before the union.")
        meta = _merge_meta([self.meta, other.meta], "union")
        fields = {name: other[name] for name in other.keys() if name not in self}
        return self.with_fields(**fields).with_meta(**meta)

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """The rows of ``batches`` one after another; all must have the same fields, dtypes and trailing dims.

        Meta entries must agree between batches.
        """
        if not batches:
            raise BatchError("concat of an empty list of batches; give at least one.")
        first = batches[0]
        for i, batch in enumerate(batches[1:], start=1):
            if (set(batch.tensors), set(batch.columns)) != (set(first.tensors), set(first.columns)):
                raise BatchError(f"concat: batch {i} has tensors {list(batch.tensors)} and columns "
                                 f"{list(batch.columns)}, batch 0 has tensors {list(first.tensors)} and "
                                 f"columns {list(first.columns)}.")
        tensors = {name: Batch._concat_tensor(name, [b.tensors[name] for b in batches]) for name in first.tensors}
        columns = {name: np.concatenate([b.columns[name] for b in batches]) for name in first.columns}
        meta = _merge_meta([b.meta for b in batches], "concat")
        return Batch(tensors, columns, meta, batch_size=sum(len(b) for b in batches))

    @staticmethod
    def _concat_tensor(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
        ref = parts[0]
        for i, part in enumerate(parts):
            if part.dtype != ref.dtype or part.shape[1:] != ref.shape[1:]:
                raise BatchError(
                    f"concat: tensor {name!r} is {part.dtype}{list(part.shape)} in batch {i} but "
                    f"{ref.dtype}{list(ref.shape)} in batch 0; dtypes and all dims after the first must match "
                    "(pad responses to a common length first)."
                )
        return torch.cat(parts, dim=0)
