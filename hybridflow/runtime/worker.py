"""The role worker: hosts the engines of the roles placed on one device and runs node kinds on them.

A worker is what a device slot is in a plan. Colocated roles share it (one
process, one device); the executor calls its methods by node kind. On one
machine the :class:`~hybridflow.runtime.local.LocalExecutor` holds one worker
per pool; the Ray executor holds one Ray actor per device slot, each wrapping
the same class.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ..errors import AgentError, ExecutionError
from ..batch import Batch
from .engines import SamplingParams
from .engines.agent_loop import AgentParams
from .roles import RoleEngines, RoleSpec, build_role_engines
from .weight_sync import DEFAULT_BUCKET_BYTES, SyncStats, stream_into

__all__ = ["RoleWorker"]


class RoleWorker:
    """The engines of every role on ``device``; ``roles`` maps role name -> (graph role kind, spec)."""

    def __init__(self, device: str, roles: Mapping[str, tuple[str, RoleSpec]]):
        self.device = device
        self.engines: dict[str, RoleEngines] = build_role_engines(roles, device)
        self._offloaded: dict[str, set[str]] = {name: set() for name in self.engines}

    @classmethod
    def from_engines(cls, device: str, engines: Mapping[str, RoleEngines]) -> "RoleWorker":
        """A worker over engines built elsewhere (the Ray executor builds FSDP engines, or one half of a policy)."""
        worker = cls(device, {})
        for role, role_engines in engines.items():
            worker.install(role, role_engines)
        return worker

    def install(self, role: str, engines: RoleEngines) -> None:
        """Host ``engines`` as ``role``'s (replacing any it had; e.g. a new reward source), resident."""
        self.engines[role] = engines
        self._offloaded.setdefault(role, set())

    def engines_for(self, role: str, need: str) -> RoleEngines:
        """``role``'s engines, which must include a ``need`` engine (train, rollout, reward) and be resident
        (not offloaded); an ExecutionError naming the role otherwise."""
        engines = self.engines.get(role)
        if engines is None:
            raise ExecutionError(f"worker on {self.device} hosts no role {role!r}; it hosts {', '.join(self.engines)}")
        if getattr(engines, need) is None:
            raise ExecutionError(f"role {role!r} ({engines.kind}) on {self.device} has no {need} engine")
        if self._offloaded[role]:
            raise ExecutionError(f"role {role!r} on {self.device} is offloaded ({', '.join(sorted(self._offloaded[role]))}); "
                                 "the plan must onload it before this op")
        return engines

    # -- node kinds ------------------------------------------------------------------
    def generate(self, role: str, prompts: Batch, overrides: Mapping[str, object],
                 agent: Mapping[str, object] | None = None) -> Batch:
        """Responses to ``prompts``; with ``agent`` (a node's env settings), multi-turn trajectories."""
        rollout = self.engines_for(role, "rollout").rollout
        params = rollout.sampling.model_copy(update={k: v for k, v in overrides.items() if v is not None})
        params = SamplingParams.model_validate(params.model_dump())
        if agent is None:
            return rollout.generate(prompts, params)
        if not hasattr(rollout, "generate_agentic"):
            raise AgentError(f"role {role!r}: a rollout with env={agent.get('env')!r} needs a rollout engine with an "
                             f"agent loop (hf, vllm); {type(rollout).__name__} has none")
        return rollout.generate_agentic(prompts, params, AgentParams.model_validate(dict(agent)))

    def logprob(self, role: str, batch: Batch) -> torch.Tensor:
        return self.engines_for(role, "train").train.compute_log_probs(batch)

    def values(self, role: str, batch: Batch) -> torch.Tensor:
        return self.engines_for(role, "train").train.compute_values(batch)

    def score(self, role: str, batch: Batch):
        return self.engines_for(role, "reward").reward.score(batch)

    def update(self, role: str, batch: Batch, terms: Sequence[tuple[str, float, dict]]) -> dict[str, float]:
        return self.engines_for(role, "train").train.update(batch, terms)

    # -- transitions -------------------------------------------------------------------
    def sync_weights(self, role: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> SyncStats:
        """Hybrid engine: stream the train engine's full tensors into the rollout engine in buckets of
        ``bucket_bytes``; nothing moves (all-zero stats) when the two share one module."""
        engines = self.engines_for(role, "rollout")
        if engines.train is None or engines.rollout.shares_weights_with(engines.train):
            return SyncStats(0, 0, 0, 0, 0.0)
        return stream_into(engines.rollout, engines.train.named_weights(), bucket_bytes=bucket_bytes)

    def offload(self, role: str, items: Sequence[str]) -> None:
        self._move(role, items, torch.device("cpu"))
        # the transformers rollout engine allocates its KV cache per generate call and frees it after: offloading
        # it leaves nothing resident, and the role's other engines stay usable
        self._offloaded[role].update(item for item in items if item != "kv_cache")

    def onload(self, role: str, items: Sequence[str]) -> None:
        self._offloaded[role].difference_update(items)
        self._move(role, items, torch.device(self.device))

    def _move(self, role: str, items: Sequence[str], device: torch.device) -> None:
        engines = self.engines[role]
        train, rollout = engines.train, engines.rollout
        if train is not None:
            train.move_states(items, device)
        if rollout is not None and "params" in items and not (train is not None and rollout.shares_weights_with(train)):
            rollout.sleep() if device.type == "cpu" else rollout.wake()
