"""Calibrate a cluster's cost-model factors to times measured on the machine at hand.

:func:`~hybridflow.runtime.calibration.profile_model` measures a model with the
trainer's engines; :func:`calibrated_cluster` fits the cluster's efficiency
factors and fixed overheads so that the cost rules (:mod:`.cost`) reproduce
those measurements; :func:`~hybridflow.runtime.calibration.calibrate` does both for every
model of a run, with the profiles cached on disk (the measuring runs the runtime's engines,
so it lives in the runtime; this module is the pure part).

The fit. Every measured time is a line in an "ideal time" ``x`` (the cost
rule's FLOPs over ``peak_flops``, i.e. the time at 100% of peak), so each kind
of work is fitted by least squares as ``t = a + x / mfu`` with ``a >= 0`` and
``mfu <= 1`` (:func:`fit_line`). With ``N`` = ``flop_params``, ``P`` / ``R``
the profile's prompt / response lengths, ``L = P + R`` and ``b`` the batch:

- forward (log-probs): ``x = 2·N·b·L / peak``; ``a`` -> ``forward_overhead_s``,
  ``mfu`` -> ``mfu_infer``.
- training (one optimizer step over one micro-batch):
  ``t - adam = f + k·N·b·L / (peak·mfu)`` with ``k`` = 8 with activation
  recomputation, else 6 (as :func:`.cost.update_cost`) and ``adam`` the rule's
  memory-bound AdamW time; ``mfu`` -> ``mfu_train``. The intercept ``f`` is the
  whole fixed cost of such an update, one micro-batch's ``u`` plus the optimizer
  step's ``a``. The split update (the largest batch in ``m`` micro-batches)
  apportions it: ``u = (t_split - t) / (m - 1)``, held within ``[0, f]``
  (:func:`split_fixed_cost`), -> ``train_micro_batch_overhead_s``, and
  ``a = f - u`` -> ``optimizer_step_overhead_s``. The bound matters: ``u`` is the
  difference of two single figures, so a burst of other work during the split
  update makes it larger than any fixed cost the updates showed (and a largest
  batch slower per row than its quarters makes it negative), and a run prices
  ``u`` once per micro-batch and backbone call (twice with shared prompts), every
  mini-batch of every model: unbounded, a split update 30 ms longer than the
  whole batch's (``u`` = 10 ms) priced 63 ms more into each of the quickstart's
  two updates than the bounded fit of the same timings (a step predicted at
  0.26 s, measured at 0.17 s).
- generation, from ``T1`` (one token) and ``TR`` (``R`` tokens): a decode step
  takes ``s = (TR - T1) / (R - 1)`` and the rest, ``TR - R·s``, is the prefill,
  so that prefill + ``R`` steps is ``TR`` exactly as :func:`.cost.generation_time`
  adds them. Prefill: ``x = 2·N·b·P / peak`` -> ``prefill_overhead_s``,
  ``mfu_prefill``; decode step: ``x = 2·N·b / peak`` ->
  ``decode_step_overhead_s``, ``mfu_decode`` (the memory roofline term is left
  out of the fit: on a CPU a tiny model's weights are read in microseconds).
- controller ops: ``op_overhead_s`` is the intercept of the GAE call's time
  over its tokens (its slope stays with the host-bandwidth rule).

Several profiles (several models) are fitted together: their points are pooled.
The cluster's datasheet figures (peak, bandwidths, memory) are kept.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Mapping, Sequence

from ..capabilities import SHARED_PROMPT_MIN_SAVED
from ..errors import ConfigError
from . import memory as mem
from .cluster import ClusterSpec
from .cost import CostOptions
from .profiling import Profile, host_description

log = logging.getLogger("hybridflow.compiler")

__all__ = ["Profile", "fit_line", "split_fixed_cost", "calibrated_cluster", "engine_cost_options", "cache_root",
           "cache_dir", "profile_key", "load_level", "FITTED_FIELDS"]

FITTED_FIELDS = ("mfu_infer", "mfu_train", "mfu_prefill", "mfu_decode", "forward_overhead_s",
                 "train_micro_batch_overhead_s", "optimizer_step_overhead_s", "prefill_overhead_s",
                 "decode_step_overhead_s", "op_overhead_s")
"""The ClusterSpec fields :func:`calibrated_cluster` sets."""

PROFILE_FORMAT = 4
"""Part of the cache key: bump it when what profile_model measures changes."""

def load_level(busy: float, cores: int | None = None) -> int:
    """The load a profile belongs to: the cores other processes keep busy, capped at the machine's ``cores`` and
    rounded to a whole core. Times taken beside a busy neighbour are not this machine's times when it is idle,
    and the other way round (a profile cached under load predicted an idle run's step 2.5x too slow), so each
    level has a profile of its own: a machine that is idle at times and busy at others measures each once."""
    cores = cores or os.cpu_count() or 1
    return int(math.floor(min(max(busy, 0.0), cores) + 0.5))


def fit_line(x: Sequence[float], t: Sequence[float], *, min_slope: float = 0.0) -> tuple[float, float]:
    """Least-squares ``t ≈ a + s·x`` with ``a >= 0`` and ``s >= min_slope``; returns ``(a, s)``.

    The unconstrained solution is taken when it satisfies both bounds;
    otherwise the violated bound is made active (``a = 0``: ``s = Σxt / Σx²``;
    ``s = min_slope``: ``a = mean(t − s·x)``) and the other re-solved, which is
    the constrained optimum of this two-variable convex problem.
    """
    n = len(x)
    if n == 0 or n != len(t):
        raise ConfigError(f"fit_line needs as many times as points and at least one, got {len(x)} and {len(t)}")
    mx, mt = sum(x) / n, sum(t) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    s = sum((xi - mx) * (ti - mt) for xi, ti in zip(x, t)) / sxx if sxx > 0 else min_slope
    a = mt - s * mx
    if s >= min_slope and a >= 0:
        return a, s
    candidates = []
    through_origin = sum(xi * ti for xi, ti in zip(x, t)) / max(sum(xi * xi for xi in x), 1e-300)
    if through_origin >= min_slope:
        candidates.append((0.0, through_origin))
    candidates.append((max(0.0, mt - min_slope * mx), min_slope))
    return min(candidates, key=lambda c: sum((c[0] + c[1] * xi - ti) ** 2 for xi, ti in zip(x, t)))


def engine_cost_options(train_micro_batch: int, infer_micro_batch: int) -> CostOptions:
    """Cost options that describe hybridflow's own engines: no activation recomputation, shared prefill,
    the training forwards' shared prompts.

    ``train_micro_batch`` / ``infer_micro_batch``: the run's micro-batch sizes
    (the whole mini-batch / the whole batch when the config leaves them unset).
    """
    return CostOptions(activation_checkpointing=False, shared_prefill=True, train_micro_batch=train_micro_batch,
                       infer_micro_batch=infer_micro_batch, shared_prompt_min_saved=SHARED_PROMPT_MIN_SAVED)


def _ideal(flops: float, cluster: ClusterSpec) -> float:
    return flops / cluster.peak_flops


def _mfu(slope: float) -> float:
    return 1.0 / max(slope, 1.0)


def split_fixed_cost(fixed_s: float, per_micro_s: float) -> tuple[float, float]:
    """``(u, a)``: the fixed cost ``fixed_s`` of a one-micro-batch update (the training line's intercept) split
    into the part paid per micro-batch, ``u``, and the part paid per optimizer step, ``a = fixed_s - u``.

    ``per_micro_s``: the split update's estimate of ``u``, ``(t_split - t) / (m - 1)``; it is held within
    ``[0, fixed_s]``, because a micro-batch cannot cost more fixed time than the whole update it is part of. Both
    ends are reached on CPU: 4 micro-batches of 128 sequences can take less than one of 512 (the larger one's
    activations leave the cache: ``u`` below 0), and a burst of other work during the split update puts tens of
    milliseconds on it (``u`` above the intercept).
    """
    per_micro = min(max(per_micro_s, 0.0), max(fixed_s, 0.0))
    return per_micro, max(fixed_s, 0.0) - per_micro


def calibrated_cluster(cluster: ClusterSpec, profile: Profile | Sequence[Profile],
                       options: CostOptions | None = None) -> ClusterSpec:
    """``cluster`` with :data:`FITTED_FIELDS` fitted to ``profile`` (module docstring for the formulas).

    ``options``: the cost options the plans will be compiled with; only
    ``activation_checkpointing`` matters to the fit (default: off, as in
    hybridflow's train engine).
    """
    profiles = [profile] if isinstance(profile, Profile) else list(profile)
    if not profiles:
        raise ConfigError("calibrated_cluster needs at least one profile")
    checkpointing = (options or engine_cost_options(1, 1)).activation_checkpointing
    points: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in ("forward", "train", "prefill", "decode", "op")}

    def add(kind: str, x: float, t: float) -> None:
        points[kind][0].append(x)
        points[kind][1].append(t)

    micro = []
    for p in profiles:
        n, steps = p.model.flop_params, p.response_len
        adam = mem.OPTIMIZER_STEP_BYTES_PER_PARAM * p.model.params / (cluster.memory_bandwidth * cluster.memory_bandwidth_efficiency)
        micro.append((p.train_split_s - p.train_s[-1]) / (p.split_micro_batches - 1))
        for i, b in enumerate(p.batch_sizes):
            add("forward", _ideal(2 * n * b * p.seq_len, cluster), p.forward_s[i])
            add("train", _ideal((8 if checkpointing else 6) * n * b * p.seq_len, cluster), p.train_s[i] - adam)
            step = (p.generate_s[i] - p.prefill_s[i]) / (steps - 1)
            add("prefill", _ideal(2 * n * b * p.prompt_len, cluster), p.generate_s[i] - steps * step)
            add("decode", _ideal(2 * n * b, cluster), step)
            add("op", b * steps, p.controller_s[i])
    forward = fit_line(*points["forward"], min_slope=1.0)
    train = fit_line(*points["train"], min_slope=1.0)
    prefill = fit_line(*points["prefill"], min_slope=1.0)
    decode = fit_line(*points["decode"], min_slope=1.0)
    op = fit_line(*points["op"])
    per_micro, per_step = split_fixed_cost(train[0], sum(micro) / len(micro))
    fitted = {
        "mfu_infer": _mfu(forward[1]), "forward_overhead_s": forward[0],
        "mfu_train": _mfu(train[1]), "optimizer_step_overhead_s": per_step,
        "train_micro_batch_overhead_s": per_micro,
        "mfu_prefill": _mfu(prefill[1]), "prefill_overhead_s": prefill[0],
        "mfu_decode": _mfu(decode[1]), "decode_step_overhead_s": decode[0],
        "op_overhead_s": op[0],
    }
    name = cluster.name if cluster.name.endswith("+calibrated") else f"{cluster.name}+calibrated"
    return ClusterSpec(**{**cluster.model_dump(), **fitted, "name": name})


# ---------------------------------------------------------------- the cache
def cache_root() -> Path:
    """``$HYBRIDFLOW_CACHE``, default ``~/.cache/hybridflow``: hybridflow's cache (calibration profiles, built-in models)."""
    root = os.environ.get("HYBRIDFLOW_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "hybridflow"


def cache_dir() -> Path:
    """``$HYBRIDFLOW_CACHE/calibration``, default ``~/.cache/hybridflow/calibration``."""
    return cache_root() / "calibration"


_NOT_SHAPE = ("_name_or_path", "transformers_version")


def profile_key(config: Mapping, device: str, threads: int, **settings) -> str:
    """Hex digest of what a profile depends on: the model config (names left out), device, threads,
    torch version, host and CPU model, the profile's settings (batch sizes, lengths) and the format."""
    import torch

    shape = {k: v for k, v in config.items() if k not in _NOT_SHAPE}
    described = {"config": shape, "device": str(device), "threads": int(threads), "torch": torch.__version__,
                 "host": host_description(), "settings": settings, "format": PROFILE_FORMAT}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:24]
