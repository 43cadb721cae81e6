"""The compiler: cluster and model descriptions, the cost model, placement search and reshard math.

Main entry points (each module's docstring has the formulas and sources):

- :class:`ClusterSpec` (``ClusterSpec.parse("a100-80g:16")``), :class:`ModelSpec`
  (``ModelSpec.preset("llama2-70b")``, ``ModelSpec.from_config(config)``);
- :class:`Workload` / :class:`RoleWork` / :class:`GenerationWork`, with
  :func:`ppo_workload`, :func:`grpo_workload`, :func:`paper_workload`;
- :func:`estimate` and the cost-rule table ``COST_RULES`` (:mod:`.cost`);
- :class:`Layout`; :func:`search`, :func:`place`, :func:`evaluate`,
  :func:`manual_placement`, :func:`placement_from_device_map` (:mod:`.placement`);
- :func:`hybrid_engine_groups`, :func:`hybrid_engine_figures`, :func:`cross_pool_sync` (:mod:`.reshard`);
- :func:`simulate_table` (:mod:`.simulate`);
- :func:`predict_async` and :func:`samples_per_s` (:mod:`.async_cost`): the step of asynchronous RL
  with staleness k from generation, training and weight-sync times; :func:`choose_split`
  (:mod:`.async_placement`): the rollout/training split of the devices per k;
- the passes (:mod:`.passes`: lower, placement, reuse, reshard, offload, schedule) and
  ``compile(graph, cluster, models, placement=..., staleness=...)`` in
  :mod:`.compile` (also ``hybridflow.compile``); it is not re-exported here, so
  that the name keeps meaning the module;
- :class:`Machine`, :func:`local_machine`, :func:`ray_machine` and :func:`bind`
  (:mod:`.machine`): the devices a run has, and a compiled plan bound to them;
  :func:`compile_for` (:func:`~.machine.compile_report_for`, with the search's report) compiles a plan the
  runtime executes and binds it in one call; a run's plan is compiled through it from the run spec
  (:mod:`hybridflow.trainer.run_spec`).
"""
from .async_cost import predict_async, samples_per_s
from .async_placement import choose_split
from .cluster import ClusterSpec
from .cost import COST_RULES, CostOptions, CostRecord, estimate
from .layout import Layout
from .machine import BindError, Machine, bind, compile_for, local_machine, ray_machine
from .models import ModelSpec
from .placement import Placement, Pool, PoolSpec, RolePlacement, evaluate, manual_placement, place, placement_from_device_map, search
from .reshard import cross_pool_sync, hybrid_engine_figures, hybrid_engine_groups
from .simulate import simulate_table
from .workload import GenerationWork, RoleWork, Workload, grpo_workload, paper_workload, ppo_workload

__all__ = [
    "ClusterSpec", "ModelSpec", "Layout", "CostOptions", "CostRecord", "COST_RULES", "estimate",
    "GenerationWork", "RoleWork", "Workload", "ppo_workload", "grpo_workload", "paper_workload",
    "Placement", "Pool", "PoolSpec", "RolePlacement", "evaluate", "search", "place", "manual_placement",
    "placement_from_device_map", "hybrid_engine_groups", "hybrid_engine_figures", "cross_pool_sync", "simulate_table",
    "predict_async", "samples_per_s", "choose_split",
    "Machine", "BindError", "local_machine", "ray_machine", "bind", "compile_for",
]
