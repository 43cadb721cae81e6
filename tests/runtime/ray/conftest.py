"""One Ray instance for every Ray test (start-up is the slow part), with 5 CPUs and 4 virtual GPUs.

The GPUs are Ray resources only: slots reserve "GPU" bundles, so placement groups and
per-worker GPU assignment run for real, while torch finds no CUDA and computes on CPU.
"""
from __future__ import annotations

import os

import pytest
import ray
import ray_testkit
import torch

from hybridflow.runtime.ray.warm import keep_workers, stop_parked

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Each Ray test module in a pytest-xdist group of its own (``ray-test_multinode``, ...): one worker runs the
    module, so its module-scoped fixtures (test_multinode's cluster and its PPO run) are built once. Different
    modules may run on the two workers at once, each worker with its own shared Ray instance (:func:`ray_cluster`).
    (tests/conftest.py turns the marks into groups: pytest-xdist 3.8 no longer can under pytest 9.)"""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.xdist_group(f"ray-{item.module.__name__.rsplit('.', 1)[-1]}"))


def start_shared_ray() -> None:
    """The shared instance: 5 CPUs and 4 virtual GPUs on one node (four model slots of one CPU and a GPU, and a
    host slot of half a CPU, fit beside each other: every model slot has the shape a parked one can serve)."""
    # Reward functions and helpers of the test kit run inside the workers, which cannot import test modules.
    ray.cloudpickle.register_pickle_by_value(ray_testkit)
    # (tests/conftest.py sets RAY_TQDM_PATCH_PRINT=0 for every Ray start of the session: other tests pickle print)
    # address="local": a Ray instance of the suite's own, even when another one runs on this machine (ray.init()
    # would join that one and refuse the resource figures)
    ray.init(address="local", num_cpus=5, num_gpus=4, include_dashboard=False, log_to_driver=False)
    # Executors that end healthy park their slots for the next executor of this process with the same pool shapes,
    # in this module or the next (hybridflow.runtime.ray.warm): a slot's start is ~4 s of imports, a step of these
    # tests ~0.05 s. A recycled slot computes what a new one does (test_warm_workers.py).
    # (HYBRIDFLOW_TEST_KEEP_WORKERS=0: every executor starts its own, to compare)
    keep_workers(os.environ.get("HYBRIDFLOW_TEST_KEEP_WORKERS", "1") != "0")


@pytest.fixture(scope="session")
def _shared_ray_session():
    """Stops this process's shared instance at the end of the session (if one runs then)."""
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_cluster(_shared_ray_session):
    """The shared instance, started by the first test of this process that asks for it, and again by the first one
    after a module that ran its own cluster (:func:`own_ray`): a worker whose last Ray module was test_multinode
    starts none it would not use (each start is ~5 s of CPU for Ray's processes)."""
    if not ray.is_initialized():
        start_shared_ray()
    return ray.cluster_resources()


@pytest.fixture
def ray_address(ray_cluster) -> str:
    """The shared instance's address, for a ``hybridflow run`` subprocess to join (``ray_address=...``) instead of
    starting a Ray instance of its own (~5 s of CPU for Ray's processes). This process's parked pools are stopped
    first: the subprocess cannot take them, and what they reserve could keep its pools from fitting."""
    stop_parked()
    return ray.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def own_ray():
    """For a module that starts a Ray cluster of its own (test_multinode): the shared instance, if this process
    has it, is stopped for the module; the next test that asks for :func:`ray_cluster` starts it again."""
    if ray.is_initialized():
        ray.shutdown()
    keep_workers(False)  # its tests count the cluster's free resources: nothing parked holds any
    yield
    if ray.is_initialized():
        ray.shutdown()
