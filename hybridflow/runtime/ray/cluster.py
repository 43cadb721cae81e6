"""Ray start-up and the device slots' reservations: one placement group per pool.

:func:`connect` joins the Ray instance the process already has, a cluster at
``address`` (``"auto"``, ``"host:port"`` or ``"ray://host:port"``), or starts a local one.
:func:`reserve_pools` reserves one bundle per device of each pool — ``{"CPU":
c, "GPU": 1}`` on GPU clusters (or when tests give Ray virtual GPUs),
``{"CPU": c}`` otherwise — each pinned to the Ray node its plan node is bound
to (:func:`pool_groups`), and waits until Ray can place every group, so a
cluster too small for the plan is a PlacementError naming the pool rather than
a hang. :func:`replace_lost_nodes` moves a plan node whose Ray node left the
cluster to one that joined (a restart after a lost machine); :func:`free_port`
and :func:`node_ip` give the rank-0 slot its rendezvous address.
"""
from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from ...compiler.plan import ExecutionPlan
from ...errors import ConfigError, PlacementError
from .warm import keeping_workers, pool_key, take

__all__ = ["connect", "check_reachable", "PoolReservation", "PoolLayout", "pool_groups", "reserve_pools", "release_pools", "free_port", "node_ip", "replace_lost_nodes",
           "DeviceResource"]

DeviceResource = Literal["auto", "GPU", "CPU"]
log = logging.getLogger("hybridflow.ray")


def connect(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Make sure Ray is initialised; returns True when this call started it (the caller shuts it down).

    ``address`` (else the ``RAY_ADDRESS`` environment variable): an existing cluster to join
    (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``); none, or ``local``: a new Ray instance on this
    machine with ``num_cpus``/``num_gpus``, even when another one runs here (so a run never
    joins a cluster it was not pointed at, and its resource figures are never refused).
    """
    if ray.is_initialized():
        return False
    # Ray replaces builtins.print in the driver once a worker logs a progress bar; keep this process's print.
    os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and address != "local":
        check_reachable(address)
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
    else:
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=True)
    return True


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """ConfigError unless something accepts a TCP connection at ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``;
    ``auto`` is Ray's to resolve). ``ray.init`` keeps retrying an address nothing answers at, for many minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(f"Ray cluster address {address!r}: nothing answers there ({err.strerror or err}); give the "
                          "head node's address that 'ray start --head' printed (its GCS port, 6379 by default), 'auto' "
                          "for the cluster started on this machine, or no address to start a Ray instance for the run"
                          ) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (an address of this machine), for a rendezvous there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def node_ip() -> str:
    """The IP address of the Ray node this process runs on (the one other nodes reach it by)."""
    return ray.util.get_node_ip_address()


@dataclass(frozen=True)
class PoolReservation:
    """The placement groups of each pool and the resources of each of its bundles (one per device slot).

    A pool has one group with a bundle per slot, or (on a one-node cluster, while slots are kept: see
    :func:`reserve_pools`) a group of one bundle per slot; :meth:`placement` says where each rank goes."""

    groups: dict[str, list[PlacementGroup]]
    bundles: dict[str, dict[str, float]]
    keys: dict[str, list[tuple]] = field(default_factory=dict)
    """Pool name -> the :func:`.warm.pool_key` of each of its groups (what a parked group must match)."""
    actors: dict[str, dict[int, Any]] = field(default_factory=dict)
    """Pool name -> rank -> the parked actor taken with its group (:mod:`.warm`); the other ranks start new ones."""

    def uses_gpu(self, pool: str) -> bool:
        return self.bundles[pool].get("GPU", 0) > 0

    def placement(self, pool: str, rank: int) -> tuple[PlacementGroup, int]:
        """The group and bundle index of ``pool``'s slot ``rank``."""
        groups = self.groups[pool]
        return (groups[0], rank) if len(groups) == 1 else (groups[rank], 0)

    def units(self, pool: str, size: int) -> list[tuple[tuple, PlacementGroup, list[int]]]:
        """The groups of ``pool`` (``size`` slots) as :func:`.warm.park` takes them: (key, group, its ranks)."""
        groups = self.groups[pool]
        if len(groups) == 1:
            return [(self.keys[pool][0], groups[0], list(range(size)))]
        return [(key, group, [rank]) for rank, (key, group) in enumerate(zip(self.keys[pool], groups))]


def _device_resource(resource: DeviceResource) -> str:
    if resource == "auto":
        return "GPU" if ray.cluster_resources().get("GPU", 0) >= 1 else "CPU"
    return resource


HOST_POOL_CPUS = 0.5
"""CPU resource of a slot of a host pool (rule rewards and costs: functions, no model)."""
ENV_WORKER_CPUS = 0.25
"""CPU resource of an environment worker (a plan's environment pool: one bundle per worker)."""


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


NODE_LABEL = "ray.io/node-id"
"""The label every Ray node carries with its id: a bundle's label selector on it pins the bundle to that node."""


@dataclass(frozen=True)
class PoolLayout:
    """How one pool's slots are reserved: a bundle per slot, where each must go, and the group's strategy."""

    bundle: dict[str, float]
    """The resources of each slot's bundle."""
    selectors: tuple[dict[str, str], ...]
    """Per slot: the label selector pinning its bundle to its plan node's Ray node (empty: anywhere)."""
    strategy: str


def pool_groups(plan: ExecutionPlan, kind: str, cpus_per_worker: float) -> dict[str, PoolLayout]:
    """Pool name -> its :class:`PoolLayout`.

    A plan bound to a Ray cluster (``plan.nodes``: the Ray node id of each plan node ``nK``) puts slot ``nK.dM``
    on Ray node K: its bundle carries the label selector ``ray.io/node-id = <id K>``. A pool whose slots are all
    on one plan node is STRICT_PACKed there; a pool spanning plan nodes is PACKed, each bundle on its own node
    (its process group then spans machines). Host pools and plans bound without node ids are PACKed wherever
    Ray finds room.
    """
    from ...compiler.machine import plan_node
    from ...compiler.passes.placement import HOST

    found = {}
    for pool in plan.pools:
        bundle = pool_bundle(pool.devices, kind, cpus_per_worker, host=pool.name.split("_")[0] == HOST)
        if pool.workers:  # an environment pool: a fractional-CPU bundle per environment worker
            bundle = {"CPU": min(cpus_per_worker, ENV_WORKER_CPUS)}
        nodes = [plan_node(slot) for slot in pool.slots]
        if not plan.nodes or None in nodes:
            found[pool.name] = PoolLayout(bundle, (), "PACK")
            continue
        beyond = sorted({n for n in nodes if n >= len(plan.nodes)})
        if beyond:
            raise PlacementError(f"pool {pool.name!r} is on plan node(s) {', '.join(f'n{n}' for n in beyond)}, but the "
                                 f"plan is bound to {len(plan.nodes)} Ray node(s); bind it to this cluster again")
        selectors = tuple({NODE_LABEL: plan.nodes[n]} for n in nodes)
        found[pool.name] = PoolLayout(bundle, selectors, "STRICT_PACK" if len(set(nodes)) == 1 else "PACK")
    return found


_GROUP_SERIAL = itertools.count()
"""Placement group names are unique in a Ray namespace, and a parked group keeps its name while another executor
of this process reserves: each group's name ends with a serial."""


def reserve_pools(plan: ExecutionPlan, *, resource: DeviceResource = "auto", cpus_per_worker: float = 1.0,
                  timeout_s: float = 120.0) -> PoolReservation:
    """One placement group per pool (:func:`pool_groups`), one bundle per device; PlacementError when Ray cannot
    place one.

    While slots are kept (:func:`.warm.keep_workers`) on a cluster of one Ray node, each slot of a device pool gets
    a group of its own instead: on one node a slot runs where it would have, and a parked slot can then serve any
    slot of its bundle's shape (a pool of two can take the slots of two pools of one). Elsewhere a pool's slots stay
    in one group, whose strategy (PACK, or STRICT_PACK on one plan node) keeps them together."""
    layout = pool_groups(plan, _device_resource(resource), cpus_per_worker)
    bundles = {name: pool.bundle for name, pool in layout.items()}
    keep = keeping_workers()
    split = keep and sum(1 for node in ray.nodes() if node.get("Alive")) == 1
    units: dict[str, list[tuple[tuple, int, tuple]]] = {}  # pool -> per group: (key, slots, label selectors)
    for pool in plan.pools:
        spec, size = layout[pool.name], pool.workers or len(pool.devices)
        if split and not pool.workers:  # environment pools are never parked: kept whole
            units[pool.name] = [(pool_key(spec.bundle, spec.selectors[rank:rank + 1], "PACK", 1), 1,
                                 spec.selectors[rank:rank + 1]) for rank in range(size)]
        else:
            units[pool.name] = [(pool_key(spec.bundle, spec.selectors, spec.strategy, size), size, spec.selectors)]
    wanted = {(pool.name, k): unit[0] for pool in plan.pools if not pool.workers
              for k, unit in enumerate(units[pool.name])}
    taken = take(wanted) if keep else {}
    groups: dict[str, list[PlacementGroup]] = {}
    actors: dict[str, dict[int, Any]] = {}
    for pool in plan.pools:
        spec, whole = layout[pool.name], len(units[pool.name]) == 1
        for k, (_, count, selectors) in enumerate(units[pool.name]):
            parked = taken.get((pool.name, k))
            if parked is not None:
                groups.setdefault(pool.name, []).append(parked.group)
                ranks = range(count) if whole else [k]
                actors.setdefault(pool.name, {}).update(zip(ranks, parked.actors))
                continue
            groups.setdefault(pool.name, []).append(placement_group(
                [dict(spec.bundle) for _ in range(count)], strategy=spec.strategy if whole else "PACK",
                name=f"hybridflow:{pool.name}{'' if whole else f'/rank{k}'}#{next(_GROUP_SERIAL)}",
                bundle_label_selector=[dict(s) for s in selectors] or None))
    every = [g for held in groups.values() for g in held]
    ready, _ = ray.wait([g.ready() for g in every], num_returns=len(every), timeout=timeout_s)
    if len(ready) < len(every):
        release_pools(PoolReservation(groups, bundles))
        need = {p.name: f"{p.workers or len(p.devices)} x {bundles[p.name]}" for p in plan.pools}
        pinned = f" on Ray nodes {', '.join(n[:8] for n in plan.nodes)}" if plan.nodes else ""
        raise PlacementError(
            f"Ray could not reserve the plan's pools{pinned} within {timeout_s:.0f} s: they need {need}, and the cluster has "
            f"{ {k: v for k, v in ray.available_resources().items() if k in ('CPU', 'GPU')} } free. Give Ray more resources (ray.init(num_cpus=..., num_gpus=...)), lower "
            "cpus_per_worker, or compile for fewer devices (a plan bound earlier needs the same Ray nodes alive: "
            "bind it again)")
    keys = {name: [unit[0] for unit in pool_units] for name, pool_units in units.items()}
    return PoolReservation(groups, bundles, keys, actors)


def replace_lost_nodes(plan: ExecutionPlan, *, timeout_s: float = 120.0, poll_s: float = 1.0) -> ExecutionPlan:
    """``plan`` with each plan node whose Ray node is gone moved to a live Ray node the plan does not use yet.

    For a restart after a lost node: the pools keep their shape, their bundles go to the replacement. Waits up
    to ``timeout_s`` for enough nodes to (re)join (``ray start --address=...`` on a new machine); PlacementError
    naming the lost nodes otherwise. Spare nodes with the most GPUs, then CPUs, are taken first.
    """
    if not plan.nodes:
        return plan
    deadline = time.monotonic() + timeout_s
    while True:
        alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        lost = [k for k, node_id in enumerate(plan.nodes) if node_id not in alive]
        if not lost:
            return plan
        spare = sorted((node_id for node_id in alive if node_id not in plan.nodes),
                       key=lambda i: (-alive[i]["Resources"].get("GPU", 0), -alive[i]["Resources"].get("CPU", 0), i))
        if len(spare) >= len(lost):
            nodes = list(plan.nodes)
            for k, node_id in zip(lost, spare):
                log.warning("plan node n%d: Ray node %s is gone; its slots move to Ray node %s at %s", k,
                            plan.nodes[k][:8], node_id[:8], alive[node_id].get("NodeManagerAddress", "?"))
                nodes[k] = node_id
            return plan.model_copy(update={"nodes": tuple(nodes)})
        if time.monotonic() >= deadline:
            raise PlacementError(
                f"plan node(s) {', '.join(f'n{k}' for k in lost)} ran on Ray node(s) "
                f"{', '.join(plan.nodes[k][:8] for k in lost)}, which left the cluster, and {len(spare)} spare node(s) "
                f"joined within {timeout_s:.0f} s (needed {len(lost)}). Start a node (ray start --address=HEAD:PORT) "
                "and resume the run (resume='auto')")
        time.sleep(poll_s)  # waiting for a node to join the cluster


def release_pools(reservation: PoolReservation) -> None:
    for group in (g for held in reservation.groups.values() for g in held):
        try:
            remove_placement_group(group)
        except Exception:  # already removed, or Ray already shut down
            pass
