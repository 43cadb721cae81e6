"""Data: prompt datasets and loaders, prompt tokenisation, tiny local models, model loaders, tasks.

Names are imported on first use (PEP 562), so ``python -m hybridflow.data.tasks.arithmetic``
does not pay for importing torch and transformers.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "datasets": ("REQUIRED_COLUMNS", "PromptDataset", "PromptLoader", "load_prompt_dataset",
                 "write_prompt_dataset", "train_val_split"),
    "pretrained": ("load_tokenizer", "load_causal_lm", "hub_offline"),
    "prompts": ("tokenize_prompts", "make_prompt_batch", "prompt_text"),
    "tiny": ("make_tiny_tokenizer", "make_tiny_model", "save_tiny", "create_tiny_model_dir",
             "BENCH_MODELS", "bench_model_shape"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'hybridflow.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
