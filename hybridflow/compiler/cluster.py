"""Cluster descriptions: what the devices can do, as numbers the cost model reads.

A :class:`ClusterSpec` is ``nodes`` machines of ``devices_per_node`` identical
accelerators. Hardware figures are datasheet peaks; the ``*_efficiency`` and
``mfu_*`` fields say which fraction of a peak a real workload reaches, so the
cost model stays analytical and a user can calibrate it by measurement. The
``*_overhead_s`` fields are fixed per-call times (per forward micro-batch, per
decode step, ...); every preset leaves them at 0, and
:func:`hybridflow.runtime.calibration.calibrate` fits them, with the efficiency
factors, to times measured on the machine at hand.

Presets (``ClusterSpec.preset(name, nodes=...)`` or ``ClusterSpec.parse("a100-80g:16")``):

============  ===========  ==========  ===============  ==================  =====================  ==========
preset        bf16 dense   HBM         memory           NVLink per device   inter-node per node    PCIe
============  ===========  ==========  ===============  ==================  =====================  ==========
``a100-80g``  312 TFLOP/s  2.039 TB/s  80 GiB           600 GB/s (bidir.)   8 x 200 Gb/s HDR IB    gen4 x16
``h100-80g``  989 TFLOP/s  3.35 TB/s   80 GiB           900 GB/s (bidir.)   8 x 400 Gb/s NDR IB    gen5 x16
``h200``      989 TFLOP/s  4.8 TB/s    141 GB           900 GB/s (bidir.)   8 x 400 Gb/s NDR IB    gen5 x16
``cpu-local`` detected from this machine (see :func:`detect_local_cpu`)
============  ===========  ==========  ===============  ==================  =====================  ==========

Sources: NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB), NVIDIA H100 Tensor
Core GPU datasheet (SXM5), NVIDIA H200 Tensor Core GPU datasheet (SXM); DGX A100
/ DGX H100 user guides for the eight single-port InfiniBand adapters per node.
Bandwidths are stored *per direction*: NVLink's datasheet figure counts both
directions, so a100 stores 300 GB/s; 8 x 200 Gb/s HDR is 8 x 25 GB/s = 200 GB/s
per node; PCIe gen4 x16 moves 32 GB/s per direction, gen5 x16 64 GB/s.
"""
from __future__ import annotations

import os
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError

__all__ = ["ClusterSpec", "CLUSTER_PRESETS", "NetworkPreset", "NETWORK_PRESETS", "detect_local_cpu"]

GIB = 1024**3
GB = 1e9


class ClusterSpec(BaseModel):
    """A homogeneous cluster: ``nodes`` x ``devices_per_node`` accelerators and their figures."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Preset or user name, shown in plans and tables.")
    nodes: int = Field(ge=1, description="Number of machines.")
    devices_per_node: int = Field(ge=1, description="Accelerators per machine (8 on DGX-class nodes).")
    device_memory_bytes: float = Field(gt=0, description="Memory of one device, bytes.")
    peak_flops: float = Field(gt=0, description="Dense bf16 peak of one device, FLOP/s.")
    memory_bandwidth: float = Field(gt=0, description="Device memory (HBM) bandwidth, bytes/s.")
    intra_node_bandwidth: float = Field(gt=0, description="Per-device, per-direction bandwidth to peers in the same node (NVLink), bytes/s.")
    inter_node_bandwidth: float = Field(gt=0, description="Per-node, per-direction network bandwidth to other nodes (all NICs together), bytes/s.")
    host_bandwidth: float = Field(gt=0, description="Per-device, per-direction bandwidth to host memory (PCIe), used by offload/onload, bytes/s.")
    collective_latency_s: float = Field(default=1e-5, ge=0, description="Fixed start-up time of one collective (NCCL small-message latency is ~10 us on NVLink).")
    mfu_train: float = Field(default=0.4, gt=0, le=1, description="Fraction of peak FLOP/s reached by training (forward+backward). Megatron-LM reports 44-52% on A100 for large GPT models (Narayanan et al. 2021, table 1); RL batches are shorter and uneven, hence 0.4.")
    mfu_infer: float = Field(default=0.5, gt=0, le=1, description="Fraction of peak reached by forward-only passes (log-probs, values, scores) and compute-bound decode steps.")
    mfu_prefill: float = Field(default=0.5, gt=0, le=1, description="Fraction of peak reached by the prefill of generation (one large forward over the prompts).")
    memory_bandwidth_efficiency: float = Field(default=0.7, gt=0, le=1, description="Achieved fraction of HBM bandwidth in memory-bound work (decode steps, optimizer step); vLLM-class engines reach 60-80% in decode.")
    comm_efficiency: float = Field(default=0.8, gt=0, le=1, description="Achieved fraction of link bandwidth in collectives and copies (nccl-tests bus bandwidth is 75-85% of the link on DGX nodes).")
    usable_memory_fraction: float = Field(default=0.9, gt=0, le=1, description="Fraction of device memory a plan may fill (the rest: CUDA context, allocator fragmentation).")
    mfu_decode: float | None = Field(default=None, gt=0, le=1, description="Fraction of peak reached by the compute of one decode step (a forward of one token per sequence); None: mfu_infer. Calibration sets it: on CPUs a decode step's token costs more than a prefill's.")
    # Fixed per-call times. The datasheet presets leave them at 0 (on large models the per-call
    # Python and launch time vanishes next to the FLOPs); on a CPU with a tiny model they dominate,
    # so :mod:`hybridflow.compiler.calibrate` measures them.
    forward_overhead_s: float = Field(default=0.0, ge=0, description="Fixed time of one forward-only micro-batch (log-probs, values, scores), seconds.")
    train_micro_batch_overhead_s: float = Field(default=0.0, ge=0, description="Fixed time of one training micro-batch (forward + backward), seconds.")
    optimizer_step_overhead_s: float = Field(default=0.0, ge=0, description="Fixed time of one optimizer step (zero-grad, clipping, AdamW's per-tensor loop), seconds.")
    prefill_overhead_s: float = Field(default=0.0, ge=0, description="Fixed time of one generation wave besides its decode steps (prefill call, cache set-up, detokenising), seconds.")
    decode_step_overhead_s: float = Field(default=0.0, ge=0, description="Fixed time of one decode step (one forward call and one sampling), seconds.")
    op_overhead_s: float = Field(default=0.0, ge=0, description="Fixed time the executor spends on every node op of a plan (dispatch, batch plumbing), seconds.")

    # ----------------------------------------------------------------- derived
    @property
    def num_devices(self) -> int:
        """Total accelerators: nodes x devices_per_node."""
        return self.nodes * self.devices_per_node

    @property
    def decode_mfu(self) -> float:
        """Fraction of peak a decode step's compute reaches: ``mfu_decode``, else ``mfu_infer``."""
        return self.mfu_infer if self.mfu_decode is None else self.mfu_decode

    @property
    def usable_memory_bytes(self) -> float:
        """Bytes of one device a plan may use: device_memory_bytes x usable_memory_fraction."""
        return self.device_memory_bytes * self.usable_memory_fraction

    def link_bandwidth(self, span_devices: int) -> float:
        """Achieved per-device bandwidth (bytes/s) of a collective whose ranks span ``span_devices`` consecutive devices.

        Within one node a ring runs over NVLink (``intra_node_bandwidth``);
        across nodes every device's traffic leaves through its share of the
        node's NICs, ``inter_node_bandwidth / devices_per_node``, which then
        bounds the ring (the slowest hop sets a ring's speed). Both are scaled
        by ``comm_efficiency``.
        """
        if span_devices <= self.devices_per_node:
            raw = self.intra_node_bandwidth
        else:
            raw = min(self.intra_node_bandwidth, self.inter_node_bandwidth / self.devices_per_node)
        return raw * self.comm_efficiency

    def with_nodes(self, nodes: int) -> "ClusterSpec":
        """The same hardware with a different number of nodes."""
        return self.model_copy(update={"nodes": nodes})

    def with_network(self, name: str) -> "ClusterSpec":
        """The same nodes joined by the :data:`NETWORK_PRESETS` network ``name`` (``default`` keeps the preset's own)."""
        if name not in NETWORK_PRESETS:
            raise ConfigError(f"unknown network preset {name!r}; known: {', '.join(NETWORK_PRESETS)}")
        bandwidth = NETWORK_PRESETS[name].inter_node_bandwidth
        return self if bandwidth is None else self.model_copy(update={"inter_node_bandwidth": bandwidth})

    # ----------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, nodes: int = 1, **overrides: float) -> "ClusterSpec":
        """A named preset (see the module table) with ``nodes`` nodes; ``overrides`` replace any field."""
        key = name.lower()
        if key == "cpu-local":
            base = detect_local_cpu()
        elif key in CLUSTER_PRESETS:
            base = CLUSTER_PRESETS[key]
        else:
            raise ConfigError(f"unknown cluster preset {name!r}; known: {', '.join(sorted([*CLUSTER_PRESETS, 'cpu-local']))}")
        if nodes < 1:
            raise ConfigError(f"cluster {name!r}: nodes must be >= 1, got {nodes}")
        return base.model_copy(update={"nodes": nodes, **overrides})

    @classmethod
    def parse(cls, text: str) -> "ClusterSpec":
        """Parse ``PRESET[:NODES]``, e.g. ``"a100-80g:16"`` (16 nodes of 8 A100-80G)."""
        name, _, nodes = text.partition(":")
        if not nodes:
            return cls.preset(name)
        try:
            count = int(nodes)
        except ValueError:
            raise ConfigError(f"cluster {text!r}: the part after ':' must be a node count, e.g. 'a100-80g:16'") from None
        return cls.preset(name, nodes=count)

    def describe(self) -> str:
        """One line: ``a100-80g: 16 x 8 devices, 80 GiB, 312 TFLOP/s`` (a CPU's peak in GFLOP/s)."""
        peak = f"{self.peak_flops / 1e12:.0f} TFLOP/s" if self.peak_flops >= 1e12 else f"{self.peak_flops / 1e9:.0f} GFLOP/s"
        return f"{self.name}: {self.nodes} x {self.devices_per_node} devices, {self.device_memory_bytes / GIB:.0f} GiB, {peak}"


CLUSTER_PRESETS: dict[str, ClusterSpec] = {
    "a100-80g": ClusterSpec(
        name="a100-80g", nodes=1, devices_per_node=8, device_memory_bytes=80 * GIB,
        peak_flops=312e12, memory_bandwidth=2.039e12, intra_node_bandwidth=300 * GB,
        inter_node_bandwidth=8 * 25 * GB, host_bandwidth=32 * GB),
    "h100-80g": ClusterSpec(
        name="h100-80g", nodes=1, devices_per_node=8, device_memory_bytes=80 * GIB,
        peak_flops=989e12, memory_bandwidth=3.35e12, intra_node_bandwidth=450 * GB,
        inter_node_bandwidth=8 * 50 * GB, host_bandwidth=64 * GB),
    "h200": ClusterSpec(
        name="h200", nodes=1, devices_per_node=8, device_memory_bytes=141 * GB,
        peak_flops=989e12, memory_bandwidth=4.8e12, intra_node_bandwidth=450 * GB,
        inter_node_bandwidth=8 * 50 * GB, host_bandwidth=64 * GB),
}


class NetworkPreset(BaseModel):
    """A network between nodes, with the source of its figure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    inter_node_bandwidth: float | None = Field(description="Per-node, per-direction bandwidth to other nodes, bytes/s; None keeps the node preset's own.")
    source: str = Field(description="Where the figure comes from.")


NETWORK_PRESETS: dict[str, NetworkPreset] = {
    "default": NetworkPreset(
        inter_node_bandwidth=None,
        source="the node preset's own adapters (DGX user guides: eight single-port InfiniBand adapters per node)"),
    "paper": NetworkPreset(
        inter_node_bandwidth=200e9 / 8,
        source="HybridFlow §8.1: the machines are connected by 200 Gb/s, i.e. 25 GB/s per node and direction"),
}
"""Named inter-node networks; ``default`` is what every cluster preset has unless told otherwise."""


def _total_memory_bytes() -> float:
    """Physical memory of this machine: MemTotal from /proc/meminfo, else sysconf."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@lru_cache(maxsize=1)
def detect_local_cpu() -> ClusterSpec:
    """This machine as a one-node, one-device cluster (the whole CPU is the device).

    - memory: MemTotal of /proc/meminfo (or ``sysconf(PAGE_SIZE * PHYS_PAGES)``);
    - peak FLOP/s, coarse: ``os.cpu_count() x 2.5 GHz x 32 FLOP/cycle`` — two
      256-bit FMA units per core on fp32 (AVX2); bf16 matmuls on CPUs without
      AMX run no faster, so this is an upper bound;
    - memory bandwidth 20 GB/s (a typical two-channel DDR4 server share);
      intra-node and host bandwidth equal it (copies stay in host memory);
      inter-node 1.25 GB/s (10 GbE).
    """
    cores = os.cpu_count() or 1
    return ClusterSpec(
        name="cpu-local", nodes=1, devices_per_node=1, device_memory_bytes=_total_memory_bytes(),
        peak_flops=cores * 2.5e9 * 32, memory_bandwidth=20 * GB, intra_node_bandwidth=20 * GB,
        inter_node_bandwidth=1.25 * GB, host_bandwidth=20 * GB, collective_latency_s=5e-5)
