"""Where a run's model and prompts come from (:func:`run_inputs`), and the checks made once before it starts."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError, GraphValidationError
from ..graph import Graph
from ..graph.analysis import samples_per_prompt
from ..graph.validate import check_group_sizes
from .config import GRAPH_ATTRS, ROLE_SOURCE_FIELDS, PPOConfig

__all__ = ["RunInputs", "run_inputs", "actor_source", "check_devices", "check_trainable", "load_rows", "response_length",
           "check_batch_sizes",
           "ignored_fields", "ignored_role_fields", "BUILTIN_RESPONSE_LENGTH"]

log = logging.getLogger("hybridflow.trainer")

BUILTIN_RESPONSE_LENGTH = 3
"""max_response_length for the built-in arithmetic task when the config leaves it unset: the longest
answer (18) is two tokens, plus EOS."""


@dataclass(frozen=True)
class RunInputs:
    """What a run reads before it plans: the actor's model, its tokenizer, the prompts, the response limit."""

    actor_path: str
    """The actor's folder or hub name (:func:`actor_source`)."""
    tokenizer: Any
    train_rows: list[dict]
    val_rows: list[dict]
    max_response_length: int
    """Tokens per response (:func:`response_length`)."""


def run_inputs(config: PPOConfig, output_dir: Path) -> RunInputs:
    """The run's inputs; with no actor configured, the built-in tiny model is made in ``output_dir`` (or copied from
    the cache), with no train_files the built-in arithmetic task is the data."""
    from ..data import load_tokenizer

    actor = actor_source(config, output_dir)
    tokenizer = load_tokenizer(actor)
    train, val = load_rows(config)
    return RunInputs(actor, tokenizer, train, val, response_length(config))


def actor_source(config: PPOConfig, output_dir: Path) -> str:
    """The actor's path or hub name; with none configured, a tiny model for the built-in task, made in code."""
    if config.actor_model_name:
        return config.actor_model_name
    path = output_dir / "tiny_model"
    if not (path / "config.json").exists():
        _make_builtin_model(path, config.seed)
    log.warning("no actor_model_name given: using a tiny random-weight model (127k parameters, format warm-up on "
                "wrong answers only) for the built-in arithmetic task at %s", path)
    return str(path)


def _make_builtin_model(path: Path, seed: int) -> None:
    """The built-in task's model: random weights, then 40 format-only warm-up steps.

    The warm-up trains on ``a+b=<random wrong answer><eos>`` (never the true sum, see
    :func:`~hybridflow.data.tasks.arithmetic.random_wrong_answer`): it teaches the shape of
    an answer, so that RL spends its steps on correctness. Written to a temporary folder
    and renamed, so an interrupted run never leaves a half-made model behind. A model once
    made is kept in ``$HYBRIDFLOW_CACHE/builtin_models`` (:func:`builtin_model_key`: the seed, the
    thread count, the versions and the source of the code that makes it) and copied from there.
    """
    import shutil

    from ..compiler.calibrate import cache_root

    staging = path.with_name(path.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    cached = cache_root() / "builtin_models" / builtin_model_key(seed)
    if (cached / "config.json").is_file():
        shutil.copytree(cached, staging)
    else:
        _build_builtin_model(staging, seed)
        _store(staging, cached)
    staging.rename(path)


def _build_builtin_model(folder: Path, seed: int) -> None:
    from ..data import bench_model_shape, create_tiny_model_dir, load_causal_lm, load_tokenizer
    from ..data.tasks.arithmetic import make_arithmetic_rows, random_wrong_answer
    from .warmup import supervised_warmup

    create_tiny_model_dir(folder, task="arithmetic", seed=seed, **bench_model_shape("tiny"))
    model = load_causal_lm(folder)
    supervised_warmup(model, load_tokenizer(folder), make_arithmetic_rows(), random_wrong_answer, steps=40, lr=3e-3,
                      seed=seed)
    model.save_pretrained(folder)


def builtin_model_key(seed: int) -> str:
    """What the built-in model's bytes depend on: seed, torch threads (the warm-up's float order), the torch and
    transformers versions and the source of the modules that make it (a change to the recipe is a new key)."""
    import hashlib
    import inspect

    import torch
    import transformers

    from ..data import tiny
    from ..data.tasks import arithmetic
    from . import warmup

    digest = hashlib.sha256()
    for module in (tiny, arithmetic, warmup):
        digest.update(inspect.getsource(module).encode())
    digest.update(inspect.getsource(_build_builtin_model).encode())
    digest.update(f"{torch.__version__} {transformers.__version__} {torch.get_num_threads()}".encode())
    return f"seed{seed}-{digest.hexdigest()[:20]}"


def _store(folder: Path, cached: Path) -> None:
    """Copy ``folder`` to ``cached`` atomically; a copy another process stored first is kept. Best effort:
    a cache that cannot be written costs the next run the build, nothing else."""
    import os
    import shutil

    part = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    try:
        shutil.rmtree(part, ignore_errors=True)
        shutil.copytree(folder, part)
        part.rename(cached)
    except OSError as err:
        shutil.rmtree(part, ignore_errors=True)
        if not (cached / "config.json").is_file():
            log.info("could not keep the built-in model in %s (%s): it will be built again next time", cached, err)


def load_rows(config: PPOConfig) -> tuple[list[dict], list[dict]]:
    """Training and validation prompt rows; with no files configured, the built-in arithmetic task."""
    from ..data import load_prompt_dataset
    from ..data.tasks.arithmetic import make_arithmetic_rows

    if config.train_files:
        train = list(load_prompt_dataset(config.train_files, empty_prompts=config.empty_prompts))
    else:
        train = make_arithmetic_rows()
        log.warning("no train_files given: using the built-in arithmetic task (all 100 prompts 'a+b=' with a, b in 0..9)")
    val = list(load_prompt_dataset(config.val_files, empty_prompts=config.empty_prompts)) if config.val_files else train
    if len(train) < config.rollout_batch_size:
        raise DataError(f"the training set has {len(train)} prompts, fewer than rollout_batch_size="
                        f"{config.rollout_batch_size}; lower rollout_batch_size or add prompts")
    return train, val


def response_length(config: PPOConfig) -> int:
    """max_response_length, or the built-in task's own limit when neither it nor train_files is set."""
    if config.train_files is None and "max_response_length" not in config.model_fields_set:
        log.warning("built-in arithmetic task: max_response_length=%d (set it to override)", BUILTIN_RESPONSE_LENGTH)
        return BUILTIN_RESPONSE_LENGTH
    return config.max_response_length


def check_batch_sizes(graph: Graph, config: PPOConfig) -> None:
    """batch_size must divide the responses of a step, micro_batch_size the mini-batch: ConfigError naming the sizes.

    (An uneven last mini-batch would be an optimizer step on fewer samples; padding it is not
    correct because padded rows would change Adam's moments. Uneven micro-batches are fine:
    losses are normalised by the mini-batch's global token count.)
    """
    n = samples_per_prompt(graph)
    total = config.rollout_batch_size * n
    if config.batch_size is not None:
        if config.batch_size > total:
            raise ConfigError(f"batch_size ({config.batch_size}) is larger than the {total} responses of a step "
                              f"(rollout_batch_size {config.rollout_batch_size} x {n} per prompt); lower it")
        if total % config.batch_size:
            raise ConfigError(f"batch_size ({config.batch_size}) does not divide the {total} responses of a step "
                              f"(rollout_batch_size {config.rollout_batch_size} x {n} per prompt for {graph.name}); "
                              f"use a divisor of {total}, e.g. {_divisor_near(total, config.batch_size)}")


def _divisor_near(total: int, wanted: int) -> int:
    return min((d for d in range(1, total + 1) if total % d == 0), key=lambda d: (abs(d - wanted), d))


def ignored_fields(config: PPOConfig, defaults: dict) -> list[str]:
    """Graph-attribute fields the user set that this algorithm's graph does not have."""
    return [f for f, attr in GRAPH_ATTRS.items() if f in config.model_fields_set and attr not in defaults]


def ignored_role_fields(config: PPOConfig, role_kinds: set[str]) -> dict[str, str]:
    """Role-source fields the user set (field -> role kind) for a kind of role the algorithm does not have."""
    return {f: kind for f, kind in ROLE_SOURCE_FIELDS.items() if f in config.model_fields_set and kind not in role_kinds}


def check_devices(device_map: dict[str, str]) -> None:
    """Every device named in ``device_map`` exists on this machine: ConfigError naming the role and device otherwise."""
    import torch

    for role, device in device_map.items():
        kind, _, index = device.partition(":")
        if kind == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count == 0:
                raise ConfigError(f"device_map.{role}={device}: this machine has no CUDA device (torch sees none"
                                  f"{'' if torch.backends.cuda.is_built() else '; this torch is built without CUDA'}); "
                                  f"use device_map.{role}=cpu, or run on a machine with a GPU")
            if index and int(index) >= count:
                raise ConfigError(f"device_map.{role}={device}: this machine has {count} CUDA device(s), "
                                  f"cuda:0..cuda:{count - 1}; pick one of those")
        elif kind == "mps" and not torch.backends.mps.is_available():
            raise ConfigError(f"device_map.{role}=mps: the MPS backend is not available here; use cpu")


def check_trainable(graph: Graph) -> None:
    """A graph trained by the Trainer must update some role, and give its group estimators groups of 2 or more
    responses: GraphValidationError (GroupSizeError) otherwise.

    (A graph without an update node is valid to draw, compile or simulate; training it would
    spend every step changing no weights.)
    """
    if not any(node.kind == "update" for node in graph.nodes):
        raise GraphValidationError(
            f"graph {graph.name!r} has no update node, so training it would change no weights",
            hint="add an update node for the policy (and critic) to the algorithm, or use `hybridflow viz` / "
                 "`compile` to inspect a graph without training it")
    check_group_sizes(graph)  # a group estimator on groups of one learns nothing
