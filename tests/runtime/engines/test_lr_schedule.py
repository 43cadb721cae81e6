"""The learning-rate factor: linear warm-up, then constant / linear / cosine decay."""
from __future__ import annotations

import pytest

from hybridflow.runtime.engines import TrainEngineConfig, lr_factor


def factors(n, **kw):
    return [lr_factor(k, **kw) for k in range(n)]


def test_warmup_then_constant():
    # W = 4: (k + 1) / 4 for k < 4, then 1
    assert factors(6, warmup_steps=4, schedule="constant", total_steps=None, min_lr_ratio=0.0) == [0.25, 0.5, 0.75, 1, 1, 1]


def test_linear_decay_to_the_floor():
    # W = 2, N = 6, m = 0.2: progress (k - 2) / 4 -> f = 0.2 + 0.8 (1 - p)
    got = factors(8, warmup_steps=2, schedule="linear", total_steps=6, min_lr_ratio=0.2)
    assert got == pytest.approx([0.5, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2])


def test_cosine_decay():
    # W = 0, N = 4: p = k / 4 -> f = (1 + cos(pi p)) / 2: 1, 0.8536, 0.5, 0.1464, 0
    got = factors(5, warmup_steps=0, schedule="cosine", total_steps=4, min_lr_ratio=0.0)
    assert got == pytest.approx([1.0, 0.853553, 0.5, 0.146447, 0.0], abs=1e-6)


def test_decay_needs_total_steps():
    with pytest.raises(ValueError, match="total_steps"):
        TrainEngineConfig(lr_schedule="cosine")
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainEngineConfig(mini_batch_size=2, micro_batch_size=4)
