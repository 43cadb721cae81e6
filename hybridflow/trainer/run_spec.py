"""One run spec: what a run's plan is compiled from, derived once from the config.

:func:`derive` turns ``(config, graph, machine)`` and the run's inputs (:class:`~.setup.RunInputs`: the actor's
folder, the tokenizer, the prompts, the response limit) into a :class:`RunSpec`:

* **models** — one row per role (:class:`RoleModel`): where its model comes from (:data:`ROLE_MODEL_SOURCES`, one
  table keyed by role kind: the policy's is the actor's, a critic's ``critic_model_name`` or the actor's, ...) and
  what the compiler costs for it (a :class:`~hybridflow.compiler.models.ModelSpec`, or ``"rule"`` for a function or
  a remote reward server); a LoRA policy is costed with its adapters;
* **batch** — prompts per step, the padded length of the first rollout batch's prompts, the response limit, epochs
  and mini-batches; ``responses`` per step uses the graph's sampled rollout
  (:func:`~hybridflow.graph.analysis.samples_per_prompt`), as the compiler's lowering does;
* **engines** — the policy's rollout engine and the train engines the runtime runs;
* **cost options** — hybridflow's engines at this config's micro-batches, data parallelism only (the runtime's
  layouts), rollout log-prob reuse on CPU (fp32), packing's real sequence length;
* **calibration** — the machine's cluster with its factors fitted to the run's models measured here (``calibrate``,
  cached per load level), else the datasheet figures.

:meth:`RunSpec.compile` compiles and binds the plan. ``hybridflow run``, ``hybridflow compile CONFIG.yaml`` and the
Python trainers all go through :func:`derive`, so a plan compiled ahead of time is the plan the run would compile.
"""
from __future__ import annotations

import dataclasses

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..capabilities import RUNTIME_TRAIN_ENGINES
from ..compiler.calibrate import calibrated_cluster, engine_cost_options
from ..compiler.cluster import ClusterSpec
from ..compiler.compile import CompileReport
from ..compiler.cost import CostOptions
from ..compiler.machine import Machine, compile_report_for
from ..compiler.models import ModelSpec
from ..compiler.passes import BatchShape
from ..compiler.passes.lower import RULE, parse_model
from ..compiler.profiling import Profile
from ..errors import ConfigError, ModelLoadError
from ..graph import Graph
from ..graph.analysis import samples_per_prompt
from .config import PPOConfig
from .setup import RunInputs

__all__ = ["RoleModel", "RunSpec", "ROLE_MODEL_SOURCES", "derive", "model_sources", "set_process_threads"]

log = logging.getLogger("hybridflow.trainer")

ROLE_MODEL_SOURCES: dict[str, Callable[[PPOConfig, str], str | None]] = {
    "policy": lambda config, actor: actor,
    "critic": lambda config, actor: config.critic_model_name or actor,
    "reference": lambda config, actor: config.ref_model_name or actor,
    "reward": lambda config, actor: config.reward_model_name,
    "cost": lambda config, actor: config.cost_model_name,
}
"""Role kind -> its model's path or hub name from the config and the actor's source (None: a rule function, the
reward source set on the trainer, or ``cost_fn``). The one table both the compiler's models and the engines read."""


@dataclass(frozen=True)
class RoleModel:
    """One role's model: where the engines load it from and what the compiler costs."""

    role: str
    kind: str
    source: str | None
    """Path or hub name (None: a function or a remote reward server scores)."""
    cost: ModelSpec | str
    """The compiler's model: a ModelSpec, or ``"rule"`` (costs nothing)."""


@dataclass(frozen=True)
class RunSpec:
    """Everything a run's plan is compiled from (module docstring); made by :func:`derive`."""

    graph: Graph
    machine: Machine
    models: Mapping[str, RoleModel]
    batch: BatchShape
    responses: int
    """Responses per step: prompts per step times the sampled rollout's ``n``."""
    rollout_engine: str
    train_engines: tuple[str, ...]
    options: CostOptions
    cluster: ClusterSpec
    """The machine's cluster, fitted to ``profiles`` when there are some."""
    profiles: tuple[tuple[Profile, bool], ...]
    """Calibration's measurements of the run's models here, each with whether it came from the cache (empty: the
    cluster has datasheet figures)."""
    placement: Any
    staleness: int
    allow_uncorrected_staleness: bool = False
    stream_rollouts: bool = False
    """Mark the plan's generate ops streamed (:func:`hybridflow.runtime.streaming.mark_streaming`)."""

    @property
    def calibrated(self) -> bool:
        return bool(self.profiles)

    def model_specs(self) -> dict[str, ModelSpec | str]:
        """Role -> what the compiler costs for it."""
        return {role: m.cost for role, m in self.models.items()}

    def source(self, role: str) -> str | None:
        """Where ``role``'s engines load its model from (None: a function scores)."""
        return self.models[role].source

    def compile(self, *, debug: bool | None = None, hooks: tuple = (), bound: bool = True) -> CompileReport:
        """Compile the graph for the machine with this spec and bind it: the report's plan is the one a run executes
        (``bound=False``: left unbound, for a cluster preset that is not this machine)."""
        report = compile_report_for(self.graph, self.model_specs(), machine=self.machine, cluster=self.cluster,
                                    placement=self.placement, staleness=self.staleness, batch=self.batch,
                                    options=self.options, engines=self.train_engines, debug=debug, hooks=hooks,
                                    bound=bound, allow_uncorrected_staleness=self.allow_uncorrected_staleness)
        if self.stream_rollouts:
            from ..runtime.streaming import mark_streaming

            report = dataclasses.replace(report, plan=mark_streaming(report.plan))
        return report


def model_sources(config: PPOConfig, graph: Graph, actor_path: str, reward_source: Any = None) -> dict[str, str | None]:
    """Role -> its model's path or name (:data:`ROLE_MODEL_SOURCES`); a reward source set on the trainer means no model."""
    sources = {}
    for role in graph.roles:
        custom = role.kind == "reward" and reward_source is not None
        sources[role.name] = None if custom else ROLE_MODEL_SOURCES[role.kind](config, actor_path)
    return sources


def _cost_model(source: Any, role: str) -> ModelSpec | str:
    """A ModelSpec from a model folder, a module's config, or a hub name transformers can resolve; ``"rule"`` for None."""
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


def _role_models(config: PPOConfig, graph: Graph, inputs: RunInputs, reward_source: Any) -> dict[str, RoleModel]:
    """The model table; a policy with LoRA (``lora_rank``) is costed with its adapters' size (memory, weight syncs)."""
    rows, sources = {}, model_sources(config, graph, inputs.actor_path, reward_source)
    for role in graph.roles:
        source = sources[role.name]
        cost = _cost_model(source, role.name)
        if role.kind == "policy" and config.lora_rank and isinstance(cost, ModelSpec):
            cost = cost.with_lora(config.lora_rank, config.lora_target_modules)
        rows[role.name] = RoleModel(role.name, role.kind, source, cost)
    return rows


def _first_prompts(config: PPOConfig, inputs: RunInputs):
    """The first rollout batch's prompts, tokenized and left-padded as the run will feed them."""
    from ..data import make_prompt_batch

    return make_prompt_batch(inputs.train_rows[:config.rollout_batch_size], inputs.tokenizer,
                             max_prompt_length=config.max_prompt_length, apply_chat_template=config.apply_chat_template)


def _real_seq_len(config: PPOConfig, prompts, response_len: int) -> float | None:
    """Mean real tokens per sequence the train engines run when they pack sequences or budget tokens, else None:
    the first batch's mean prompt length (no padding) plus the response limit (responses priced at their largest)."""
    if not (config.pack_sequences or config.max_tokens_per_micro_batch is not None):
        return None
    return float(prompts["prompt_mask"].sum(-1).float().mean()) + response_len


def _cost_options(config: PPOConfig, machine: Machine, responses: int, real_seq_len: float | None) -> CostOptions:
    """hybridflow's engines at this config's micro-batches; data parallelism only; on a CPU machine (fp32 engines)
    logprob nodes may be served from the rollout (``reuse_rollout_log_probs``); packed forwards share no prompts."""
    options = engine_cost_options(train_micro_batch=config.micro_batch_size or config.batch_size or responses,
                                  infer_micro_batch=config.micro_batch_size or responses)
    fp32 = machine.kind == "cpu"  # TrainEngineConfig.precision 'auto': bf16 autocast on CUDA
    update = {"data_parallel_only": True, "rollout_engine": config.rollout_engine,
              "reuse_rollout_log_probs": fp32 and config.reuse_rollout_log_probs, "real_seq_len": real_seq_len,
              "env_workers": config.env_workers, "async_weight_sync": config.async_weight_sync}
    if config.pack_sequences:
        update["shared_prompt_min_saved"] = None
    return options.model_copy(update=update)


def _calibration(config: PPOConfig, machine: Machine, models: Mapping[str, RoleModel],
                 options: CostOptions) -> tuple[ClusterSpec, tuple[tuple[Profile, bool], ...]] | None:
    """The machine's cluster fitted to the run's model folders profiled on one of its devices (cached), with the
    profiles; None when ``calibrate`` is off, the run executes a plan compiled earlier (``plan=``: its times are
    that compile's), the GPUs are not visible here, or a model is not a local folder."""
    if not config.calibrate or config.plan:
        return None
    import torch

    if machine.kind == "cuda" and not torch.cuda.is_available():
        log.info("calibrate: the Ray cluster's GPUs are not visible to this process; datasheet figures")
        return None
    folders = {role: m.source for role, m in models.items() if m.source is not None}
    if any(not (Path(str(p)) / "config.json").is_file() for p in folders.values()):
        log.info("calibrate: not every model is a local folder (%s); the cost model uses datasheet figures",
                 ", ".join(f"{r}={p}" for r, p in folders.items()))
        return None
    from ..runtime.calibration import run_profiles

    device = "cuda:0" if machine.kind == "cuda" else "cpu"
    with torch.random.fork_rng(devices=[]):  # profiling builds models: the run's random stream must not move
        threads = torch.get_num_threads()
        # the threads the slots will run with: locally this process's (set_process_threads chose them); on Ray the slot's
        used = config.num_threads or (threads if config.executor == "local" else machine.threads_per_slot)
        try:
            profiles = tuple(run_profiles(folders, device=device, threads=used, quick=config.calibrate_quick))
        finally:
            torch.set_num_threads(threads)
    return calibrated_cluster(machine.cluster(), [p for p, _ in profiles], options), profiles


def _placement(config: PPOConfig, graph: Graph, machine: Machine):
    """``placement``, or the ``device_map`` as a device map (with the unnamed roles on the default device)."""
    if config.device_map:
        if "placement" in config.model_fields_set and config.placement != "auto":
            raise ConfigError(f"device_map and placement={config.placement!r} both place the roles; give one of them")
        default = "cuda:0" if machine.kind == "cuda" else "cpu"
        return {**{r.name: default for r in graph.roles}, **config.device_map}
    return config.placement


def derive(config: PPOConfig, graph: Graph, machine: Machine, inputs: RunInputs, *, reward_source: Any = None) -> RunSpec:
    """The run spec of ``config``'s ``graph`` on ``machine`` (module docstring).

    ``reward_source``: the reward set with ``Trainer.set_reward_model`` (its role then has no model to cost).
    Call :func:`set_process_threads` first: calibration measures with the threads the run will use.
    """
    models = _role_models(config, graph, inputs, reward_source)
    responses = config.rollout_batch_size * samples_per_prompt(graph)
    prompts = _first_prompts(config, inputs)
    batch = BatchShape(prompts=config.rollout_batch_size, prompt_len=int(prompts["prompt_ids"].shape[1]),
                       response_len=inputs.max_response_length, epochs=config.ppo_epochs,
                       mini_batches=math.ceil(responses / (config.batch_size or responses)))
    options = _cost_options(config, machine, responses, _real_seq_len(config, prompts, inputs.max_response_length))
    # calibration fits the engines' own factors: the CPU's log-prob reuse does not enter the fit
    found = _calibration(config, machine, models, options.model_copy(update={"reuse_rollout_log_probs": False}))
    cluster, profiles = found or (machine.cluster(), ())
    return RunSpec(graph=graph, machine=machine, models=models, batch=batch, responses=responses,
                   rollout_engine=config.rollout_engine, train_engines=RUNTIME_TRAIN_ENGINES, options=options,
                   cluster=cluster, profiles=profiles, placement=_placement(config, graph, machine),
                   staleness=config.staleness, allow_uncorrected_staleness=config.allow_uncorrected_staleness,
                   stream_rollouts=config.stream_rollouts)


def set_process_threads(config: PPOConfig, machine: Machine) -> None:
    """CPU runs: this process's torch threads from its slot's share of the cores and the cores others keep busy
    (:func:`~hybridflow.runtime.threads.slot_threads`; ``num_threads`` wins), and a warning when the machine is
    oversubscribed. Ray slots get their share through their bundles (one process per slot)."""
    import torch

    from ..runtime.threads import busy_cores, slot_threads, warn_if_oversubscribed

    if machine.kind != "cpu":
        return
    busy = busy_cores()
    if config.executor == "ray":
        warn_if_oversubscribed(machine.slots, machine.threads_per_slot or 1, busy=busy)
        return
    threads = slot_threads(machine.threads_per_slot, requested=config.num_threads, busy=busy)
    torch.set_num_threads(threads)
    warn_if_oversubscribed(1, threads, busy=busy)
