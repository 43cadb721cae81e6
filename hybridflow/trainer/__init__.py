"""The front door: typed configs and the trainers of the seed article.

``from hybridflow.trainer import PPOTrainer; PPOTrainer(config=PPOConfig(...)).train()``

Names are imported on first use (PEP 562), so the CLI modules in this package load
without torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "config": ("PPOConfig",),
    "trainer": ("Trainer", "PPOTrainer", "GRPOTrainer", "RLOOTrainer", "ReinforcePPTrainer", "ReMaxTrainer",
                "SafeRLHFTrainer"),
    "rollout_manager": ("RolloutManager",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["PPOConfig", "Trainer", "PPOTrainer", "GRPOTrainer", "RLOOTrainer", "ReinforcePPTrainer", "ReMaxTrainer",
           "SafeRLHFTrainer", "RolloutManager"]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'hybridflow.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
