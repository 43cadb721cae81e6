"""Weight sync from a train engine to rollout engines, bucket by bucket.

Two transitions (DESIGN.md, reshard pass; HybridFlow §5):

* **hybrid engine** (:func:`stream_into`): training and generation share the
  devices. The train engine's full tensors — gathered from the FSDP shards one
  tensor at a time — are copied into the rollout engine in buckets of at most
  ``bucket_bytes``; a bucket is freed once loaded, so the extra memory is one
  bucket, not a second model.
* **cross-pool broadcast** (:func:`broadcast_send` / :func:`broadcast_receive`):
  generation has its own pool. The train pool's ranks gather each bucket (a
  collective among them); its rank 0 flattens the bucket into one buffer and
  broadcasts it over a process group that spans it and every rollout worker,
  which unflatten it into their rollout engines. Nothing passes through the
  controller or the object store.
* **staged** (:class:`StagedWeights`, :mod:`.staged_sync`): generation has its own pool and runs up to
  ``staleness`` steps ahead. The train pool leaves each new version's full tensors in a staging buffer (host
  memory; on Ray the object store) without the rollout pool, which loads them (:func:`stream_into`) just
  before the generation that needs them: no collective of both pools.

Buckets (:func:`bucket_plan`) are runs of consecutive tensors of one dtype
whose sizes add up to at most ``bucket_bytes`` (a larger tensor is a bucket of
its own). Both sides of a broadcast derive the same buckets from the tensor
list the sender announces first (:func:`broadcast_send` sends names, shapes and
dtypes with ``broadcast_object_list``), and the receiver checks them against
its model, so a mismatch is an error naming the tensor, not a silent garble.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from ..capabilities import WEIGHT_SYNC_BUCKET_BYTES
from ..errors import ExecutionError

__all__ = ["TensorSpec", "SyncStats", "StagedWeights", "DEFAULT_BUCKET_BYTES", "bucket_plan", "tensor_specs", "stream_into",
           "broadcast_send", "broadcast_receive"]

DEFAULT_BUCKET_BYTES = WEIGHT_SYNC_BUCKET_BYTES
"""Bytes per bucket (the cost model predicts a sync with the same figure: ``hybridflow.capabilities``)."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one tensor of a state dict."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class SyncStats:
    """What one sync moved: tensors, bytes, buckets, the most bytes held at once, and seconds."""

    tensors: int
    bytes: int
    buckets: int
    peak_bytes: int
    seconds: float

    def metrics(self, role: str) -> dict[str, float]:
        """``weight_sync/<role>/...`` metrics: megabytes moved, buckets, peak megabytes held."""
        return {f"weight_sync/{role}/mb": self.bytes / 2**20, f"weight_sync/{role}/buckets": float(self.buckets),
                f"weight_sync/{role}/peak_mb": self.peak_bytes / 2**20}


@dataclass(frozen=True)
class StagedWeights:
    """One policy version left in the staging buffer by the train pool's rank 0 (a staged sync, :mod:`.staged_sync`)."""

    weights: Any
    """What the rollout workers load: the (name, host tensor) list, or on Ray the ObjectRef of it in the object store."""
    version: int
    """The policy version of the weights (the train engine's training steps when it staged them)."""
    stats: SyncStats
    """What the staging gathered and copied."""


def tensor_specs(state: dict[str, torch.Tensor]) -> list[TensorSpec]:
    """The :class:`TensorSpec` of each entry, in order (DTensors report their global shape)."""
    return [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in state.items()]


def bucket_plan(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``specs`` grouped into consecutive same-dtype buckets of at most ``bucket_bytes``.

    >>> f = torch.float32
    >>> bucket_plan([TensorSpec("a", (2,), f), TensorSpec("b", (2,), f), TensorSpec("c", (4,), f)], 16)
    [[0, 1], [2]]
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list[int]] = []
    size = 0
    for i, spec in enumerate(specs):
        current = buckets[-1] if buckets else None
        if current is None or specs[current[0]].dtype != spec.dtype or size + spec.nbytes > bucket_bytes:
            buckets.append([i])
            size = spec.nbytes
        else:
            current.append(i)
            size += spec.nbytes
    return buckets


def _buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive same-dtype runs of ``named`` of at most ``bucket_bytes`` (a larger tensor alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and (bucket[0][1].dtype != tensor.dtype or size + nbytes > bucket_bytes):
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def stream_into(rollout, named: Iterable[tuple[str, torch.Tensor]], *,
                bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> SyncStats:
    """Hybrid engine: load ``(name, full tensor)`` pairs into ``rollout`` bucket by bucket, freeing each after.

    ``named`` is consumed lazily (e.g. :meth:`FSDPTrainEngine.named_weights`, which gathers one
    tensor at a time), so at most one bucket of gathered tensors is alive at once.
    """
    start = time.perf_counter()
    tensors = total = buckets = peak = 0
    for bucket in _buckets(named, bucket_bytes):
        held = sum(t.numel() * t.element_size() for _, t in bucket)
        peak = max(peak, held)
        tensors += rollout.update_weights(bucket)
        total += held
        buckets += 1
        del bucket
    return SyncStats(tensors, total, buckets, peak, time.perf_counter() - start)


def broadcast_send(named: Iterable[tuple[str, torch.Tensor]], specs: Sequence[TensorSpec], *, group, src: int,
                   is_src: bool, device: torch.device, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> SyncStats:
    """Train side of a cross-pool sync: every train rank iterates ``named`` (the gathers are collective);
    the rank with ``is_src`` (global rank ``src``) announces ``specs`` and broadcasts each bucket over ``group``.
    """
    start = time.perf_counter()
    if is_src:
        dist.broadcast_object_list([list(specs)], src=src, group=group)
    plan = bucket_plan(specs, bucket_bytes)
    stream = iter(named)
    moved = peak = 0
    for indices in plan:
        tensors = [next(stream)[1] for _ in indices]
        if not is_src:
            continue
        flat = torch.cat([t.reshape(-1).to(device) for t in tensors])
        held = flat.numel() * flat.element_size()
        peak = max(peak, 2 * held)
        dist.broadcast(flat, src=src, group=group)
        moved += held
        del flat, tensors
    return SyncStats(len(specs), moved, len(plan), peak, time.perf_counter() - start)


def broadcast_receive(rollout, *, group, src: int, device: torch.device,
                      bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> SyncStats:
    """Rollout side of a cross-pool sync: receive the announced tensors bucket by bucket into ``rollout``."""
    start = time.perf_counter()
    box: list = [None]
    dist.broadcast_object_list(box, src=src, group=group)
    specs: list[TensorSpec] = box[0]
    own = rollout.weight_shapes()
    for spec in specs:
        target = own.get(spec.name)
        if target is None or tuple(target) != spec.shape:
            found = "missing" if target is None else f"shape {tuple(target)}"
            raise ExecutionError(f"weight sync: the trainer sends {spec.name!r} {spec.shape} but the rollout model has "
                                 f"it {found}; both pools must load the same architecture")
    loaded = moved = peak = 0
    plan = bucket_plan(specs, bucket_bytes)
    for indices in plan:
        parts = [specs[i] for i in indices]
        flat = torch.empty(sum(_numel(p.shape) for p in parts), dtype=parts[0].dtype, device=device)
        dist.broadcast(flat, src=src, group=group)
        held = flat.numel() * flat.element_size()
        peak = max(peak, held)
        views, offset = [], 0
        for p in parts:
            views.append((p.name, flat[offset:offset + _numel(p.shape)].view(p.shape)))
            offset += _numel(p.shape)
        loaded += rollout.update_weights(views)
        moved += held
        del flat, views
    return SyncStats(loaded, moved, len(plan), peak, time.perf_counter() - start)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
