"""Training engines: how a trainable model's states are split over its data-parallel ranks.

The cost model knows two engines. Both split a model ``t``-way by tensor
parallelism and ``p``-way by pipeline stages (``mp = t·p`` devices hold one
copy); they differ in what the ``d`` data-parallel replicas share.

``fsdp`` — ZeRO stage 3 / PyTorch FSDP (Rajbhandari et al. 2020, "ZeRO", §5.3;
Zhao et al. 2023, "PyTorch FSDP"). What hybridflow's runtime executes.

- memory: every state is sharded over all ``N = d·mp`` ranks,
  ``(2 + 4 + 12)·P/N = 18·P/N`` bytes (bf16 weight, fp32 gradient, fp32 master
  weight and Adam moments), plus a working buffer of two gathered layers;
- communication per micro-batch: an all-gather of the bf16 weights for the
  forward, one for the backward, a reduce-scatter of the gradients (three
  collectives of the ``2·P/mp``-byte shard over the ``d`` ranks); the
  prefetcher overlaps them with compute, so a step costs ``max(compute, comm)``;
- hybrid-engine transition: a generation shard is a union of ``M/(t·p·d)``
  pieces, so each rank receives ``M/(tg·pg) − M/(t·p·d)`` (see :mod:`.reshard`).

``megatron`` — Megatron-core 3D parallelism with the distributed optimizer
(Shoeybi et al. 2019; Narayanan et al. 2021; the distributed optimizer is
ZeRO stage 1 over the data-parallel group; Megatron-LM's "Distributed
Optimizer" documentation), what HybridFlow trains with (§7, §8.1).

- memory: bf16 weights and the fp32 gradient buffer are replicated over ``d``,
  the fp32 master weights and Adam moments sharded over it:
  ``(2 + 4)·P/mp + 12·P/N`` bytes per rank — Megatron's table gives
  ``6 + 12/d`` bytes per parameter of a model-parallel rank for bf16 weights
  with fp32 gradients; no gathered-weight buffer;
- communication once per optimizer step over the ``d`` ranks: a
  reduce-scatter of the fp32 gradients (a ``4·P/mp``-byte buffer) and, after
  the optimizer has updated its shard, an all-gather of the bf16 weights
  (``2·P/mp`` bytes). Gradients are accumulated locally over the micro-batches,
  so the reduce-scatter can only start during the **last** micro-batch's
  backward (``overlap_grad_reduce`` buckets it behind the backward); what does
  not fit under that backward, and the whole all-gather (it needs the
  optimizer step, which needs every gradient), is exposed:
  ``max(0, T_rs − T_backward(last micro-batch)) + T_ag``;
- forward-only passes of a trainable model need no communication over ``d``;
- hybrid-engine transition: HybridFlow's own, ``M/(tg·pg) − M/(t·p)`` per
  rank within groups inside one replica's model-parallel group (§5, table 2),
  reachable when ``tg | t`` and ``pg | p``.

Frozen models (reference, reward) hold bf16 weights replicated over ``d`` in
both engines (``2·P/mp`` bytes), so the engine does not change their cost.
"""
from __future__ import annotations

from typing import Iterable, Literal

from ..errors import ConfigError

__all__ = ["TrainEngine", "TRAIN_ENGINES", "DEFAULT_ENGINE", "shards_weights_over_dp", "check_engines"]

TRAIN_ENGINES: tuple[str, ...] = ("fsdp", "megatron")
"""Every engine the cost model knows, in order of preference on ties (fsdp: what the runtime runs)."""
TrainEngine = Literal[TRAIN_ENGINES]
DEFAULT_ENGINE = "fsdp"

_SHARDS_OVER_DP = {"fsdp": True, "megatron": False}


def shards_weights_over_dp(engine: str) -> bool:
    """Whether ``engine`` shards the bf16 weights over the data-parallel ranks (ZeRO-3) or replicates them."""
    try:
        return _SHARDS_OVER_DP[engine]
    except KeyError:
        raise ConfigError(f"unknown training engine {engine!r}; known: {', '.join(TRAIN_ENGINES)}") from None


def check_engines(engines: Iterable[str], where: str) -> tuple[str, ...]:
    """``engines`` as a tuple without repeats, in their order; ConfigError naming ``where`` if one is unknown or none is given."""
    found = tuple(dict.fromkeys(engines))
    bad = [e for e in found if e not in TRAIN_ENGINES]
    if bad or not found:
        raise ConfigError(f"{where}: training engines {list(found)}; choose from {', '.join(TRAIN_ENGINES)}")
    return found
