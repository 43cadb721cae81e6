"""Pass ``lower``: graph -> the compiler's workload, and the plan skeleton the other passes fill in.

Lowering (:func:`lower_workload`) counts, per role of the graph, the nodes of
each kind — any graph, standard or user-written:

- ``generate`` nodes make the role the generating one; the rollout has
  ``prompts x n`` sequences (``n`` of the first sampled generate node) and every
  further generate node (ReMax's greedy baseline) is one more generation pass;
- ``infer`` nodes are forward passes (log-probs, values), ``score`` nodes
  reward-model passes, ``update`` nodes ``epochs`` passes of training each;
- a role is trainable when the graph declares it trainable *and* updates it
  (otherwise it keeps no optimizer state);
- roles whose model is a rule function (``models[role] is None``) are left out:
  they hold no weights and their score nodes cost ~0.

Models come from the user per role (:func:`resolve_models`): a role not named
uses the actor's model, as in the paper's experiments.

The skeleton (:func:`lower`) puts every role on one placeholder pool holding
all the cluster's devices (pure data parallelism) and runs the graph's nodes in
the graph's order, each depending on the nodes it reads. It is a valid plan;
the ``placement`` pass replaces the pool.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from ...errors import ConfigError, PlanError
from ...graph import CONTROLLER, Graph
from ...graph.analysis import samples_per_prompt
from ..models import ModelSpec
from ..plan import ExecutionPlan, LayoutPlan, PlanOp, PoolPlan, RolePlacement
from ..workload import GenerationWork, RoleWork, Workload
from .context import BatchShape, CompileContext

__all__ = ["RULE", "UNPLACED", "actor_role", "parse_model", "resolve_models", "lower_workload", "device_names", "lower"]

RULE = "rule"
"""Model name for a role computed by a rule function (``--model reward=rule``)."""
UNPLACED = "unplaced"
"""Name of the skeleton's placeholder pool."""


def actor_role(graph: Graph) -> str:
    """The role whose model the others default to: ``actor``, else the first policy, else the first role."""
    names = [r.name for r in graph.roles]
    if "actor" in names:
        return "actor"
    return next((r.name for r in graph.roles if r.kind == "policy"), names[0])


def parse_model(value: ModelSpec | str | None) -> ModelSpec | None:
    """A ModelSpec from a preset name, a ``config.json`` path, or ``"rule"`` (None)."""
    if value is None or isinstance(value, ModelSpec):
        return value
    text = str(value).strip()
    if text.lower() == RULE:
        return None
    path = Path(text)
    if path.suffix == ".json" or path.is_dir():
        config = path / "config.json" if path.is_dir() else path
        try:
            return ModelSpec.from_config(json.loads(config.read_text()), name=path.stem if path.suffix else path.name)
        except (OSError, ValueError) as err:
            raise ConfigError(f"model {text!r}: cannot read a transformers config from {config} ({err})") from None
    return ModelSpec.preset(text)


def resolve_models(graph: Graph, models: Mapping[str, ModelSpec | str | None]) -> dict[str, ModelSpec | None]:
    """Every role's model: the one given, else (a rule role, ``Role.rule``) None, else the actor's; ``"rule"`` -> None.
    Unknown role names are an error."""
    roles = [r.name for r in graph.roles]
    unknown = sorted(set(models) - set(roles))
    if unknown:
        raise ConfigError(f"models are given for {unknown}, which are not roles of graph {graph.name!r}; its roles are {', '.join(roles)}")
    actor = actor_role(graph)
    if actor not in models:
        raise ConfigError(f"give the model of role {actor!r} (e.g. --model {actor}=llama2-7b); other roles default to it")
    parsed = {name: parse_model(value) for name, value in models.items()}
    if parsed[actor] is None:
        raise ConfigError(f"role {actor!r} generates and trains; it needs a model, not a rule function")
    rules = {r.name for r in graph.roles if r.rule}
    return {name: parsed[name] if name in parsed else None if name in rules else parsed[actor] for name in roles}


def _check_rule_roles(graph: Graph, models: Mapping[str, ModelSpec | None]) -> None:
    for node in graph.nodes:
        if node.role != CONTROLLER and models.get(node.role) is None and node.kind != "score":
            raise ConfigError(f"role {node.role!r} is a rule function but node {node.name!r} is a {node.kind} node; "
                              "only score nodes can run without a model: give the role a model (--model ROLE=PRESET)")


def _generation(graph: Graph, batch: BatchShape) -> GenerationWork:
    generates = [n for n in graph.nodes if n.kind == "generate"]
    return GenerationWork(prompts=batch.prompts, prompt_len=batch.prompt_len, response_len=batch.response_len,
                          samples=samples_per_prompt(graph), generations=max(1, len(generates)))


def lower_workload(graph: Graph, models: Mapping[str, ModelSpec | None], batch: BatchShape | None = None) -> Workload:
    """The :class:`Workload` of ``graph`` with ``models`` (see the module docstring)."""
    batch = batch or BatchShape()
    _check_rule_roles(graph, models)
    counts = {r.name: {"generate": 0, "infer": 0, "score": 0, "update": 0, "compute": 0} for r in graph.roles}
    for node in graph.nodes:
        if node.role != CONTROLLER:
            counts[node.role][node.kind] += 1
    generating = [name for name, c in counts.items() if c["generate"]]
    if len(generating) > 1:
        raise PlanError(f"graph {graph.name!r}: roles {generating} all generate; the compiler places one generating role per graph")
    roles = []
    for role in graph.roles:
        model, c = models.get(role.name), counts[role.name]
        if model is None:
            continue
        trainable = role.trainable and c["update"] > 0
        roles.append(RoleWork(name=role.name, model=model, trainable=trainable, generates=c["generate"] > 0,
                              infer_passes=c["infer"], score_passes=c["score"],
                              train_epochs=c["update"] * batch.epochs if trainable else 0,
                              mini_batches=batch.mini_batches if trainable else 1))
    if not roles:
        raise ConfigError(f"graph {graph.name!r}: every role is a rule function; at least the actor needs a model")
    return Workload(roles=tuple(roles), generation=_generation(graph, batch),
                    controller_compute=any(n.kind == "compute" for n in graph.nodes))


def device_names(cluster) -> tuple[str, ...]:
    """``n0.d0, n0.d1, ...``: the cluster's device slots, node-major."""
    return tuple(f"n{i // cluster.devices_per_node}.d{i % cluster.devices_per_node}" for i in range(cluster.num_devices))


def lower(plan: ExecutionPlan | None, ctx: CompileContext) -> ExecutionPlan:
    """The plan skeleton of ``ctx.graph``.

    Requires: nothing (``plan`` is ignored; the pipeline starts with None).
    Guarantees: a valid plan; one node op per graph node, in graph order,
    depending on the ops it reads from; every role on the placeholder pool
    ``unplaced`` of all the cluster's devices; no timings yet. The workload
    lowering is checked here (``ctx.workload``), so a graph the compiler
    cannot cost fails in this pass.
    """
    graph, cluster = ctx.graph, ctx.cluster
    ctx.workload  # noqa: B018 - lowering errors belong to this pass
    size = cluster.num_devices
    pool = PoolPlan(name=UNPLACED, devices=device_names(cluster), memory_bytes=int(cluster.device_memory_bytes))
    generating = {n.role for n in graph.nodes if n.kind == "generate"}
    placements = tuple(
        RolePlacement(role=r.name, pool=UNPLACED, layout=LayoutPlan(dp=size),
                      generation_layout=LayoutPlan(dp=size) if r.name in generating else None)
        for r in graph.roles)
    inputs = {i.name for i in graph.inputs}
    ops = tuple(
        PlanOp(name=n.name, kind="node", role=n.role, pool=None if n.role == CONTROLLER else UNPLACED, node=n.name,
               deps=tuple(s for s in n.sources if s not in inputs))
        for n in graph.nodes)
    return ExecutionPlan(graph=graph, cluster=f"{cluster.name}:{cluster.nodes}", strategy=UNPLACED,
                         pools=(pool,), placements=placements, ops=ops, staleness=ctx.staleness)
