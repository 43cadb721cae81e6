"""The engines of one slot: what :func:`~hybridflow.runtime.roles.build_engines` builds, adapted to the slot.

* dp = 1: the engines a local run would build (a policy's rollout engine shares
  the train engine's module, so the hybrid-engine sync copies nothing).
* dp > 1: the train engine becomes an :class:`~..engines.fsdp.FSDPTrainEngine`
  over the pool's process group; a policy's rollout engine gets its own full
  copy of the weights (made before sharding), refreshed by each weight sync;
  the global ``mini_batch_size`` is divided by dp (each rank steps on its share).
* a policy whose generation runs on another pool keeps only its train engine
  here (its rollout engine is built as ``hf`` and dropped, whatever the config
  names), and the generation pool's slots keep only the rollout engine.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Mapping

import torch

from ..errors import ConfigError
from .engines import TrainEngineConfig
from .roles import RoleEngines, RoleSpec, base_model_view, build_engines
from .topology import RoleSlot

__all__ = ["build_slot_engines", "rank_train_config"]


def rank_train_config(config: TrainEngineConfig, dp: int, role: str) -> TrainEngineConfig:
    """``config`` for one of ``dp`` ranks: mini-batch divided by dp, micro-batch no larger than it."""
    if dp == 1 or config.mini_batch_size is None:
        return config
    if config.mini_batch_size % dp:
        raise ConfigError(f"role {role!r}: mini_batch_size {config.mini_batch_size} is not divisible by its "
                          f"{dp} data-parallel ranks; use a multiple of {dp}")
    mini = config.mini_batch_size // dp
    micro = min(config.micro_batch_size, mini) if config.micro_batch_size else None
    return config.model_copy(update={"mini_batch_size": mini, "micro_batch_size": micro})


def _engines(slot: RoleSlot, spec: RoleSpec, device: str, mesh) -> RoleEngines:
    sharded = slot.train and slot.dp > 1
    if sharded:
        spec = dataclasses.replace(spec, share_rollout_module=False)
    if slot.kind == "policy" and not slot.rollout and spec.rollout_engine != "hf":
        # the rollout engine is dropped below: build the cheap one (hf shares the module) rather than, e.g., a vLLM
        # engine whose start-up alone takes tens of seconds
        spec = dataclasses.replace(spec, rollout_engine="hf", rollout_options={})
    if not slot.train and isinstance(spec.model, torch.nn.Module):
        # a generation pool's own weights, even when its slot shares a process with the train pool (LocalExecutor)
        spec = dataclasses.replace(spec, model=copy.deepcopy(spec.model))
    engines = build_engines(slot.role, slot.kind, spec, device)
    if slot.kind != "policy" or not slot.rollout:
        engines.rollout = None
    if not slot.train:
        engines.train = None
    if sharded and engines.train is not None:
        from .engines.fsdp import FSDPTrainEngine

        old = engines.train
        engines.train = FSDPTrainEngine(old.module, rank_train_config(old.config, slot.dp, slot.role), mesh=mesh,
                                        metric_prefix=old.metric_prefix, device=device)
    return engines


def build_slot_engines(roles: tuple[RoleSlot, ...], specs: Mapping[str, RoleSpec], device: str,
                       mesh=None) -> dict[str, RoleEngines]:
    """Role name -> engines for the roles of one slot; ``mesh`` is the pool's 1-D mesh (needed when dp > 1).

    A reference whose spec names a LoRA policy (``base_of``) that trains on this slot shares the policy's module
    (:func:`~.roles.base_model_view`); placed apart from it, the reference loads its own base weights.
    """
    built: dict[str, RoleEngines] = {}
    for slot in sorted(roles, key=lambda s: specs[s.role].base_of is not None):  # policies before their views
        spec = specs[slot.role]
        built[slot.role] = base_model_view(slot.role, spec, built) or _engines(slot, spec, device, mesh)
    return {slot.role: built[slot.role] for slot in roles}
