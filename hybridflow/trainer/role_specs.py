"""Each role's :class:`~hybridflow.runtime.roles.RoleSpec` (how its engines are built) from a run's config.

Models come from the run spec's one table (:data:`~.run_spec.ROLE_MODEL_SOURCES`). The policy gets a train
engine and its rollout engine (the plan's choice, else ``rollout_engine``), the critic a train engine, the
reference a log-prob engine, a cost role its own source (``cost_model_name`` or ``cost_fn``, never the reward's),
and the reward role the reward: the source set with ``Trainer.set_reward_model`` (``reward_source``), else
``reward_model_name``, else the rule ``reward_fn``.
"""
from __future__ import annotations

from typing import Any, Callable

from ..compiler.plan import ExecutionPlan
from ..errors import ConfigError
from ..graph import Graph
from ..runtime.engines import SamplingParams, TrainEngineConfig
from ..runtime.roles import RoleSpec
from .config import PPOConfig
from .run_spec import ROLE_MODEL_SOURCES, RunSpec
from .seeds import stream_seed
from .setup import RunInputs

__all__ = ["role_specs", "reward_spec", "cost_spec", "load_function"]


def load_function(path: str, field: str = "reward_fn") -> Callable:
    """``"package.module:function"`` -> the function; ConfigError naming ``field`` and the path otherwise."""
    from ..algorithms.resolve import import_module

    module_name, _, attr = path.partition(":")
    module = import_module(module_name, f"{field} {path!r}")  # the working directory is on the path, as for algorithm=
    try:
        fn = getattr(module, attr or "compute_score")
    except AttributeError as err:
        raise ConfigError(f"{field} {path!r} cannot be loaded ({err}); write it as 'package.module:function'") from None
    if not callable(fn):
        raise ConfigError(f"{field} {path!r} is not callable")
    return fn


def role_specs(cfg: PPOConfig, spec: RunSpec, plan: ExecutionPlan, inputs: RunInputs, *,
               reward_source: Any = None) -> dict[str, RoleSpec]:
    """How to build the engines of each role of ``spec.graph`` from the config, the run spec and ``plan``;
    ``reward_source`` (None: the config's) scores for the reward role."""
    sampling = SamplingParams(n=1, max_new_tokens=inputs.max_response_length, temperature=cfg.temperature,
                              top_p=cfg.top_p, top_k=cfg.top_k, seed=stream_seed(cfg.seed, "rollout"))
    common = dict(max_grad_norm=cfg.max_grad_norm, weight_decay=cfg.weight_decay, betas=cfg.adam_betas, ppo_epochs=cfg.ppo_epochs, mini_batch_size=cfg.batch_size, micro_batch_size=cfg.micro_batch_size,
                  pack_sequences=cfg.pack_sequences, max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch,
                  num_threads=cfg.num_threads, seed=cfg.seed)
    specs: dict[str, RoleSpec] = {}
    for role in spec.graph.roles:
        model = spec.source(role.name)
        if role.kind == "policy":
            train = TrainEngineConfig(lr=cfg.actor_lr, temperature=cfg.temperature, lora=cfg.lora_settings(), **common,
                                      **cfg.actor_lr_schedule.engine_settings(cfg.max_steps))
            engine = plan.placement(role.name).rollout_engine or spec.rollout_engine
            specs[role.name] = RoleSpec(model=model, tokenizer=inputs.tokenizer, train=train, sampling=sampling,
                                        rollout_engine=engine, rollout_options=dict(cfg.rollout_engine_options))
        elif role.kind == "critic":
            specs[role.name] = RoleSpec(model=model, train=TrainEngineConfig(lr=cfg.critic_lr, **common,
                                                                             **cfg.critic_lr_schedule.engine_settings(cfg.max_steps)))
        elif role.kind == "reference":
            forward = TrainEngineConfig(pack_sequences=cfg.pack_sequences,
                                        max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch)
            specs[role.name] = RoleSpec(model=model, sampling=sampling, train=forward, base_of=_lora_base_of(cfg, spec.graph))
        elif role.kind == "cost":
            specs[role.name] = cost_spec(cfg, inputs, spec.graph, role.name)
        else:
            specs[role.name] = reward_spec(cfg, inputs, reward_source)
    return specs


def _lora_base_of(cfg: PPOConfig, graph: Graph) -> str | None:
    """The LoRA policy a reference is the base model of: with lora_rank > 0 and no ref_model_name, the reference is
    the actor's initial model, i.e. its base model (the adapters start at zero)."""
    if not cfg.lora_rank or cfg.ref_model_name:
        return None
    return next((r.name for r in graph.roles if r.kind == "policy"), None)


def reward_spec(cfg: PPOConfig, inputs: RunInputs, reward_source: Any = None) -> RoleSpec:
    """A reward role: ``reward_source`` (set with ``Trainer.set_reward_model``), else ``reward_model_name``, else the
    rule ``reward_fn``."""
    if reward_source is not None:
        return RoleSpec(reward=reward_source, tokenizer=inputs.tokenizer, unfinished_score=cfg.unfinished_score,
                        reward_timeout_s=cfg.reward_timeout_s)
    model = ROLE_MODEL_SOURCES["reward"](cfg, inputs.actor_path)
    if model:
        return RoleSpec(model=model)
    return RoleSpec(reward=load_function(cfg.reward_fn), tokenizer=inputs.tokenizer, unfinished_score=cfg.unfinished_score,
                    reward_timeout_s=cfg.reward_timeout_s)


def cost_spec(cfg: PPOConfig, inputs: RunInputs, graph: Graph, role: str) -> RoleSpec:
    """A cost role scores with ``cost_model_name`` or the rule ``cost_fn`` (never the reward); ConfigError without one."""
    model = ROLE_MODEL_SOURCES["cost"](cfg, inputs.actor_path)
    if model:
        return RoleSpec(model=model)
    if cfg.cost_fn:
        # unfinished_score=None: a truncated response gets its cost like any other, not a free 0
        return RoleSpec(reward=load_function(cfg.cost_fn, "cost_fn"), tokenizer=inputs.tokenizer, unfinished_score=None,
                        reward_timeout_s=cfg.reward_timeout_s)
    raise ConfigError(f"{graph.name} has a cost role ({role!r}) but no cost source: set cost_fn "
                      "('package.module:function' returning a cost, e.g. "
                      "'hybridflow_ops.rewards.arithmetic:long_answer_cost') or cost_model_name")
