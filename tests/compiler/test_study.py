"""Claims docs/cost_model.md makes about the HybridFlow Fig. 12 cells, checked on the placements themselves."""
from __future__ import annotations

import pytest

from hybridflow.compiler.cluster import ClusterSpec
from hybridflow.compiler.cost import CostOptions
from hybridflow.compiler.placement import evaluate, place_fixed
from hybridflow.compiler.workload import paper_workload


@pytest.fixture(scope="module")
def cell():
    """13B on 128 A100s, megatron engine, the paper's workload: colocate and split, as the search lays them out."""
    workload = paper_workload("llama2-13b", "paper").with_engines(("megatron",))
    cluster = ClusterSpec.preset("a100-80g", nodes=16)
    return workload, cluster, {s: place_fixed(s, workload, cluster) for s in ("colocate", "split")}


def test_a_per_decode_step_overhead_adds_the_same_to_colocate_and_split(cell):
    # both generate in one wave of 1024 decode steps, so a fixed time per step adds 1024·delta to each
    workload, cluster, fixed = cell
    delta = 0.01
    slower = cluster.model_copy(update={"decode_step_overhead_s": delta})
    for strategy, scored in fixed.items():
        before = evaluate(scored.placement, workload, cluster, CostOptions())
        after = evaluate(scored.placement, workload, slower, CostOptions())
        assert after.stage_s[0] - before.stage_s[0] == pytest.approx(workload.generation.response_len * delta), strategy
        assert after.stage_s[1:] == before.stage_s[1:]
    gap = fixed["split"].iteration_s - fixed["colocate"].iteration_s
    assert gap > 0  # colocate ahead, and by the same margin after
    after_gap = (evaluate(fixed["split"].placement, workload, slower).iteration_s
                 - evaluate(fixed["colocate"].placement, workload, slower).iteration_s)
    assert after_gap == pytest.approx(gap)


def test_split_loses_13b_on_generation_and_gains_on_training(cell):
    # the breakdown of the docs: split generates on half the GPUs (slower), trains actor and critic concurrently (faster)
    _, _, fixed = cell
    colocate, split = fixed["colocate"].cost.stage_s, fixed["split"].cost.stage_s
    assert split[0] > 1.5 * colocate[0]
    assert split[2] < colocate[2] and split[1] < colocate[1]
    assert (split[0] - colocate[0]) > (colocate[1] + colocate[2]) - (split[1] + split[2])
