"""Collective-communication volumes and times (bandwidth-optimal ring algorithms).

Volumes are bytes *sent (= received) by each rank*; times divide them by the
achieved per-device link bandwidth and add a fixed start-up latency per call:

- ring all-reduce of ``B`` bytes over ``n`` ranks: ``2·(n−1)/n · B`` per rank
  (reduce-scatter then all-gather; Patarasuk & Yuan 2009, "Bandwidth optimal
  all-reduce algorithms for clusters of workstations"; NCCL's "bus bandwidth");
- ring all-gather / reduce-scatter whose *full* buffer is ``B`` bytes:
  ``(n−1)/n · B`` per rank;
- pipelined broadcast of ``B`` bytes in ``k`` buckets to ``r`` receivers along a
  chain: every receiver gets ``B``; time ``(k + r − 1) · (B/k) / bw`` (the
  pipeline fills in ``r − 1`` bucket steps, then delivers one bucket per step).
"""
from __future__ import annotations

import math

from .cluster import ClusterSpec

__all__ = [
    "all_reduce_volume", "all_gather_volume", "all_reduce_time", "all_gather_time",
    "broadcast_time", "span_of_group",
]


def all_reduce_volume(nbytes: float, n: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``nbytes``: 2·(n−1)/n·nbytes (0 for n = 1)."""
    return 2.0 * (n - 1) / n * nbytes if n > 1 else 0.0


def all_gather_volume(nbytes: float, n: int) -> float:
    """Bytes each rank receives in a ring all-gather (or sends in a reduce-scatter) of a ``nbytes`` buffer: (n−1)/n·nbytes."""
    return (n - 1) / n * nbytes if n > 1 else 0.0


def span_of_group(size: int, stride: int) -> int:
    """Consecutive devices covered by a group of ``size`` ranks spaced ``stride`` apart."""
    return (size - 1) * stride + 1


def all_reduce_time(nbytes: float, n: int, span: int, cluster: ClusterSpec) -> float:
    """Seconds for one ring all-reduce of ``nbytes`` over ``n`` ranks spanning ``span`` devices."""
    if n <= 1:
        return 0.0
    return cluster.collective_latency_s + all_reduce_volume(nbytes, n) / cluster.link_bandwidth(span)


def all_gather_time(nbytes: float, n: int, span: int, cluster: ClusterSpec) -> float:
    """Seconds for one ring all-gather (or reduce-scatter) of a ``nbytes`` buffer over ``n`` ranks."""
    if n <= 1:
        return 0.0
    return cluster.collective_latency_s + all_gather_volume(nbytes, n) / cluster.link_bandwidth(span)


def broadcast_time(nbytes: float, receivers: int, bucket_bytes: float, bandwidth: float, latency_s: float) -> float:
    """Seconds to broadcast ``nbytes`` in buckets of ``bucket_bytes`` along a chain of ``receivers``.

    ``k = ceil(nbytes / bucket_bytes)`` buckets; ``(k + receivers − 1)`` pipeline
    steps of ``bucket/bandwidth`` each, plus ``latency_s`` per bucket.
    """
    if receivers <= 0 or nbytes <= 0:
        return 0.0
    buckets = max(1, math.ceil(nbytes / bucket_bytes))
    step = (nbytes / buckets) / bandwidth
    return (buckets + receivers - 1) * step + buckets * latency_s
