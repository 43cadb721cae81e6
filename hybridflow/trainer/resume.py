"""Saving a run as a checkpoint, and picking a run up from one (``resume``).

Every role's state is written and read by the workers that hold it, as the ops of a checkpoint or
restore plan derived from the training plan (:func:`hybridflow.compiler.control.control_plan`: each
slot its own shard, the sampler's RNG per rank; onloaded first where the training plan offloads the
role, and a restore syncs the policy's rollout engine to the loaded weights); this process handles
JSON only: the sections the workers return (:mod:`.run_state`), and the controller's own state,
which the trainer gives to :func:`save_run` and reads back from the checkpoint that
:func:`resume_run` / :func:`resume_newest` loaded. What a checkpoint is written from and loaded into is a
:class:`CheckpointScope`. A checkpoint written at
one data-parallel size resumes at another (DCP reshards).

``resume="auto"`` continues from the newest checkpoint under ``<output_dir>/checkpoints``
that verifies (corrupt or partial ones are skipped with a warning), or starts fresh when
there is none; ``"never"`` starts fresh, and refuses a folder that holds checkpoints unless
``overwrite=True`` (then they are deleted); any other value is the path of one checkpoint folder, which must verify.

With ``staleness`` k > 0 the generations of up to k following steps are in flight at a checkpoint. They are
not saved: the loader position in the checkpoint is the one before their prompts were drawn
(:mod:`.prompt_queue`), so a resumed run draws and generates them again with the restored weights, and trains
on exactly the prompts an uninterrupted run trains on. Their lag after the resume is that of a run's start
(0, 1, ..., k-1 updates), not k.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..compiler.control import control_plan, trained_roles
from ..compiler.plan import ExecutionPlan
from ..errors import CheckpointError, OutputDirError
from ..runtime.engines.lora import ADAPTER_CONFIG, settings_adapter_config
from .checkpoint import (CHECKPOINTS, TENSORS, LoadedCheckpoint, list_checkpoints, newest_checkpoint, read_checkpoint,
                         save_checkpoint)
from .config import RUN_CONTROL_FIELDS, PPOConfig, config_hash
from .run_state import capture_json, restore, role_sections, state_sections
from .setup import RunInputs

if TYPE_CHECKING:
    from ..runtime.interpreter import PlanExecutor

__all__ = ["CheckpointScope", "save_run", "check_fresh_start", "resume_run", "resume_newest", "trained_roles",
           "policy_reports"]

log = logging.getLogger("hybridflow.trainer")


@dataclass(frozen=True)
class CheckpointScope:
    """What a run's checkpoints are written from and loaded into."""

    config: PPOConfig
    algorithm: str
    """The algorithm's name, recorded in the checkpoint; a checkpoint of another algorithm is refused."""
    executor: "PlanExecutor"
    """Its workers hold the engines, and write and read their shards."""
    plan: ExecutionPlan
    inputs: RunInputs
    """The tokenizer and the actor's source, written beside the policies' weights (``hf/<role>``)."""
    output_dir: Path
    """Checkpoints go to ``<output_dir>/checkpoints``."""


def policy_reports(scope: CheckpointScope) -> dict[str, dict]:
    """Policy role -> the report of its train engine's worker (``describe``: its model's config, ...)."""
    policies = [r.name for r in scope.plan.graph.roles if r.kind == "policy"]
    if not policies:
        return {}
    plan = control_plan(scope.plan, "describe", policies)
    results = scope.executor.run_plan(plan).results
    return {role: results[f"{role}.describe"][0] for role in policies}


def _write_hf_files(scope: CheckpointScope):
    """Writes each policy's transformers config, generation config and tokenizer under ``hf/<role>`` (the configs
    as its worker reports them); a LoRA policy's peft ``adapter_config.json`` too, naming its base model."""
    lora = scope.config.lora_settings()

    def write(folder: Path) -> None:
        for role, report in policy_reports(scope).items():
            target = folder / "hf" / role
            report["model_config"].save_pretrained(target)
            if report["generation_config"] is not None:
                report["generation_config"].save_pretrained(target)
            scope.inputs.tokenizer.save_pretrained(target)
            if lora is not None:  # the checkpoint holds the adapters; export finds their base model here
                config = settings_adapter_config(lora, base_model=_base_model_path(scope.inputs.actor_path))
                (target / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    return write


def _base_model_path(source: str) -> str:
    """A local model folder as an absolute path (a checkpoint may be exported from another directory); else as given."""
    path = Path(source)
    return str(path.resolve()) if path.is_dir() else source


def save_run(scope: CheckpointScope, step: int, controller_state: Mapping[str, Any]) -> Path:
    """Checkpoint step ``step`` under ``<output_dir>/checkpoints``, with the controller's JSON ``controller_state``
    (the data loader's position, ...: given back as the loaded checkpoint's ``state``); returns the folder."""
    cfg = scope.config
    start = time.perf_counter()
    state = {"algorithm": scope.algorithm, "config": cfg.model_dump(mode="json"), "config_hash": config_hash(cfg),
             **controller_state}
    plan = control_plan(scope.plan, "save_state")
    ops = {op.name: op.role for op in plan.ops if op.kind == "save_state"}

    def write_shards(folder: Path):
        """The workers write the roles' shards and return their JSON sections and the shards' manifest entries."""
        results = scope.executor.run_plan(plan, args={name: str(folder) for name in ops}).results
        sections, manifest = state_sections(ops, {name: results[name] for name in ops})
        return capture_json(sections), manifest

    path = save_checkpoint(scope.output_dir / CHECKPOINTS, step, {}, state, keep=cfg.keep_checkpoints,
                           write_extra=_write_hf_files(scope), write_shards=write_shards)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    log.info("checkpoint of step %d written to %s (%.1f MB, %.2f s)", step, path, size / 1e6,
             time.perf_counter() - start)
    return path


def _check_compatible(config: PPOConfig, algorithm: str, found: LoadedCheckpoint) -> None:
    saved_algorithm = found.state.get("algorithm")
    if saved_algorithm != algorithm:
        raise CheckpointError(f"{found.path} was written by a {saved_algorithm} run; this trainer runs "
                              f"{algorithm}. Use another output_dir, or resume='never' overwrite=true to start over")
    if found.state.get("config_hash") != config_hash(config):
        saved = found.state.get("config", {})
        now = config.model_dump(mode="json")
        if "seed" in saved and saved["seed"] != now.get("seed"):  # the data order and every sampling stream follow it
            raise CheckpointError(
                f"{found.path} was written by a run with seed={saved['seed']}; this run has seed={now.get('seed')}. A "
                f"resumed run keeps its seed (the prompt order and the sampling streams follow it): drop the seed "
                f"override (or set seed={saved['seed']}), or start a fresh run in another output_dir")
        changed = sorted(k for k in set(saved) | set(now) if k not in RUN_CONTROL_FIELDS and saved.get(k) != now.get(k))
        log.warning("resuming %s with a changed config (%s); the run will not match an uninterrupted one",
                    found.path, ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed))


def check_fresh_start(config: PPOConfig, output_dir: Path) -> None:
    """resume='never' on a folder with checkpoints and without overwrite=true: OutputDirError, nothing deleted.

    Called before the models load, so that the mistake costs no time.
    """
    root = output_dir / CHECKPOINTS
    stale = list_checkpoints(root) if config.resume == "never" else []
    if stale and not config.overwrite:
        raise OutputDirError(
            f"resume='never' but {root} holds {len(stale)} checkpoint(s) of an earlier run (newest: "
            f"{stale[-1][1].name}); nothing was deleted. Use a new output_dir, resume='auto' to continue that "
            "run, or overwrite=true to delete its checkpoints and start fresh")


def _find(config: PPOConfig, output_dir: Path) -> LoadedCheckpoint | None:
    mode = config.resume
    root = output_dir / CHECKPOINTS
    if mode == "never":
        check_fresh_start(config, output_dir)
        stale = list_checkpoints(root)
        if stale:
            log.warning("resume='never' overwrite=true: removing %d checkpoint(s) of an earlier run in %s",
                        len(stale), root)
            shutil.rmtree(root)
        return None
    if mode == "auto":
        found = newest_checkpoint(root, prefixes=())
        if found is None and list_checkpoints(root):
            log.warning("no checkpoint in %s verifies; starting fresh", root)
        return found
    return read_checkpoint(Path(mode), prefixes=())


def resume_run(scope: CheckpointScope) -> LoadedCheckpoint | None:
    """Load the checkpoint ``config.resume`` names into the workers' engines and the rollouts' RNGs; returns it
    (its ``state`` holds the controller's), or None when the run starts fresh."""
    found = _find(scope.config, scope.output_dir)
    if found is not None:
        _load(scope, found)
    return found


def resume_newest(scope: CheckpointScope) -> LoadedCheckpoint:
    """Load the newest checkpoint that verifies, whatever ``config.resume`` says (recovery after a lost worker)."""
    root = scope.output_dir / CHECKPOINTS
    found = newest_checkpoint(root, prefixes=())
    if found is None:
        raise CheckpointError(f"no checkpoint in {root} to continue from after the lost worker; "
                              "max_restarts needs save_freq > 0")
    _load(scope, found)
    return found


def _load(scope: CheckpointScope, found: LoadedCheckpoint) -> None:
    _check_compatible(scope.config, scope.algorithm, found)
    if found.state.get("format_version", 1) < 2:
        raise CheckpointError(f"{found.path} was written by an older hybridflow (one tensors/ folder written by the "
                              "driver); it can be exported (hybridflow export) but not resumed. Start fresh in another "
                              "output_dir")
    folder = found.path / TENSORS
    saved = found.state.get("engines", {})
    for role in trained_roles(scope.plan.graph):
        if role not in saved or not (folder / role / ".metadata").is_file():
            raise CheckpointError(f"{found.path}: the checkpoint has no state for role {role!r} (no {TENSORS}/{role}/ "
                                  f"DCP folder, or no JSON state for it); it holds {sorted(saved)}")
    plan = control_plan(scope.plan, "load_state")
    args = {op.name: {"folder": str(folder), **role_sections(found.state, op.role)}
            for op in plan.ops if op.kind == "load_state"}
    scope.executor.run_plan(plan, args=args)
    restore(found.state)
