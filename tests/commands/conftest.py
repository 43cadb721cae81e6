"""The command tests run tiny models on one torch thread (the fixtures ``tiny_model_dir`` and ``fast_config`` are
the suite's, in tests/conftest.py)."""
from __future__ import annotations

import torch

torch.set_num_threads(1)
