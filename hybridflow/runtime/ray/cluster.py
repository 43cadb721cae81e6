"""Ray start-up and the device slots' reservations: one placement group per pool.

:func:`connect` joins the Ray instance the process already has, a cluster at
``address`` (``"auto"`` or ``"ray://host:port"``), or starts a local one.
:func:`reserve_pools` reserves one bundle per device of each pool — ``{"CPU":
c, "GPU": 1}`` on GPU clusters (or when tests give Ray virtual GPUs),
``{"CPU": c}`` otherwise — and waits until Ray can place every group, so a
cluster too small for the plan is a PlacementError naming the pool rather than
a hang.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Literal

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from ...compiler.plan import ExecutionPlan
from ...errors import PlacementError

__all__ = ["connect", "PoolReservation", "reserve_pools", "release_pools", "free_port", "DeviceResource"]

DeviceResource = Literal["auto", "GPU", "CPU"]


def connect(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Make sure Ray is initialised; returns True when this call started it (the caller shuts it down)."""
    if ray.is_initialized():
        return False
    # Ray replaces builtins.print in the driver once a worker logs a progress bar; keep this process's print.
    os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
    else:
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=True)
    return True


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class PoolReservation:
    """The placement group of each pool and the resources of each of its bundles (one per device slot)."""

    groups: dict[str, PlacementGroup]
    bundles: dict[str, dict[str, float]]

    def uses_gpu(self, pool: str) -> bool:
        return self.bundles[pool].get("GPU", 0) > 0


def _device_resource(resource: DeviceResource) -> str:
    if resource == "auto":
        return "GPU" if ray.cluster_resources().get("GPU", 0) >= 1 else "CPU"
    return resource


HOST_POOL_CPUS = 0.5
"""CPU resource of a slot of a host pool (rule rewards and costs: functions, no model)."""


def pool_bundle(devices: tuple[str, ...], resource: str, cpus_per_worker: float, *, host: bool = False) -> dict[str, float]:
    """One slot's bundle: a GPU (and CPUs) on GPU clusters, except for pools of host CPUs ('cpu' devices);
    half a CPU (at most ``cpus_per_worker``) for a host pool's function."""
    if host:
        return {"CPU": min(cpus_per_worker, HOST_POOL_CPUS)}
    if resource == "GPU" and any(d != "cpu" for d in devices):
        return {"CPU": cpus_per_worker, "GPU": 1.0}
    if cpus_per_worker <= 0:
        raise PlacementError("cpus_per_worker must be > 0 when slots reserve no GPU")
    return {"CPU": cpus_per_worker}


def reserve_pools(plan: ExecutionPlan, *, resource: DeviceResource = "auto", cpus_per_worker: float = 1.0,
                  timeout_s: float = 120.0) -> PoolReservation:
    """One PACKed placement group per pool, one bundle per device; PlacementError when Ray cannot place one."""
    kind = _device_resource(resource)
    from ...compiler.passes.placement import HOST

    bundles = {pool.name: pool_bundle(pool.devices, kind, cpus_per_worker, host=pool.name.split("_")[0] == HOST)
               for pool in plan.pools}
    groups: dict[str, PlacementGroup] = {}
    for pool in plan.pools:
        groups[pool.name] = placement_group([dict(bundles[pool.name]) for _ in pool.devices], strategy="PACK",
                                            name=f"hybridflow:{pool.name}")
    ready, _ = ray.wait([g.ready() for g in groups.values()], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        release_pools(PoolReservation(groups, bundles))
        need = {p.name: f"{len(p.devices)} x {bundles[p.name]}" for p in plan.pools}
        raise PlacementError(
            f"Ray could not reserve the plan's pools within {timeout_s:.0f} s: they need {need}, and the cluster has "
            f"{ {k: v for k, v in ray.available_resources().items() if k in ('CPU', 'GPU')} } free. Give Ray more resources (ray.init(num_cpus=..., num_gpus=...)), lower "
            "cpus_per_worker, or compile for fewer devices")
    return PoolReservation(groups, bundles)


def release_pools(reservation: PoolReservation) -> None:
    for group in reservation.groups.values():
        try:
            remove_placement_group(group)
        except Exception:  # already removed, or Ray already shut down
            pass
