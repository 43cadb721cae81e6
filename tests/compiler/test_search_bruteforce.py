"""The placement search equals an independent brute force over every placement of small instances."""
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.layout import Layout
from hybridflow.compiler.placement import Placement, Pool, RolePlacement, evaluate, search
from hybridflow.compiler.workload import GenerationWork, RoleWork, Workload
from hybridflow.errors import PlacementError


def _partitions(items):
    """Set partitions via restricted growth strings: item k gets a label <= 1 + max label before it."""
    def labels(prefix):
        if len(prefix) == len(items):
            yield prefix
            return
        for v in range(max(prefix) + 2):
            yield from labels(prefix + [v])
    for lab in labels([0]):
        yield [tuple(it for it, l in zip(items, lab) if l == g) for g in range(max(lab) + 1)]


def _sizes(cluster):
    node, n = cluster.devices_per_node, cluster.num_devices
    return [s for s in range(1, n + 1) if (s < node and node % s == 0 and s & (s - 1) == 0) or s % node == 0]


def _fits(sizes, cluster):
    node = cluster.devices_per_node
    whole, sub = sum(s for s in sizes if s >= node), sum(s for s in sizes if s < node)
    return whole + node * math.ceil(sub / node) <= cluster.num_devices


def _layouts(model, n, node):
    for t in range(1, n + 1):
        for p in range(1, n + 1):
            if n % (t * p) or node % t or model.heads % t or (model.kv_heads % t and t % model.kv_heads) or model.layers % p:
                continue
            yield Layout(n // (t * p), t, p)


def _gen_layouts(model, train, node, engine):
    columns = train.tp * train.dp if engine == "fsdp" else train.tp  # megatron replicates weights over dp
    for g in _layouts(model, train.size, node):
        if train.pp % g.pp == 0 and columns % g.tp == 0:
            yield g


def brute_force(workload, cluster):
    best = math.inf
    node = cluster.devices_per_node
    for groups in _partitions(list(workload.role_names)):
        for sizes in itertools.product(_sizes(cluster), repeat=len(groups)):
            if not _fits(sizes, cluster):
                continue
            start, pools = 0, []
            for s in sizes:
                pools.append(Pool(tuple(range(start, start + s))))
                start += s
            per_role = []
            for k, g in enumerate(groups):
                for name in g:
                    role = workload.role(name)
                    choices = []
                    engines = role.engines if role.trainable else role.engines[:1]
                    for lay, engine in itertools.product(_layouts(role.model, sizes[k], node), engines):
                        gens = list(_gen_layouts(role.model, lay, node, engine)) if role.generates else [None]
                        choices += [RolePlacement(name, k, lay, gl, engine) for gl in gens]
                    per_role.append(choices)
            for roles in itertools.product(*per_role):
                for offload in itertools.product([False, True], repeat=len(groups)):
                    cost = evaluate(Placement(tuple(pools), tuple(roles), offload), workload, cluster)
                    best = min(best, cost.iteration_s)
    return best


@st.composite
def small_instances(draw):
    node = draw(st.sampled_from([2, 4]))
    nodes = draw(st.integers(1, 2))
    cluster = ClusterSpec(name="mini", nodes=nodes, devices_per_node=node,
                          device_memory_bytes=draw(st.sampled_from([0.6e9, 1.2e9, 3e9])), peak_flops=1e14,
                          memory_bandwidth=1e12, intra_node_bandwidth=1e11, inter_node_bandwidth=1e10, host_bandwidth=1e10)

    def model(name):
        return ModelSpec(name=name, layers=draw(st.sampled_from([2, 4])), hidden=draw(st.sampled_from([512, 1024])),
                         heads=8, kv_heads=draw(st.sampled_from([2, 8])), intermediate=2048, vocab=32000)
    names = draw(st.sampled_from([("actor", "critic"), ("actor", "ref"), ("actor", "critic", "ref")]))
    engines = draw(st.sampled_from([("fsdp",), ("megatron",), ("fsdp", "megatron")]))
    roles = []
    for name in names:
        trainable = name != "ref"
        roles.append(RoleWork(name=name, model=model(name), trainable=trainable, generates=name == "actor",
                              infer_passes=1, train_epochs=int(trainable), mini_batches=draw(st.sampled_from([1, 2])),
                              engines=engines))
    gen = GenerationWork(prompts=draw(st.sampled_from([16, 64])), prompt_len=draw(st.sampled_from([128, 512])),
                         response_len=draw(st.sampled_from([128, 512])))
    return Workload(roles=tuple(roles), generation=gen), cluster


@settings(max_examples=40, deadline=None)
@given(small_instances())
def test_search_equals_brute_force(instance):
    workload, cluster = instance
    expected = brute_force(workload, cluster)
    if math.isinf(expected):
        with pytest.raises(PlacementError):
            search(workload, cluster)
        return
    found = search(workload, cluster, top_k=1).best
    assert found.iteration_s == pytest.approx(expected, rel=1e-9)
    assert found.cost == evaluate(found.placement, workload, cluster)
