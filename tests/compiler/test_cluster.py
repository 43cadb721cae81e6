"""ClusterSpec presets, parsing, and the bandwidth a collective sees."""
import pytest

from hybridflow.compiler.cluster import GIB, ClusterSpec, detect_local_cpu
from hybridflow.errors import ConfigError


def test_a100_preset_carries_the_datasheet_figures():
    c = ClusterSpec.preset("a100-80g", nodes=16)
    assert (c.nodes, c.devices_per_node, c.num_devices) == (16, 8, 128)
    assert c.peak_flops == 312e12 and c.memory_bandwidth == 2.039e12 and c.device_memory_bytes == 80 * GIB
    assert c.intra_node_bandwidth == 300e9  # 600 GB/s NVLink counts both directions
    assert c.inter_node_bandwidth == 200e9  # 8 x 200 Gb/s HDR = 8 x 25 GB/s per node


def test_h100_and_h200_presets():
    h100, h200 = ClusterSpec.preset("h100-80g"), ClusterSpec.preset("h200", nodes=2)
    assert h100.peak_flops == h200.peak_flops == 989e12
    assert (h100.memory_bandwidth, h200.memory_bandwidth) == (3.35e12, 4.8e12)
    assert h200.device_memory_bytes == 141e9 and h200.num_devices == 16
    assert h100.inter_node_bandwidth == 400e9  # 8 x 400 Gb/s NDR


def test_parse_preset_and_node_count():
    assert ClusterSpec.parse("a100-80g:16") == ClusterSpec.preset("a100-80g", nodes=16)
    assert ClusterSpec.parse("h200").nodes == 1
    with pytest.raises(ConfigError, match="node count"):
        ClusterSpec.parse("a100-80g:many")
    with pytest.raises(ConfigError, match="unknown cluster preset"):
        ClusterSpec.parse("tpu-v5:4")
    with pytest.raises(ConfigError, match="nodes must be"):
        ClusterSpec.preset("a100-80g", nodes=0)


def test_overrides_replace_efficiency_factors():
    c = ClusterSpec.preset("a100-80g", nodes=2, mfu_train=0.3)
    assert c.mfu_train == 0.3 and c.mfu_infer == 0.5


def test_cpu_local_reads_this_machine():
    c = ClusterSpec.preset("cpu-local")
    with open("/proc/meminfo") as fh:
        total_kib = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
    assert c.device_memory_bytes == total_kib * 1024
    assert c.num_devices == 1 and c.peak_flops > 0
    assert detect_local_cpu() is detect_local_cpu()  # detected once


def test_link_bandwidth_inside_and_across_nodes():
    c = ClusterSpec.preset("a100-80g", nodes=2)
    # inside a node: NVLink 300 GB/s x comm efficiency 0.8 = 240 GB/s
    assert c.link_bandwidth(8) == pytest.approx(240e9)
    # across nodes: each device's share of the node's 200 GB/s, 25 GB/s, x 0.8 = 20 GB/s
    assert c.link_bandwidth(9) == pytest.approx(20e9)


def test_network_presets_state_their_source():
    from hybridflow.compiler.cluster import NETWORK_PRESETS

    a100 = ClusterSpec.preset("a100-80g", nodes=2)
    assert a100.with_network("default") == a100
    paper = a100.with_network("paper")
    assert paper.inter_node_bandwidth == 25e9 and paper.intra_node_bandwidth == a100.intra_node_bandwidth
    assert all(p.source for p in NETWORK_PRESETS.values()) and "§8.1" in NETWORK_PRESETS["paper"].source
