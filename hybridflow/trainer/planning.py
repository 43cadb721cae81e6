"""The trainer's one path to a plan: config -> graph -> run spec -> ``compile`` -> ``bind`` -> the plan that runs.

:func:`run_machine` is the machine the run has (:func:`~hybridflow.compiler.local_machine` or, on Ray,
:func:`~hybridflow.compiler.ray_machine`); :func:`~.run_spec.derive` makes the run spec (models, batch shape,
engines, cost options, calibration) and :func:`plan_for_run` compiles it and binds it to the machine's devices.
With ``plan=FILE``, :func:`read_run_plan` reads that plan instead (a plan ``hybridflow compile CONFIG.yaml`` wrote,
or a run's plan.json) and checks that its graph is the one the config builds, before the machine is started or
joined; :func:`plan_for_run` binds it (a BindError names the pool whose devices are missing, or the layout the
runtime does not run).
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..compiler import bind, local_machine
from ..compiler.machine import Machine
from ..compiler.plan import ExecutionPlan, read_plan
from ..errors import ConfigError, PlanError
from ..graph import Graph
from ..graph.serialize import graph_to_dict
from .config import PPOConfig
from .run_spec import RunSpec

__all__ = ["run_machine", "read_run_plan", "plan_for_run", "read_plan_file", "check_same_graph", "plan_summary"]

log = logging.getLogger("hybridflow.trainer")


def run_machine(config: PPOConfig) -> Machine:
    """The devices of this run: this machine, or (executor='ray') the Ray cluster, started here if need be."""
    if config.executor != "ray":
        if config.ray_address:
            raise ConfigError(f"ray_address={config.ray_address!r} is for executor='ray'; add executor=ray to run on "
                              "that cluster, or drop ray_address to run here")
        return local_machine(config.cpu_slots)
    from ..compiler.machine import describe_nodes, ray_machine
    from ..runtime.ray.cluster import connect

    if config.ray_address:
        connect(config.ray_address)  # an existing cluster: its nodes are the machine
    else:
        local = local_machine(config.cpu_slots, where="ray")
        # a local Ray gets a CPU for each slot plus one for the controller-side pools (rule rewards)
        cpus = local.slots * (local.threads_per_slot or 1) + 1 if local.kind == "cpu" else None
        connect(None, num_cpus=cpus)
    machine = ray_machine(config.cpu_slots)
    log.info("Ray cluster: %s; %s", machine.describe(), describe_nodes(machine))
    return machine


def check_same_graph(plan: ExecutionPlan, graph: Graph, source: str) -> None:
    """PlanError unless ``plan`` runs ``graph`` (same nodes, attributes and roles), naming the first difference."""
    if plan.graph == graph:
        return
    mine, theirs = graph_to_dict(graph), graph_to_dict(plan.graph)
    if mine.get("name") != theirs.get("name"):
        raise PlanError(f"plan {source} runs graph {theirs.get('name')!r}, but this config builds {mine.get('name')!r}; "
                        f"compile the plan from this config (hybridflow compile CONFIG.yaml --cluster local -o PLAN.json)")
    nodes = {n["name"]: n for n in theirs.get("nodes", [])}
    for node in mine.get("nodes", []):
        if nodes.get(node["name"]) != node:
            what = "has no node" if node["name"] not in nodes else "has a different node"
            raise PlanError(f"plan {source} {what} {node['name']!r} of the graph this config builds (its attributes come "
                            "from the config: n_samples, kl_coef, ...); compile the plan from this config: hybridflow compile "
                            "CONFIG.yaml [key=value ...] --cluster local -o PLAN.json")
    raise PlanError(f"plan {source}'s graph differs from the one this config builds (roles, inputs or extra nodes); "
                    "compile the plan again from this config")


def read_plan_file(path: str) -> ExecutionPlan:
    """The plan in file ``path``; PlanError when it cannot be read."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise PlanError(f"plan={path!r} cannot be read ({err.strerror}); give a file written by "
                        "'hybridflow compile CONFIG.yaml --cluster local -o PLAN.json' or a run's plan.json") from None
    return read_plan(text)


def read_run_plan(config: PPOConfig, graph: Graph) -> ExecutionPlan | None:
    """The plan file ``config.plan`` (None without one), checked against ``graph`` and the config: a plan this
    run cannot take is a PlanError here, before a cluster is started or joined for it."""
    if not config.plan:
        return None
    plan = read_plan_file(config.plan)
    check_same_graph(plan, graph, repr(config.plan))
    if config.staleness != plan.staleness and "staleness" in config.model_fields_set:
        raise PlanError(f"plan {config.plan!r} has staleness {plan.staleness}, the config asks for {config.staleness}; "
                        "drop one of them")
    engines = {p.rollout_engine for p in plan.placements if p.rollout_engine} - {config.rollout_engine}
    if engines and "rollout_engine" in config.model_fields_set:
        raise PlanError(f"plan {config.plan!r} generates with rollout engine {', '.join(sorted(engines))}, the config "
                        f"asks for {config.rollout_engine!r}; drop one of them")
    return plan


def plan_for_run(config: PPOConfig, spec: RunSpec, planned: ExecutionPlan | None = None) -> ExecutionPlan:
    """The bound plan this run executes (module docstring): the plan file's (``planned``, if the caller read it with
    :func:`read_run_plan` already) bound to the run's machine, or the plan compiled from ``spec``."""
    if planned is None:
        planned = read_run_plan(config, spec.graph)
    if planned is not None:
        if config.stream_rollouts:  # streaming is how the plan's generate ops run, not where: a plan file takes it too
            from ..runtime.streaming import mark_streaming

            planned = mark_streaming(planned)
        return bind(planned, spec.machine)
    report = spec.compile()
    log.info("compiled %s for %s in %.2f s: %s, predicted %.3g s per step", spec.graph.name, spec.machine.describe(),
             report.seconds, report.plan.strategy, report.plan.predicted_iteration_s or 0.0)
    return report.plan


def plan_summary(plan: ExecutionPlan) -> str:
    """One line per pool: ``pool0 [cpu] actor, ref`` (for the run's log)."""
    def members(pool) -> str:
        if pool.workers:
            return f"{pool.workers} env workers of " + ", ".join(p.role for p in plan.placements if p.env_pool == pool.name)
        return ", ".join(plan.roles_on(pool.name)) or "generation"

    return "; ".join(f"{p.name} [{', '.join(p.devices)}]: {members(p)}" for p in plan.pools)
