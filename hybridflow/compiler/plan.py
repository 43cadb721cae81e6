"""The ExecutionPlan: the compiled artifact every executor runs.

A plan says, for one training iteration of one graph:

* **pools** — named groups of devices (``cpu``, ``cuda:0``, or cluster slots
  ``n0.d3``) and which roles live on each (roles in one pool are colocated);
* **placements** — per role: its pool and its parallel layout (dp, tp, pp), and
  for a policy that generates, a separate generation layout;
* **ops** — what runs, in order: graph nodes (``node``), and the transitions the
  compiler inserted (``weight_sync``, ``offload``, ``onload``), each with the
  ops it depends on and its predicted start/end (seconds from the iteration's
  start) and peak memory; plans derived from a training plan for the controller's
  other requests (:mod:`.control`: checkpoint, restore, export, ...) hold the
  control kinds too (:data:`CONTROL_KINDS`), whose run-time argument (a folder, a
  reward source) is given when the plan is run, not stored in it;
* ``staleness`` — 0: on-policy; k > 0: generation of iteration i+k may overlap
  this iteration's training (ops with ``iteration_offset`` > 0).

The graph travels inside the plan, so a plan file alone is enough to run, draw
or inspect: ``plan.graph`` is the :class:`~hybridflow.graph.Graph` record, parsed
once when a plan is read and written in its JSON form only when the plan is. Plans are frozen pydantic models with a
version; :func:`verify_plan` checks their invariants and is run after every
compiler pass in tests and debug mode.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, ValidationError, WithJsonSchema

from ..errors import GraphError, PlanError
from ..graph import Graph
from ..graph.serialize import graph_from_dict, graph_to_dict
from ..graph.staleness import Edge, edge_lags
from .engine import DEFAULT_ENGINE, TrainEngine

__all__ = ["PLAN_VERSION", "OP_KINDS", "CONTROL_KINDS", "STATE_ITEMS", "PoolPlan", "LayoutPlan", "RolePlacement", "PlanOp", "ExecutionPlan", "read_plan", "verify_plan"]

PLAN_VERSION = 1
CONTROL_KINDS = ("save_state", "load_state", "set_reward", "export", "describe")
"""What the controller asks of a role's workers besides the iteration's work (:mod:`.control`):

* ``save_state`` / ``load_state`` — write / read what a slot holds of the role's state under a checkpoint
  folder: its train engine's shards (item ``train``: the roles the graph updates) and whatever else its
  engines keep (the rollout engine's sampling RNG; see ``hybridflow.runtime.worker``);
* ``set_reward`` — build the role's reward source anew from a spec (``trainer.set_reward_model``);
* ``export`` — the role's trained model, gathered on the pool's rank 0 (item ``optimizer``: its whole train state);
* ``describe`` — what the role's engines are (types, sampling settings, train settings): a report.
"""
OP_KINDS = ("node", "weight_sync", "offload", "onload", *CONTROL_KINDS)
OFFLOAD_ITEMS = ("params", "optimizer", "grads", "kv_cache")
STATE_ITEMS = ("train",)
"""save_state / load_state items: the train engine's shards (the rest of a slot's state always goes along)."""
OP_ITEMS = {"offload": OFFLOAD_ITEMS, "onload": OFFLOAD_ITEMS, "save_state": STATE_ITEMS, "load_state": STATE_ITEMS,
            "export": ("optimizer",)}
"""Op kind -> the items its ops may name (kinds not listed name none)."""


def _graph_record(value: Any) -> Graph:
    """A plan's graph: a Graph record as it is, its JSON form (a dict, from a plan file) parsed.

    A malformed form is a ValueError, which pydantic reports as the plan's: ``from_json`` makes it a PlanError.
    """
    if isinstance(value, Graph):
        return value
    try:
        return graph_from_dict(value)
    except GraphError as err:
        raise ValueError(str(err)) from None


PlanGraph = Annotated[Graph, PlainValidator(_graph_record), PlainSerializer(graph_to_dict, return_type=dict),
                      WithJsonSchema({"type": "object", "description": "hybridflow.graph JSON form"})]
"""A Graph record in a plan; its JSON form (:func:`hybridflow.graph.serialize.graph_to_dict`) in the plan's."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PoolPlan(_Frozen):
    """A group of devices that the roles placed on it share."""

    name: str = Field(description="Pool name, unique in the plan (e.g. 'pool0', 'cpu').")
    devices: tuple[str, ...] = Field(description="Device names: 'cpu', 'cuda:N', or cluster slots 'nN.dM'.")
    memory_bytes: int | None = Field(None, description="Memory of each device, when known (bytes).")
    offload: bool = Field(False, description="The roles on this pool do not fit together: each one's states go to host memory between its uses (offload/onload ops).")
    slots: tuple[str, ...] = Field((), description="Bound plans: the compiled device names ('n0.d3') that ``devices`` now binds to real devices.")
    workers: int | None = Field(None, ge=1, description="Environment pools (``env`` / ``env_<role>``: the environment workers of a generating role's multi-turn rollouts): how many environment worker processes it runs, each holding whole samples' environments (reset and every step of a sample on one worker); on Ray each is an actor on a fractional-CPU host bundle, locally they are the rollout's own thread pool. None: a device pool (one worker per device).")


class LayoutPlan(_Frozen):
    """dp x tp x pp: data-parallel replicas x tensor-parallel ranks x pipeline stages."""

    dp: int = Field(1, ge=1, description="Data-parallel replicas.")
    tp: int = Field(1, ge=1, description="Tensor-parallel ranks (within a node).")
    pp: int = Field(1, ge=1, description="Pipeline stages.")

    @property
    def size(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        return f"dp{self.dp}·tp{self.tp}·pp{self.pp}"


class RolePlacement(_Frozen):
    """Where one role runs and how its model is split."""

    role: str = Field(description="Role name from the graph.")
    pool: str = Field(description="Name of the pool the role runs on.")
    layout: LayoutPlan = Field(default_factory=LayoutPlan, description="Layout for training and inference.")
    train_engine: TrainEngine = Field(DEFAULT_ENGINE, description="Training engine holding the role's states: fsdp (ZeRO-3, what hybridflow's runtime runs) or megatron (Megatron-core, distributed optimizer; cost studies only, refused by bind). See hybridflow.compiler.engine.")
    generation_layout: LayoutPlan | None = Field(None, description="Layout of the rollout engine (policies that generate); None = same as layout.")
    generation_pool: str | None = Field(None, description="Pool of the rollout engine when it is not the role's own pool (weights are broadcast to it); None = the role's pool (hybrid engine).")
    memory_bytes: int | None = Field(None, description="Predicted peak memory of this role per device (bytes).")
    rollout_engine: str | None = Field(None, description="Policies that generate: the rollout engine that runs the role's generate nodes (a name in hybridflow.runtime.engines.registry: 'hf', 'vllm'); None: the role does not generate.")
    env_pool: str | None = Field(None, description="Policies with multi-turn rollouts (generate nodes with env=): the environment pool (a pool with ``workers``) whose workers run the environments' reset and step; None: no environment.")


class PlanOp(_Frozen):
    """One step of the schedule."""

    name: str = Field(description="Unique op name (the node name for node ops).")
    kind: Literal["node", "weight_sync", "offload", "onload", "save_state", "load_state", "set_reward", "export",
                  "describe"] = Field(description="What the op does (control kinds: see CONTROL_KINDS).")
    role: str = Field(description="Role the op acts on ('controller' for compute nodes).")
    pool: str | None = Field(None, description="Pool the op runs on; None for controller ops.")
    node: str | None = Field(None, description="Graph node this op runs (node ops only).")
    deps: tuple[str, ...] = Field((), description="Ops that must finish before this one starts.")
    items: tuple[str, ...] = Field((), description="offload/onload: what moves (params, optimizer, grads, kv_cache); save_state/load_state: train to save the train engine's shards too; export: optimizer to add the whole train state.")
    iteration_offset: int = Field(0, ge=0, description="0: this iteration; k: the op works for iteration i+k (overlap).")
    predicted_start_s: float = Field(0.0, ge=0.0, description="Predicted start, seconds from the iteration start.")
    predicted_end_s: float = Field(0.0, ge=0.0, description="Predicted end, seconds from the iteration start.")
    volume_bytes: int | None = Field(None, description="weight_sync: bytes each receiving device gets; offload/onload: bytes moved per device.")
    peak_memory_bytes: int | None = Field(None, description="Predicted peak memory of one device of the op's pool while the op runs (bytes).")
    target_pool: str | None = Field(None, description="weight_sync across pools: the pool that receives the weights (None: within the op's pool).")
    rank_groups: tuple[tuple[int, ...], ...] = Field((), description="weight_sync within a pool: the micro-DP groups (pool-local ranks) that all-gather together (HybridFlow §5).")
    note: str = Field("", description="Free text shown in drawings (e.g. 'hybrid engine: micro-dp groups of 2').")
    env_pool: str | None = Field(None, description="generate node ops with env=: the environment pool whose workers run the samples' environment steps (tool calls) while the op runs; None: no environment.")
    stream: bool = Field(False, description="generate node ops: run streamed (config stream_rollouts): the rollout hands back each prompt group as its responses end, and the row- and group-wise ops after it run on each group as it arrives, joined in prompt order before the first batch-wise op (hybridflow.runtime.streaming).")
    reuse: str | None = Field(None, description="logprob node ops: served on the controller from this generate node's rollout log-probs (the same module and precision sampled them; compiler pass 'reuse'), with no forward pass.")


class ExecutionPlan(_Frozen):
    """The compiled plan of one graph on one cluster; see the module docstring."""

    version: int = Field(PLAN_VERSION, description="Plan format version.")
    graph: PlanGraph = Field(description="The graph the plan runs (a hybridflow.graph.Graph; its JSON form in the plan's).")
    cluster: str = Field(description="Cluster description, e.g. 'cpu-local' or 'a100-80g:2'.")
    strategy: str = Field("manual", description="How the placement was chosen: manual, colocate, split, standalone, auto.")
    pools: tuple[PoolPlan, ...] = Field(description="Device pools.")
    placements: tuple[RolePlacement, ...] = Field(description="One per role of the graph.")
    ops: tuple[PlanOp, ...] = Field(description="The schedule: ops in an order that respects deps.")
    staleness: int = Field(0, ge=0, description="Generation may run this many iterations ahead of training.")
    predicted_iteration_s: float | None = Field(None, description="Predicted time of one iteration, seconds.")
    machine: str | None = Field(None, description="The machine the plan is bound to (hybridflow.compiler.bind); None: compiled, not bound. Executors run only bound plans.")
    nodes: tuple[str, ...] = Field((), description="Bound to a Ray cluster: the id of the Ray node that plan node nK runs on, for each K (empty: Ray chooses).")

    # -- access ---------------------------------------------------------------
    def placement(self, role: str) -> RolePlacement:
        for placement in self.placements:
            if placement.role == role:
                return placement
        raise PlanError(f"the plan places no role {role!r}; it places {', '.join(p.role for p in self.placements)}")

    def pool(self, name: str) -> PoolPlan:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise PlanError(f"the plan has no pool {name!r}; its pools are {', '.join(p.name for p in self.pools)}")

    def roles_on(self, pool: str) -> tuple[str, ...]:
        return tuple(p.role for p in self.placements if p.pool == pool)

    def edge_lags(self) -> dict[Edge, int]:
        """The maximal policy lag of every edge of the graph as this plan runs it: each node at its ops'
        iteration offset (generation ahead by ``staleness``); see :mod:`hybridflow.graph.staleness`."""
        offsets: dict[str, int] = {}
        for op in self.ops:
            if op.kind == "node" and op.node is not None:
                offsets[op.node] = max(offsets.get(op.node, 0), op.iteration_offset)
        return edge_lags(self.graph, offsets=offsets)

    def upstream(self, op: str) -> set[str]:
        """The names of the ops that op ``op`` waits on, directly or through others (its deps, transitively)."""
        deps = {o.name: o.deps for o in self.ops}
        if op not in deps:
            raise PlanError(f"the plan has no op {op!r}; its ops are {', '.join(deps)}")
        seen, todo = set(), list(deps[op])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += deps[name]
        return seen

    # -- forms ------------------------------------------------------------------
    def to_json(self, *, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "ExecutionPlan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise PlanError(f"not a plan: invalid JSON ({err})") from None
        if isinstance(data, dict) and data.get("format") == "hybridflow.graph":
            raise PlanError("this is a graph (Graph.to_json), not an ExecutionPlan: give it as algorithm=FILE to train "
                            "it, or compile it first (hybridflow compile FILE -o PLAN.json) and give plan=PLAN.json")
        if isinstance(data, dict) and data.get("version") not in (None, PLAN_VERSION):
            raise PlanError(f"plan version {data.get('version')!r} is not supported; this hybridflow reads version {PLAN_VERSION}")
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise PlanError(f"not a valid plan: {err}") from None

    def to_text(self) -> str:
        """A readable dump: pools, placements, then the schedule one op per line (sizes in GiB, times in s)."""
        lines = [f"plan v{self.version}  graph={self.graph.name}  cluster={self.cluster}  "
                 f"strategy={self.strategy}  staleness={self.staleness}"]
        if self.predicted_iteration_s is not None:
            lines[0] += f"  predicted_iteration={self.predicted_iteration_s:.4g}s"
        if self.machine:
            lines[0] += f"  bound to {self.machine}"
        for pool in self.pools:
            gen = [f"{p.role} (generation)" for p in self.placements if p.generation_pool == pool.name]
            roles = ", ".join(self.roles_on(pool.name) + tuple(gen)) or "-"
            memory = f" x {_gib(pool.memory_bytes)}" if pool.memory_bytes else ""
            flag = " offload" if pool.offload else ""
            bound = f" = {_devices(pool.slots)}" if pool.slots else ""
            if pool.workers:
                roles = ", ".join(f"{p.role} (environments)" for p in self.placements if p.env_pool == pool.name) or "-"
                flag += f" {pool.workers} env worker(s)"
            lines.append(f"pool {pool.name} [{_devices(pool.devices)}{bound}]{memory}{flag}: {roles}")
        for p in self.placements:
            gen = f" [{p.train_engine}]" if p.train_engine != "fsdp" else ""  # the training engine, when not the runtime's
            gen += f"  generate {p.generation_layout}" if p.generation_layout else ""
            gen += f" on {p.generation_pool}" if p.generation_pool else ""
            memory = f"  peak {_gib(p.memory_bytes)}" if p.memory_bytes is not None else ""
            memory += f"  rollout {p.rollout_engine}" if p.rollout_engine not in (None, "hf") else ""
            lines.append(f"place {p.role} -> {p.pool}  {p.layout}{gen}{memory}")
        lines.extend(_op_line(op) for op in self.ops)
        return "\n".join(lines) + "\n"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.4g} GiB"


def _devices(devices: tuple[str, ...]) -> str:
    """All names for up to 4 devices, else ``first..last (count)``."""
    if len(devices) <= 4:
        return ", ".join(devices)
    return f"{devices[0]}..{devices[-1]} ({len(devices)})"


def _op_line(op: PlanOp) -> str:
    what = op.node if op.kind == "node" else op.kind + (f"({', '.join(op.items)})" if op.items else "")
    where = (op.pool or "controller") + (f"->{op.target_pool}" if op.target_pool else "")
    line = f"op {op.name}: {what} on {op.role}@{where}  t={op.predicted_start_s:.4g}..{op.predicted_end_s:.4g}s"
    if op.reuse:
        line += f"  from {op.reuse}'s rollout"
    if op.env_pool:
        line += f"  env steps on {op.env_pool}"
    if op.stream:
        line += "  streamed"
    if op.deps:
        line += f"  after {', '.join(op.deps)}"
    if op.iteration_offset:
        line += f"  [iteration+{op.iteration_offset}]"
    if op.volume_bytes is not None:
        line += f"  moves {_gib(op.volume_bytes)}"
    if op.peak_memory_bytes is not None:
        line += f"  peak {_gib(op.peak_memory_bytes)}"
    if op.rank_groups:
        line += f"  groups {len(op.rank_groups)}x{len(op.rank_groups[0])}"
    return line + (f"  # {op.note}" if op.note else "")


def read_plan(text: str) -> ExecutionPlan:
    """A plan from its JSON form, checked as the compiler checks its own output.

    Its graph is validated with the DSL's checks (:func:`hybridflow.graph.validate`: a
    GraphValidationError naming the node), then the plan with :func:`verify_plan` (PlanError).
    """
    from ..graph.validate import validate

    plan = ExecutionPlan.from_json(text)
    validate(plan.graph)
    verify_plan(plan)
    return plan


def _named(*pools: str | None) -> list[str]:
    """The pools given, less the absent ones (None; an empty name is a name, and unknown)."""
    return [pool for pool in pools if pool is not None]


def verify_plan(plan: ExecutionPlan, *, after: str | None = None) -> None:
    """Check the plan's invariants; raise :class:`PlanError` naming the pass ``after`` that broke one.

    Invariants: unique pool/op names; every graph role placed exactly once on an
    existing pool, its layout (and generation layout, on its generation pool)
    using exactly the pool's devices; every graph node run by exactly one node
    op whose role matches; every dep names an earlier op (the order respects
    dependencies) and every graph edge is a dep path; offload/onload items
    known; predicted end >= start; a weight sync's rank groups partition its
    pool's ranks; an op's predicted peak memory fits its pool's devices.
    """
    where = f" (broken by pass {after!r})" if after else ""

    def fail(message: str) -> None:
        raise PlanError(message + where)

    graph = plan.graph
    pools = {p.name: p for p in plan.pools}
    if len(pools) != len(plan.pools):
        fail("two pools share a name")
    placed = [p.role for p in plan.placements]
    for role in graph.roles:
        if placed.count(role.name) != 1:
            fail(f"role {role.name!r} is placed {placed.count(role.name)} times; place every role exactly once")
    for p in plan.placements:
        for pool in _named(p.pool, p.generation_pool):
            if pool not in pools:
                fail(f"role {p.role!r} is placed on unknown pool {pool!r}")
            if pools[pool].workers:
                fail(f"role {p.role!r} is placed on environment pool {pool!r}; roles go on device pools")
        if p.env_pool is not None and (p.env_pool not in pools or not pools[p.env_pool].workers):
            fail(f"role {p.role!r}: env_pool {p.env_pool!r} is not an environment pool of the plan (a pool with workers)")
        for layout, pool in ((p.layout, p.pool), (p.generation_layout, p.generation_pool or p.pool)):
            if layout is not None and layout.size != len(pools[pool].devices):
                fail(f"role {p.role!r}: layout {layout} uses {layout.size} devices but pool {pool!r} has {len(pools[pool].devices)}")
    seen: dict[str, PlanOp] = {}
    node_ops: dict[str, str] = {}
    for op in plan.ops:
        if op.name in seen:
            fail(f"two ops are named {op.name!r}")
        for dep in op.deps:
            if dep not in seen:
                fail(f"op {op.name!r} depends on {dep!r}, which is not an earlier op")
        for pool in _named(op.pool, op.target_pool):
            if pool not in pools:
                fail(f"op {op.name!r} runs on unknown pool {pool!r}")
        if op.env_pool is not None and (op.env_pool not in pools or not pools[op.env_pool].workers):
            fail(f"op {op.name!r}: env_pool {op.env_pool!r} is not an environment pool of the plan (a pool with workers)")
        _check_op_resources(op, pools, fail)
        if op.predicted_end_s < op.predicted_start_s:
            fail(f"op {op.name!r} ends before it starts")
        known = OP_ITEMS.get(op.kind, ())
        if any(item not in known for item in op.items):
            fail(f"op {op.name!r} ({op.kind}) names unknown items {op.items}; use {', '.join(known) or 'none'}")
        if op.kind in CONTROL_KINDS and (op.pool is None or op.role not in {p.role for p in plan.placements}):
            fail(f"control op {op.name!r} ({op.kind}) must act on a placed role on a pool")
        if op.kind == "node":
            if op.node is None:
                fail(f"node op {op.name!r} names no graph node")
            if op.node in node_ops:
                fail(f"graph node {op.node!r} is run twice (ops {node_ops[op.node]!r} and {op.name!r})")
            node_ops[op.node] = op.name
            if graph.node(op.node).role != op.role:
                fail(f"op {op.name!r} runs node {op.node!r} on role {op.role!r}, but the node's role is {graph.node(op.node).role!r}")
            if op.reuse is not None:
                _check_reuse(graph, op, fail)
        if op.stream and (op.kind != "node" or graph.node(op.node).kind != "generate"):
            fail(f"op {op.name!r} is marked stream, which only a generate node op can be")
        seen[op.name] = op
    missing = [n.name for n in graph.nodes if n.name not in node_ops]
    if missing:
        fail(f"graph nodes {missing} are run by no op")
    _check_edges(graph, plan, node_ops, fail)


def _check_reuse(graph, op: PlanOp, fail) -> None:
    """A reused logprob op: a logprob node, on the controller, reading the rollout of a generate node of its role."""
    node = graph.node(op.node)
    source = next((i.source for i in node.inputs if i.name == "response_mask"), None)
    if node.kind != "infer" or node.op != "logprob" or op.pool is not None:
        fail(f"op {op.name!r} reuses rollout log-probs but is not a logprob node on the controller")
    if source != op.reuse or graph.node(op.reuse).kind != "generate" or graph.node(op.reuse).role != op.role:
        fail(f"op {op.name!r} reuses the log-probs of {op.reuse!r}, which is not the generate node of role "
             f"{op.role!r} that its responses come from ({source!r})")


def _check_op_resources(op: PlanOp, pools: dict[str, PoolPlan], fail) -> None:
    """Rank groups partition the op's pool; predicted peak memory fits a device of it."""
    if op.rank_groups:
        size = len(pools[op.pool].devices) if op.pool in pools else 0
        ranks = sorted(r for group in op.rank_groups for r in group)
        if ranks != list(range(size)):
            fail(f"op {op.name!r}: rank groups {op.rank_groups} do not partition the {size} ranks of pool {op.pool!r}")
    limit = pools[op.pool].memory_bytes if op.pool in pools else None
    if op.peak_memory_bytes is not None and limit is not None and op.peak_memory_bytes > limit:
        fail(f"op {op.name!r} needs {op.peak_memory_bytes / 2**30:.1f} GiB per device but pool {op.pool!r} "
             f"has {limit / 2**30:.1f} GiB; offload, use more devices or a smaller model")


def _check_edges(graph, plan: ExecutionPlan, node_ops: dict[str, str], fail) -> None:
    """Every producer -> consumer edge of the graph must be a path of deps in the plan."""
    deps = {op.name: set(op.deps) for op in plan.ops}
    offsets = {op.name: op.iteration_offset for op in plan.ops}

    def reaches(start: str, goal: str) -> bool:
        stack, seen = [start], set()
        while stack:
            current = stack.pop()
            if current == goal:
                return True
            if current not in seen:
                seen.add(current)
                stack.extend(deps.get(current, ()))
        return False

    inputs = {i.name for i in graph.inputs}
    for node in graph.nodes:
        for source in node.sources:
            if source in inputs:
                continue
            consumer, producer = node_ops[node.name], node_ops[source]
            if offsets[producer] > offsets[consumer]:
                continue  # produced ahead of time by an overlapped op of a later iteration
            if not reaches(consumer, producer):
                fail(f"op {consumer!r} reads {source!r} but does not depend on op {producer!r}")
