"""hybridflow: RL post-training of language models as a dataflow-graph compiler and executor."""
from __future__ import annotations

import importlib.metadata as _metadata

try:
    __version__ = _metadata.version("hybridflow")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

from .errors import HybridflowError

__all__ = ["__version__", "HybridflowError", "algorithm", "compute", "loss", "resample", "StateRule", "register_op", "PPOConfig", "Trainer", "RolloutManager"]

# The DSL, resolved on first use so that `import hybridflow` (and `hybridflow --help`) stays light.
_LAZY = {
    "algorithm": ("hybridflow.graph", "algorithm"),
    "compute": ("hybridflow.graph", "compute"),
    "loss": ("hybridflow.graph", "loss"),
    "resample": ("hybridflow.graph", "resample"),
    "StateRule": ("hybridflow.graph", "StateRule"),
    "register_op": ("hybridflow.graph.op_registration", "register_op"),
    "compile": ("hybridflow.compiler.compile", "compile"),
    "PPOConfig": ("hybridflow.trainer", "PPOConfig"),
    "Trainer": ("hybridflow.trainer", "Trainer"),
    "RolloutManager": ("hybridflow.trainer", "RolloutManager"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hybridflow' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({n for n in globals() if not n.startswith("_") and n != "annotations"} | set(__all__))
