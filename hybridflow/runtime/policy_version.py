"""Policy versions: which weights produced each sampled token.

A policy's **version** is the number of training steps (updates) its train engine has taken:
``TrainEngine.scheduler.training_step``, which a checkpoint saves and a resume restores, so versions
continue across a resume. A rollout engine records the version of the weights it holds in its
attribute ``policy_version`` (:func:`set_weight_version`): a weight sync sets it to the sender's version
(a hybrid-engine sync, or one whose engines share a module, to the train engine's own; a cross-pool
broadcast sends it after the weights, the local mailbox beside them). The worker sets it, so an engine
that does not stamp tokens itself (a test's fake) needs nothing: :func:`with_policy_version` fills the field.

:func:`with_policy_version` adds the field ``policy_version`` int64[B, R] (the graph's ``Rollout`` schema)
to a generate node's output where the engine did not write it: the version of the weights that sampled
each token. The transformers and vLLM engines stamp each token themselves (-1 at padding), so a partial
rollout continued under newer weights carries the newer version from the token where it continued
(:mod:`.partial`).

With ``staleness=k`` the trainer compares these versions with its own (steps done) to report
``rollout/staleness`` (mean over response tokens) and ``rollout/staleness_max``.
"""
from __future__ import annotations

from typing import Any

import torch

from ..batch import Batch

__all__ = ["VERSION_SUFFIX", "POLICY_VERSION_FIELD", "policy_version", "set_weight_version", "weight_version",
           "with_policy_version", "staleness_metrics"]

VERSION_SUFFIX = "/version"
"""Mailbox key suffix of a local cross-pool sync's version (beside the tensors under the group's name)."""

POLICY_VERSION_FIELD = "policy_version"


def policy_version(train: Any) -> int:
    """The version of a train engine's weights: the training steps it has taken (0 before the first update)."""
    scheduler = getattr(train, "scheduler", None)
    return int(getattr(scheduler, "training_step", 0))


def set_weight_version(rollout: Any, version: int) -> None:
    """Record on a rollout engine that it now holds weights of ``version``."""
    rollout.policy_version = int(version)


def weight_version(rollout: Any) -> int:
    """The version a rollout engine's weights are at (0: never synced, the initial weights)."""
    return int(getattr(rollout, "policy_version", 0))


def with_policy_version(batch: Batch, rollout: Any) -> Batch:
    """``batch`` (a rollout, ``response_ids`` [B, R]) with ``policy_version`` [B, R]: the engine's weight version
    on every position (an engine that already wrote per-token versions keeps them)."""
    if POLICY_VERSION_FIELD in batch.tensors.keys():
        return batch
    ids = batch["response_ids"]
    return batch.with_fields(policy_version=torch.full(ids.shape, weight_version(rollout), dtype=torch.int64))


def staleness_metrics(env: dict[str, Batch], trainer_version: int) -> dict[str, float]:
    """``rollout/staleness`` (mean) and ``rollout/staleness_max`` over the response tokens of every rollout in
    ``env`` that carries versions: ``trainer_version - policy_version``; {} when none does."""
    lags = []
    for batch in env.values():
        keys = batch.tensors.keys()
        if POLICY_VERSION_FIELD in keys and "response_mask" in keys:
            mask = batch["response_mask"] > 0
            lags.append((trainer_version - batch[POLICY_VERSION_FIELD])[mask].double())
    if not lags:
        return {}
    lag = torch.cat(lags)
    if not lag.numel():
        return {"rollout/staleness": 0.0, "rollout/staleness_max": 0.0}
    return {"rollout/staleness": float(lag.mean()), "rollout/staleness_max": float(lag.max())}
