"""The trainer's one path to a plan: config -> graph -> ``compile`` -> ``bind`` -> the plan that runs.

:func:`plan_for_run` compiles the config's graph for the machine the run has
(:func:`~hybridflow.compiler.local_machine` or, on Ray,
:func:`~hybridflow.compiler.ray_machine`) with

* the models from the model folders' ``config.json`` (a rule reward or cost
  function costs nothing: ``"rule"``), a LoRA policy with its adapters' size;
* the batch shape from the config: prompts per step, the padded prompt length
  of the training prompts, the response length, epochs and mini-batches;
* the cluster's figures measured on this machine (``calibrate``, on by default:
  :func:`~hybridflow.runtime.calibration.calibrate` profiles each model folder
  once and caches the result), so the plan's predicted times are this
  machine's; the run's summary sets them against the measured ones;
* ``placement`` (a strategy, a pool spec, or a device map — ``device_map``
  is the same as a map in ``placement``) and ``staleness``;

then binds it to the machine's devices. With ``plan=FILE`` it reads that plan
instead, checks that its graph is the one the config builds, and binds it
(a BindError names the pool whose devices are missing).
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from ..compiler import bind, local_machine
from ..compiler.calibrate import engine_cost_options
from ..compiler.cluster import ClusterSpec
from ..compiler.compile import compile_report
from ..compiler.cost import CostOptions
from ..compiler.machine import Machine
from ..compiler.models import ModelSpec
from ..compiler.passes import BatchShape
from ..compiler.passes.lower import RULE, parse_model
from ..compiler.plan import ExecutionPlan, read_plan
from ..errors import ConfigError, ModelLoadError, PlanError
from ..graph import Graph
from ..graph.serialize import graph_to_dict

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["run_machine", "model_specs", "batch_shape", "cost_options", "run_cluster", "placement_request", "plan_for_run", "check_same_graph", "plan_summary"]

log = logging.getLogger("hybridflow.trainer")


def run_machine(trainer: "Trainer") -> Machine:
    """The devices of this run: this machine, or (executor='ray') the Ray cluster, started here if need be."""
    cfg = trainer.config
    if cfg.executor != "ray":
        if cfg.ray_address:
            raise ConfigError(f"ray_address={cfg.ray_address!r} is for executor='ray'; add executor=ray to run on that "
                              "cluster, or drop ray_address to run here")
        return local_machine(cfg.cpu_slots)
    from ..compiler.machine import describe_nodes, ray_machine
    from ..runtime.ray.cluster import connect

    if cfg.ray_address:
        connect(cfg.ray_address)  # an existing cluster: its nodes are the machine
    else:
        local = local_machine(cfg.cpu_slots, where="ray")
        # a local Ray gets a CPU for each slot plus one for the controller-side pools (rule rewards)
        cpus = local.slots * (local.threads_per_slot or 1) + 1 if local.kind == "cpu" else None
        connect(None, num_cpus=cpus)
    machine = ray_machine(cfg.cpu_slots)
    log.info("Ray cluster: %s; %s", machine.describe(), describe_nodes(machine))
    return machine


def _spec(source, role: str) -> ModelSpec | str:
    """A ModelSpec from a model folder, a module's config, or a hub name transformers can resolve."""
    if source is None:
        return RULE
    config = getattr(source, "config", None)
    if config is not None:  # an nn.Module handed in directly
        return ModelSpec.from_config(config.to_dict() if hasattr(config, "to_dict") else config, name=role)
    path = Path(str(source))
    if path.is_dir() or path.suffix == ".json":
        return parse_model(str(path))
    try:
        from transformers import AutoConfig

        return ModelSpec.from_config(AutoConfig.from_pretrained(str(source)).to_dict(), name=str(source))
    except Exception as err:
        raise ModelLoadError(f"role {role!r}: cannot read the model config of {source!r} to plan the run ({err}); "
                             "give a model folder with a config.json") from None


def _model_sources(trainer: "Trainer") -> dict:
    """Role -> its model's path or name (None: a function or a remote reward server)."""
    cfg, sources = trainer.config, {}
    for role in trainer.graph.roles:
        if role.kind == "policy":
            sources[role.name] = trainer.actor_path
        elif role.kind == "critic":
            sources[role.name] = cfg.critic_model_name or trainer.actor_path
        elif role.kind == "reference":
            sources[role.name] = cfg.ref_model_name or trainer.actor_path
        elif role.kind == "cost":
            sources[role.name] = cfg.cost_model_name
        else:
            sources[role.name] = None if trainer._reward_source is not None else cfg.reward_model_name
    return sources


def model_specs(trainer: "Trainer") -> dict[str, ModelSpec | str]:
    """Role -> the model the compiler costs for it (``"rule"`` for functions and remote reward servers); a policy
    with LoRA (``lora_rank``) carries its adapters' size, so that its memory and weight syncs are costed as such."""
    specs = {role: _spec(source, role) for role, source in _model_sources(trainer).items()}
    cfg = trainer.config
    if cfg.lora_rank:
        for role in (r.name for r in trainer.graph.roles if r.kind == "policy"):
            if isinstance(specs[role], ModelSpec):
                specs[role] = specs[role].with_lora(cfg.lora_rank, cfg.lora_target_modules)
    return specs


def _responses(trainer: "Trainer") -> int:
    samples = max((n.attrs.n for n in trainer.graph.nodes if n.kind == "generate" and getattr(n.attrs, "n", None)), default=1)
    return trainer.config.rollout_batch_size * samples


def _cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()


def _first_prompts(trainer: "Trainer"):
    """The first rollout batch's prompts, tokenized and left-padded as the run will feed them."""
    from ..data import make_prompt_batch

    cfg = trainer.config
    return make_prompt_batch(trainer.train_rows[:cfg.rollout_batch_size], trainer.tokenizer,
                             max_prompt_length=cfg.max_prompt_length, apply_chat_template=cfg.apply_chat_template)


def real_seq_len(trainer: "Trainer") -> float | None:
    """Mean real tokens per sequence the train engines run when they pack sequences or budget tokens, else None.

    The first rollout batch's mean prompt length (no padding) plus the response limit: response lengths are
    unknown before generation, so they are priced at their largest.
    """
    cfg = trainer.config
    if not (cfg.pack_sequences or cfg.max_tokens_per_micro_batch is not None):
        return None
    return float(_first_prompts(trainer)["prompt_mask"].sum(-1).float().mean()) + trainer.max_response_length


def batch_shape(trainer: "Trainer") -> BatchShape:
    """One step's batch as the compiler sees it (module docstring); ``prompts`` is the rollout batch (the graph's
    ``n`` multiplies it into responses)."""
    cfg = trainer.config
    prompts = _first_prompts(trainer)
    return BatchShape(prompts=cfg.rollout_batch_size, prompt_len=int(prompts["prompt_ids"].shape[1]),
                      response_len=trainer.max_response_length, epochs=cfg.ppo_epochs,
                      mini_batches=math.ceil(_responses(trainer) / (cfg.batch_size or _responses(trainer))))


def cost_options(trainer: "Trainer", machine: Machine | None = None) -> CostOptions:
    """The cost model's view of hybridflow's engines at this config's micro-batches; data parallelism only; on a
    CPU ``machine`` (fp32 engines) logprob nodes may be served from the rollout (``reuse_rollout_log_probs``).
    Packing or a token budget prices the train engines' forwards at the real sequence length (:func:`real_seq_len`);
    packed forwards run every row's prompt (no shared prompts)."""
    cfg, responses = trainer.config, _responses(trainer)
    options = engine_cost_options(train_micro_batch=cfg.micro_batch_size or cfg.batch_size or responses,
                                  infer_micro_batch=cfg.micro_batch_size or responses)
    fp32 = machine is not None and machine.kind == "cpu"  # TrainEngineConfig.precision 'auto': bf16 autocast on CUDA
    update = {"data_parallel_only": True, "rollout_engine": cfg.rollout_engine,
              "reuse_rollout_log_probs": fp32 and cfg.reuse_rollout_log_probs, "real_seq_len": real_seq_len(trainer)}
    if cfg.pack_sequences:
        update["shared_prompt_min_saved"] = None
    return options.model_copy(update=update)


def run_cluster(trainer: "Trainer", machine: Machine) -> ClusterSpec:
    """The machine's cluster, calibrated by profiling the run's model folders on one of its devices (cached)
    when ``calibrate`` is on and every model is a local folder; the datasheet figures otherwise."""
    cluster = machine.cluster()
    cfg = trainer.config
    if not cfg.calibrate:
        return cluster
    if machine.kind == "cuda" and not _cuda_here():
        log.info("calibrate: the Ray cluster's GPUs are not visible to this process; datasheet figures")
        return cluster
    folders = {role: source for role, source in _model_sources(trainer).items() if source is not None}
    if any(not (Path(str(p)) / "config.json").is_file() for p in folders.values()):
        log.info("calibrate: not every model is a local folder (%s); the cost model uses datasheet figures",
                 ", ".join(f"{r}={p}" for r, p in folders.items()))
        return cluster
    from ..runtime.calibration import calibrate

    import torch

    device = "cuda:0" if machine.kind == "cuda" else "cpu"
    with torch.random.fork_rng(devices=[]):  # profiling builds models: the run's random stream must not move
        threads = torch.get_num_threads()
        # the threads the slots will run with: locally this process's, as Trainer._set_threads chose them
        # (fewer than the slot's share when other processes keep cores busy); on Ray the slot's share
        used = cfg.num_threads or (threads if cfg.executor == "local" else machine.threads_per_slot)
        try:
            return calibrate(cluster, folders, device=device, threads=used, options=cost_options(trainer))
        finally:
            torch.set_num_threads(threads)


def placement_request(trainer: "Trainer", machine: Machine):
    """``placement``, or the ``device_map`` as a device map (with the unnamed roles on the default device)."""
    cfg = trainer.config
    if cfg.device_map:
        if "placement" in cfg.model_fields_set and cfg.placement != "auto":
            raise ConfigError(f"device_map and placement={cfg.placement!r} both place the roles; give one of them")
        default = "cuda:0" if machine.kind == "cuda" else "cpu"
        return {**{r.name: default for r in trainer.graph.roles}, **cfg.device_map}
    return cfg.placement


def check_same_graph(plan: ExecutionPlan, graph: Graph, source: str) -> None:
    """PlanError unless ``plan`` runs ``graph`` (same nodes, attributes and roles), naming the first difference."""
    mine, theirs = graph_to_dict(graph), plan.graph
    if mine == theirs:
        return
    if mine.get("name") != theirs.get("name"):
        raise PlanError(f"plan {source} runs graph {theirs.get('name')!r}, but this config builds {mine.get('name')!r}; "
                        f"compile the plan from this config (hybridflow compile {mine.get('name')} ...)")
    nodes = {n["name"]: n for n in theirs.get("nodes", [])}
    for node in mine.get("nodes", []):
        if nodes.get(node["name"]) != node:
            what = "has no node" if node["name"] not in nodes else "has a different node"
            raise PlanError(f"plan {source} {what} {node['name']!r} of the graph this config builds (its attributes come "
                            "from the config: n_samples, kl_coef, ...); compile the plan again from this config")
    raise PlanError(f"plan {source}'s graph differs from the one this config builds (roles, inputs or extra nodes); "
                    "compile the plan again from this config")


def plan_for_run(trainer: "Trainer", machine: Machine) -> ExecutionPlan:
    """The bound plan this run executes (module docstring)."""
    cfg = trainer.config
    if cfg.plan:
        path = Path(cfg.plan)
        try:
            text = path.read_text()
        except OSError as err:
            raise PlanError(f"plan={cfg.plan!r} cannot be read ({err.strerror}); give a file written by "
                            "'hybridflow compile ... -o PLAN.json' or a run's plan.json") from None
        plan = read_plan(text)
        check_same_graph(plan, trainer.graph, repr(cfg.plan))
        if cfg.staleness != plan.staleness and "staleness" in cfg.model_fields_set:
            raise PlanError(f"plan {cfg.plan!r} has staleness {plan.staleness}, the config asks for {cfg.staleness}; "
                            "drop one of them")
        engines = {p.rollout_engine for p in plan.placements if p.rollout_engine} - {cfg.rollout_engine}
        if engines and "rollout_engine" in cfg.model_fields_set:
            raise PlanError(f"plan {cfg.plan!r} generates with rollout engine {', '.join(sorted(engines))}, the config "
                            f"asks for {cfg.rollout_engine!r}; drop one of them")
        return bind(plan, machine)
    models = model_specs(trainer)
    report = compile_report(trainer.graph, run_cluster(trainer, machine), models,
                            placement=placement_request(trainer, machine), staleness=cfg.staleness,
                            batch=batch_shape(trainer), options=cost_options(trainer, machine))
    log.info("compiled %s for %s in %.2f s: %s, predicted %.3g s per step", trainer.graph.name, machine.describe(),
             report.seconds, report.plan.strategy, report.plan.predicted_iteration_s or 0.0)
    return bind(report.plan, machine)


def plan_summary(plan: ExecutionPlan) -> str:
    """One line per pool: ``pool0 [cpu] actor, ref`` (for the run's log)."""
    return "; ".join(f"{p.name} [{', '.join(p.devices)}]: {', '.join(plan.roles_on(p.name)) or 'generation'}" for p in plan.pools)
