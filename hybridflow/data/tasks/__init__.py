"""Synthetic tasks whose prompt files a tiny model can learn from on a CPU.

Each task module offers a python API that returns prompt rows (``prompt``,
``ground_truth``, ``data_source``, ``extra_info``), a ``write_*`` function that
writes them as jsonl or parquet, an ``ALPHABET`` of every character its prompts
and answers use (the tiny tokenizer's vocabulary), and a command line entry:
``python -m hybridflow.data.tasks.arithmetic --out FILE``.

Modules are imported on demand, so that ``python -m`` runs them only once.
"""
from __future__ import annotations

import importlib

from ...errors import ConfigError

#: the task modules of this package
TASKS: tuple[str, ...] = ("arithmetic", "countdown", "agent_calc")

__all__ = ["TASKS", "task_alphabet"]


def task_alphabet(task: str) -> str:
    """The characters the prompts and answers of ``task`` are made of."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; known tasks: {list(TASKS)}. "
                          "Pass alphabet='...' to build a tokenizer over your own characters.")
    return importlib.import_module(f".{task}", __name__).ALPHABET
