"""The machine a plan runs on, and binding a compiled plan to it.

The compiler places roles on abstract device slots (``n0.d3``: node 0, device
3) of a :class:`~.cluster.ClusterSpec`. A run needs real devices, so

* :func:`local_machine` describes this machine: its CUDA devices, or, without
  one, ``cpu_slots`` CPU slots (each slot a share of the cores: on Ray one
  process per slot with ``threads_per_slot`` torch threads; the LocalExecutor
  runs every slot in its own process, one after another);
* :func:`ray_machine` describes the Ray cluster this process is connected to: its GPU nodes, or CPU slots
  spread over as many of its nodes as they need (:func:`cpu_nodes_machine`), each Ray node used a plan node;
* :meth:`Machine.cluster` is the ClusterSpec the compiler plans for (one node
  of ``slots`` devices; a CPU slot gets its share of the cores and memory);
* :func:`bind` maps the plan's slots to the machine's devices — ``n0.dK`` to
  ``cuda:K`` or to CPU slot K, a device map's ``cuda:N`` / ``cpu`` to itself —
  and says which pool needs what the machine lacks (:class:`BindError`); on
  Ray it also records which Ray node each plan node ``nK`` is
  (``plan.nodes``: Ray node ids; :func:`describe_nodes` says it in words), and
  the executor reserves each slot's bundle on its plan node's Ray node.

Executors accept only bound plans (``plan.machine`` is set). A bound pool keeps
the compiled slot names in :attr:`~.plan.PoolPlan.slots`, for drawings and errors.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from ..capabilities import RUNTIME_TRAIN_ENGINES
from ..errors import BindError, PlacementError
from .cluster import CLUSTER_PRESETS, ClusterSpec, detect_local_cpu
from .cost import CostOptions
from .plan import ExecutionPlan, verify_plan

if TYPE_CHECKING:
    from .compile import CompileReport

__all__ = ["Machine", "BindError", "local_machine", "ray_machine", "cpu_nodes_machine", "RayNode",
           "describe_nodes", "default_cpu_slots", "bind", "compile_for", "compile_report_for", "executable_options", "plan_node"]

_SLOT = re.compile(r"^n(\d+)\.d(\d+)$")
_CUDA = re.compile(r"^cuda:(\d+)$")


@dataclass(frozen=True)
class Machine:
    """``nodes`` x ``slots`` devices of one ``kind``, where a run executes."""

    kind: Literal["cpu", "cuda"]
    slots: int
    """Devices per node: CUDA devices, or CPU slots."""
    nodes: int = 1
    threads_per_slot: int | None = None
    """torch threads of each CPU slot (None on CUDA)."""
    where: Literal["local", "ray"] = "local"
    gpu_name: str = ""
    node_addresses: tuple[str, ...] = ()
    """On Ray: the IP address of the Ray node that plan node ``nK`` binds to, for each K (empty: any node)."""
    node_ids: tuple[str, ...] = ()
    """On Ray: the id of the Ray node that plan node ``nK`` binds to (several raylets may share one address)."""

    def device(self, node: int, index: int) -> str:
        """The torch device of slot ``index`` of node ``node`` (``cuda:K`` or ``cpu``)."""
        return f"cuda:{index}" if self.kind == "cuda" else "cpu"

    def describe(self) -> str:
        """``local: 2 CPU slots of 1 thread`` or ``ray: 1 x 8 CUDA devices (NVIDIA H100)``."""
        if self.kind == "cuda":
            what = f"{self.slots} CUDA device{'s' if self.slots != 1 else ''}" + (f" ({self.gpu_name})" if self.gpu_name else "")
        else:
            threads = f" of {self.threads_per_slot} thread{'s' if self.threads_per_slot != 1 else ''}" if self.threads_per_slot else ""
            what = f"{self.slots} CPU slot{'s' if self.slots != 1 else ''}{threads}"
        nodes = f"{self.nodes} x " if self.nodes > 1 else ""
        return f"{self.where}: {nodes}{what}"

    def cluster(self) -> ClusterSpec:
        """The cluster the compiler plans for: a GPU preset matched by name, or this CPU cut into slots."""
        if self.kind == "cuda":
            return _gpu_cluster(self)
        cpu = detect_local_cpu()
        share = 1 / self.slots
        return cpu.model_copy(update={
            "name": f"{self.where}-cpu", "nodes": self.nodes, "devices_per_node": self.slots,
            "device_memory_bytes": cpu.device_memory_bytes * share, "peak_flops": cpu.peak_flops * share,
            "memory_bandwidth": cpu.memory_bandwidth * share})


def _gpu_cluster(machine: Machine) -> ClusterSpec:
    """A datasheet preset for the GPU model (A100 80G, H100, H200), else A100 figures with the device's memory."""
    name = machine.gpu_name.lower()
    key = "h200" if "h200" in name else "h100-80g" if "h100" in name else "a100-80g"
    base = CLUSTER_PRESETS[key]
    update = {"name": f"{machine.where}-{key}", "nodes": machine.nodes, "devices_per_node": machine.slots}
    memory = _cuda_memory()
    if memory:
        update["device_memory_bytes"] = float(memory)
    return base.model_copy(update=update)


def _cuda_memory() -> int | None:
    try:
        import torch

        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    except Exception:  # no driver
        return None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_cpu_slots(where: Literal["local", "ray"]) -> int:
    """CPU slots when the config gives none: 1 for the LocalExecutor (its slots share one process, so more
    slots give more pools, not more speed); on Ray up to 4 processes sharing the cores (2 on a 2-core machine)."""
    return 1 if where == "local" else max(1, min(4, _cores()))


def local_machine(cpu_slots: int | None = None, *, where: Literal["local", "ray"] = "local") -> Machine:
    """This machine: its CUDA devices if torch sees any, else ``cpu_slots`` CPU slots (default: :func:`default_cpu_slots`)."""
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        gpus = 0
    if gpus:
        import torch

        return Machine("cuda", gpus, where=where, gpu_name=torch.cuda.get_device_name(0))
    slots = cpu_slots or default_cpu_slots(where)
    if slots < 1:
        raise PlacementError(f"cpu_slots must be >= 1, got {slots}")
    return Machine("cpu", slots, threads_per_slot=max(1, _cores() // slots), where=where)


def ray_machine(cpu_slots: int | None = None) -> Machine:
    """The connected Ray cluster: its GPUs (per node of the GPU nodes), else CPU slots on as many of its nodes as
    they need (:func:`cpu_nodes_machine`)."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    alive.sort(key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]))
    gpu_nodes = [n for n in alive if n["Resources"].get("GPU", 0) >= 1]
    if gpu_nodes:
        return Machine("cuda", min(int(n["Resources"]["GPU"]) for n in gpu_nodes), nodes=len(gpu_nodes), where="ray",
                       node_addresses=tuple(n["NodeManagerAddress"] for n in gpu_nodes),
                       node_ids=tuple(n["NodeID"] for n in gpu_nodes))
    return cpu_nodes_machine([RayNode(n["NodeID"], n.get("NodeManagerAddress", ""), int(n["Resources"].get("CPU", 0)),
                                      "node:__internal_head__" in n["Resources"]) for n in alive], cpu_slots)


@dataclass(frozen=True)
class RayNode:
    """What :func:`cpu_nodes_machine` needs to know of one Ray node."""

    node_id: str
    address: str
    cpus: int
    head: bool = False


HOST_CPUS = 1
"""CPUs of a CPU cluster left to the host pools (rule rewards and costs, half a CPU each)."""


def cpu_nodes_machine(nodes: list[RayNode], cpu_slots: int | None = None) -> Machine:
    """CPU slots on the fewest Ray nodes that hold them: each node used is a plan node ``nK`` with ``s`` slots.

    ``cpu_slots`` (default: up to 4, at most the cluster's CPUs but :data:`HOST_CPUS`) slots are wanted. With
    ``k`` nodes each gets ``s = ceil(slots / k)`` (so the total is rounded up to a multiple of ``k``); the first
    ``k`` (1, 2, ...) for which the ``k`` largest nodes each have ``s`` CPUs and the cluster still has
    :data:`HOST_CPUS` spare is used. Ties prefer worker nodes to the head (the driver's node). A slot gets
    ``threads_per_slot`` CPUs (the smallest node used decides). A cluster that holds the slots nowhere gets them
    on every node anyway, and the reservation says what is missing.
    """
    usable = sorted((n for n in nodes if n.cpus >= 1), key=lambda n: (-n.cpus, n.head, n.address, n.node_id))
    if not usable:
        raise PlacementError("the Ray cluster has no node with a CPU; start its nodes with --num-cpus >= 1")
    total = sum(n.cpus for n in usable)
    wanted = cpu_slots or max(1, min(4, total - HOST_CPUS))
    for k in range(1, len(usable) + 1):
        per_node = -(-wanted // k)
        chosen = usable[:k]
        if all(n.cpus >= per_node for n in chosen) and total - k * per_node >= HOST_CPUS:
            break
    else:
        k, per_node, chosen = len(usable), -(-wanted // len(usable)), usable
    if k == 1:  # as on one machine: the node's CPUs but the host pools' share
        threads = max(1, (chosen[0].cpus - HOST_CPUS) // per_node)
    else:
        threads = max(1, min(n.cpus // per_node for n in chosen))
        while threads > 1 and total - k * per_node * threads < HOST_CPUS:
            threads -= 1
    return Machine("cpu", per_node, nodes=k, threads_per_slot=threads, where="ray",
                   node_addresses=tuple(n.address for n in chosen), node_ids=tuple(n.node_id for n in chosen))


def describe_nodes(machine: Machine) -> str:
    """Which Ray node each plan node is: ``n0 -> Ray node 4ecf536e at 10.0.0.2, n1 -> ...`` (or 'any node')."""
    if not machine.node_ids and not machine.node_addresses:
        return "plan nodes on any Ray node"
    ids = machine.node_ids or ("",) * len(machine.node_addresses)
    addresses = machine.node_addresses or ("?",) * len(ids)
    return ", ".join(f"n{k} -> Ray node {node_id[:8]} at {address}" for k, (node_id, address) in enumerate(zip(ids, addresses)))


def bind(plan: ExecutionPlan, machine: Machine) -> ExecutionPlan:
    """``plan`` with every pool's devices replaced by the machine's (module docstring); BindError if it lacks some.

    A plan whose roles train with an engine hybridflow's runtime does not have
    (``train_engine`` megatron: a cost study), or shard a model with tensor or pipeline parallelism (the runtime
    runs data parallelism only), is refused here, before any executor.
    """
    foreign = [f"{p.role} ({p.train_engine})" for p in plan.placements if p.train_engine not in RUNTIME_TRAIN_ENGINES]
    if foreign:
        raise BindError(f"the plan trains {', '.join(foreign)} with an engine hybridflow's runtime does not run "
                        f"(it runs {', '.join(RUNTIME_TRAIN_ENGINES)}); such a plan is a cost study: compile with engines=("
                        + ", ".join(repr(e) for e in RUNTIME_TRAIN_ENGINES) + ",) to run it")
    parallel = [f"{p.role} {what} {layout}" for p in plan.placements
                for what, layout in (("training", p.layout), ("generation", p.generation_layout))
                if layout is not None and (layout.tp > 1 or layout.pp > 1)]
    if parallel:
        raise BindError(f"the plan shards {', '.join(parallel)} with tensor or pipeline parallelism, which hybridflow's "
                        "runtime does not run (it runs data parallelism with FSDP2); such a plan is a cost study. "
                        "Place the roles with layouts dpN·tp1·pp1 (e.g. 'actor(dp2,tp1,pp1)+ref@2;...') or let "
                        "placement auto choose: compiled for this machine (hybridflow compile CONFIG.yaml --cluster "
                        "local|ray) it considers data-parallel layouts only")
    pools, problems = [], []
    for pool in plan.pools:
        slots = pool.slots or pool.devices
        devices, missing = [], []
        for name in slots:
            device = _bind_device(name, machine)
            if device is None:
                missing.append(name)
            devices.append(device)
        if missing:
            problems.append(f"pool {pool.name!r} ({', '.join(plan.roles_on(pool.name)) or 'generation'}) needs "
                            f"{len(slots)} device(s) {', '.join(slots)}; {', '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not on this machine")
            continue
        pools.append(pool.model_copy(update={"devices": tuple(devices), "slots": tuple(slots)}))
    if problems:
        raise BindError(f"the plan (compiled for {plan.cluster}) does not fit {machine.describe()}: " + "; ".join(problems)
                        + ". Compile for this machine (hybridflow compile --cluster local, or placement=... in the "
                        "config) or run it where those devices exist")
    bound = plan.model_copy(update={"pools": tuple(pools), "machine": machine.describe(),
                                    "nodes": machine.node_ids})
    verify_plan(bound, after="bind")
    return bound


def plan_node(slot: str) -> int | None:
    """The plan node K of a slot name ``nK.dM``; None for a named device (``cpu``, ``cuda:1``)."""
    match = _SLOT.match(slot)
    return int(match.group(1)) if match else None


def executable_options(options: CostOptions | None) -> CostOptions:
    """``options`` restricted to what hybridflow's runtime executes: data-parallel layouts only (FSDP2)."""
    return (options or CostOptions()).model_copy(update={"data_parallel_only": True})


def compile_report_for(graph, models, *, machine: Machine | None = None, cluster: ClusterSpec | None = None,
                       placement="colocate", staleness: int = 0, batch=None, options: CostOptions | None = None,
                       engines: tuple[str, ...] = RUNTIME_TRAIN_ENGINES, debug: bool | None = None,
                       hooks: tuple = (), bound: bool = True, allow_uncorrected_staleness: bool = False) -> CompileReport:
    """Compile for ``machine`` (default: :func:`local_machine`) a plan its runtime executes, and :func:`bind` it.

    The one path from a graph to a plan an executor runs (the trainer's run spec, ``hybridflow compile
    --cluster local|ray`` and :func:`compile_for` take it). ``cluster``: the machine's cluster as the cost model
    sees it (calibrated; default :meth:`Machine.cluster`). ``models`` is what :func:`~.compile.compile` takes;
    reward and cost roles it does not name are rule functions (``"rule"``, costing nothing) rather than copies of
    the actor's model. Only layouts the runtime runs are considered (:func:`executable_options`). The report's
    plan is bound, unless ``bound`` is False (a plan for a cluster preset: the run that executes it binds it).
    """
    from .compile import as_graph, compile_report
    from .passes.lower import actor_role

    machine = machine or local_machine()
    graph = as_graph(graph)
    if not isinstance(models, dict):
        models = {actor_role(graph): models}
    models = {**{r.name: "rule" for r in graph.roles if r.kind in ("reward", "cost")}, **models}
    report = compile_report(graph, cluster or machine.cluster(), models, placement=placement, staleness=staleness,
                            batch=batch, options=executable_options(options), engines=engines, debug=debug,
                            hooks=hooks, allow_uncorrected_staleness=allow_uncorrected_staleness)
    return replace(report, plan=bind(report.plan, machine)) if bound else report


def compile_for(graph, models, *, machine: Machine | None = None, placement="colocate", staleness: int = 0,
                batch=None, options=None) -> ExecutionPlan:
    """:func:`compile_report_for`'s bound plan: a plan an executor runs."""
    return compile_report_for(graph, models, machine=machine, placement=placement, staleness=staleness, batch=batch,
                              options=options).plan


def _bind_device(name: str, machine: Machine) -> str | None:
    """The device of one plan device name on ``machine``, None when the machine has no such device."""
    slot = _SLOT.match(name)
    if slot:
        node, index = int(slot.group(1)), int(slot.group(2))
        return machine.device(node, index) if node < machine.nodes and index < machine.slots else None
    cuda = _CUDA.match(name)
    if cuda:
        return name if machine.kind == "cuda" and int(cuda.group(1)) < machine.slots else None
    if name == "cpu":
        return "cpu"
    if name == "mps":
        try:
            import torch

            return name if torch.backends.mps.is_available() else None
        except Exception:
            return None
    return None
