"""How to build the engines of each role: :class:`RoleSpec`.

A role's *kind* comes from the graph (policy, critic, reference, reward, cost);
its spec says where its model comes from and how its engines are set:

* policy — ``model`` (path, hub name or module), ``tokenizer``, ``train``
  (:class:`TrainEngineConfig`), ``sampling`` (:class:`SamplingParams`),
  ``rollout_engine`` (a name in :data:`~.engines.registry.ROLLOUT_ENGINES`:
  ``hf``, ``vllm``) and its ``rollout_options``;
* critic — ``model`` (a causal-LM or base-model path/hub name, or a module whose
  backbone is copied) and ``train``;
* reference — ``model``, and optionally ``train`` (only its forward settings:
  ``pack_sequences``, ``max_tokens_per_micro_batch``, ``micro_batch_size``); or ``base_of``: the
  LoRA policy whose base model it is, whose module it then computes with, adapters disabled, where
  that policy trains in the same process (:class:`~.engines.base_view.BaseModelView`: no second
  copy of the base weights);
* reward / cost — ``reward``: a ``compute_score`` function, any object with
  ``score(batch) -> RewardOutput`` (a reward model, a remote reward model), or
  ``model`` (a sequence-classification reward model path).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from ..errors import ConfigError
from .engines import RewardModel, RuleRewardSource, SamplingParams, TrainEngine, TrainEngineConfig, ValueModel
from .engines.base_view import BaseModelView
from .engines.lora import is_lora
from .engines.protocols import RolloutEngine
from .engines.registry import RolloutBuild, build_rollout

__all__ = ["RoleSpec", "build_engines", "base_model_view", "RoleEngines"]

ModelSource = "str | os.PathLike | torch.nn.Module"


@dataclass
class RoleSpec:
    """Where a role's model comes from and how its engines are set (see the module docstring)."""

    model: Any = None
    tokenizer: Any = None
    train: TrainEngineConfig | None = None
    sampling: SamplingParams | None = None
    reward: Callable | Any = None
    share_rollout_module: bool = True
    """Policy: the rollout engine uses the train engine's module (one copy of the weights, weight sync copies
    nothing). False gives the rollout engine its own copy, refreshed by every weight_sync op."""
    unfinished_score: float | None = None
    """Rule rewards: score given to responses that never produced EOS (None: score them like the others)."""
    reward_timeout_s: float | None = None
    """Rule rewards: longest one compute_score call may take (RewardError past it); None: no limit."""
    rollout_engine: str = "hf"
    """Policy: the rollout engine's registry name (the plan's ``RolePlacement.rollout_engine``)."""
    rollout_options: dict[str, Any] | None = None
    """Policy: options of that engine (``rollout_engine_options`` in the config)."""
    base_of: str | None = None
    """Reference: the LoRA policy role whose base model (adapters disabled) this reference is. Where that role's
    train engine is built in the same process, the reference computes with its module; elsewhere it loads
    ``model`` (the same base weights) as usual."""


@dataclass
class RoleEngines:
    """The engines one role owns on its device."""

    kind: str
    train: TrainEngine | None = None
    rollout: RolloutEngine | None = None
    reward: Any = None


def _causal_lm(source: Any, role: str, device: str) -> torch.nn.Module:
    if isinstance(source, torch.nn.Module):
        return source.to(device)
    if source is None:
        raise ConfigError(f"role {role!r} needs a model: a path, a hub name, or a torch module (RoleSpec.model)")
    from ..data import load_causal_lm

    return load_causal_lm(source, device=device)


def _tokenizer(spec: RoleSpec, role: str):
    if spec.tokenizer is not None or isinstance(spec.model, torch.nn.Module) or spec.model is None:
        return spec.tokenizer
    from ..data import load_tokenizer

    return load_tokenizer(spec.model)


def build_engines(role: str, kind: str, spec: RoleSpec, device: str) -> RoleEngines:
    """The engines of ``role`` (of graph role ``kind``) on ``device``."""
    builder = _BUILDERS.get(kind)
    if builder is None:
        raise ConfigError(f"role {role!r} has kind {kind!r}, for which no engines exist; kinds: {', '.join(_BUILDERS)}")
    return builder(role, spec, device)


def base_model_view(role: str, spec: RoleSpec, built: Mapping[str, RoleEngines]) -> RoleEngines | None:
    """The reference ``role`` as a view of its LoRA policy's module (``spec.base_of``) when that policy's train engine
    is among ``built``; None otherwise (build it from ``spec.model``)."""
    policy = built.get(spec.base_of) if spec.base_of else None
    if policy is None or policy.train is None or not is_lora(policy.train.module):
        return None
    temperature = spec.sampling.temperature if spec.sampling is not None else 1.0
    return RoleEngines(kind="reference", train=BaseModelView(policy.train, role=role, temperature=temperature))


def _policy(role: str, spec: RoleSpec, device: str) -> RoleEngines:
    model = _causal_lm(spec.model, role, device)
    sampling = spec.sampling or SamplingParams()
    train = spec.train or TrainEngineConfig(temperature=sampling.temperature)
    engine = TrainEngine(model, train, metric_prefix="actor" if role == "actor" else role, device=device)
    rollout = build_rollout(spec.rollout_engine, RolloutBuild(
        role=role, model=model, source=spec.model, tokenizer=_tokenizer(spec, role), sampling=sampling, device=device,
        share=spec.share_rollout_module, options=spec.rollout_options or {}))
    return RoleEngines(kind="policy", train=engine, rollout=rollout)


def _critic(role: str, spec: RoleSpec, device: str) -> RoleEngines:
    source = spec.model
    if isinstance(source, ValueModel):
        model = source
    elif isinstance(source, torch.nn.Module):
        model = ValueModel.from_causal_lm(source)
    elif source is None:
        raise ConfigError(f"critic role {role!r} needs a model (RoleSpec.model): usually the actor's path")
    else:
        model = ValueModel.from_pretrained(source)
    engine = TrainEngine(model, spec.train or TrainEngineConfig(), metric_prefix="critic" if role == "critic" else role,
                         device=device)
    return RoleEngines(kind="critic", train=engine)


def _reference(role: str, spec: RoleSpec, device: str) -> RoleEngines:
    model = _causal_lm(spec.model, role, device)
    temperature = spec.sampling.temperature if spec.sampling is not None else 1.0
    # An engine that is never updated: AdamW allocates no state before its first step. Of ``spec.train`` it
    # takes the forward's settings only (packing, token budget, micro-batch size).
    forward = spec.train or TrainEngineConfig()
    config = TrainEngineConfig(lr=0.0, temperature=temperature, entropy_metric=False, pack_sequences=forward.pack_sequences,
                               max_tokens_per_micro_batch=forward.max_tokens_per_micro_batch,
                               micro_batch_size=forward.micro_batch_size)
    engine = TrainEngine(model, config, metric_prefix=role, device=device)
    return RoleEngines(kind="reference", train=engine)


def _reward(role: str, spec: RoleSpec, device: str) -> RoleEngines:
    source = spec.reward
    if source is None and spec.model is not None:
        source = RewardModel.from_pretrained(spec.model, device=device)
    if source is None:
        raise ConfigError(f"role {role!r} needs a reward: a compute_score function, a reward model path "
                          "(RoleSpec.model) or an object with score(batch)")
    if not hasattr(source, "score"):
        if not callable(source):
            raise ConfigError(f"role {role!r}: reward {source!r} is neither callable nor has score(batch)")
        tokenizer = spec.tokenizer
        eos = ()
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos = (tokenizer.eos_token_id,)
        source = RuleRewardSource(source, tokenizer=tokenizer, eos_token_ids=eos, unfinished_score=spec.unfinished_score,
                                  timeout_s=spec.reward_timeout_s)
    return RoleEngines(kind="reward", reward=source)


_BUILDERS: dict[str, Callable[[str, RoleSpec, str], RoleEngines]] = {
    "policy": _policy, "critic": _critic, "reference": _reference, "reward": _reward, "cost": _reward,
}
