"""One seed per random stream of a run, derived from the run's ``seed``.

A run's seed initialises the built-in tiny model (``torch.manual_seed(seed)`` before its
weights are drawn). If the rollout sampler were seeded with the same number, its
``torch.Generator`` would replay exactly the stream the weights were drawn from, so the
first sampled tokens would be decided by the same uniforms that set the initial logits.
Whether that correlation hurts learning is not settled (in the TRL comparison of
``tools/bench_vs_trl.py`` shifting the stream rescued 4 of 5 collapsed seeds, but on 8
fresh models, paired, it made no difference); independent streams take the question away.
Each stream gets its own seed, a hash of the run's seed and the stream's name:
reproducible, and unrelated to any other stream.
"""
from __future__ import annotations

import hashlib

__all__ = ["stream_seed"]


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for the random stream ``stream`` (e.g. ``"rollout"``) of a run seeded with ``seed``."""
    digest = hashlib.sha256(f"hybridflow/{stream}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
