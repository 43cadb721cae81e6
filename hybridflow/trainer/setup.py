"""Where a run's model and prompts come from, when the config names them or not."""
from __future__ import annotations

import logging
from pathlib import Path

from .config import PPOConfig

__all__ = ["actor_source", "load_rows"]

log = logging.getLogger("hybridflow.trainer")


def actor_source(config: PPOConfig, output_dir: Path) -> str:
    """The actor's path or hub name; with none configured, a tiny model for the built-in task, made in code."""
    if config.actor_model_name:
        return config.actor_model_name
    from ..data import create_tiny_model_dir

    path = output_dir / "tiny_model"
    if not (path / "config.json").exists():
        create_tiny_model_dir(path, task="arithmetic", seed=config.seed)
    log.warning("no actor_model_name given: using a tiny random-weight model for the built-in arithmetic task at %s", path)
    return str(path)


def load_rows(config: PPOConfig) -> tuple[list[dict], list[dict]]:
    """Training and validation prompt rows; with no files configured, the built-in arithmetic task."""
    from ..data import load_prompt_dataset
    from ..data.tasks.arithmetic import make_arithmetic_rows

    if config.train_files:
        train = list(load_prompt_dataset(config.train_files))
    else:
        train = make_arithmetic_rows()
        log.warning("no train_files given: using the built-in arithmetic task (all 100 prompts 'a+b=' with a, b in 0..9)")
    val = list(load_prompt_dataset(config.val_files)) if config.val_files else train
    return train, val
