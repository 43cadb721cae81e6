"""hybridflow: RL post-training of language models as a dataflow-graph compiler and executor."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("hybridflow")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

from .errors import HybridflowError

__all__ = ["__version__", "HybridflowError"]
