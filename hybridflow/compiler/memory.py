"""Per-device memory of model states, activations and KV cache (bytes).

Model states (Rajbhandari et al. 2020, "ZeRO", §3.1): mixed-precision Adam keeps
per parameter a bf16 weight (2 B), an fp32 gradient (4 B), and fp32 master
weight, momentum and variance (12 B): **18 bytes/param** for a trainable model,
sharded over all ``dp·tp·pp`` ranks of its pool (ZeRO-3 / FSDP over dp, Megatron
tensor and pipeline splits over tp·pp). A frozen model keeps **2 bytes/param**
(bf16), split over ``tp·pp`` and replicated over dp.

That is the ``fsdp`` engine. The ``megatron`` engine (Megatron-core with the
distributed optimizer; :mod:`hybridflow.compiler.engine`) replicates the bf16
weight and the fp32 gradient buffer over dp and shards only the 12 optimizer
bytes: **6·P/(tp·pp) + 12·P/(dp·tp·pp)** bytes per device (Megatron-LM's
"Distributed Optimizer" table: 6 + 12/d bytes per parameter of a
model-parallel rank for bf16 weights and fp32 gradients), and needs no
gathered-weight buffer.

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", §4.1, eq. 2): one transformer layer with tp-way
tensor parallelism stores ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` bytes for a
micro-batch of ``b`` sequences of ``s`` tokens. With FlashAttention (Dao et al.
2022) the ``s x s`` score matrix is never stored, so the last term is dropped:
``s·b·h·(10 + 24/t)``. With full activation recomputation (§4.1 "full
recomputation") only each layer's bf16 input, ``2·s·b·h`` bytes, is kept and
one layer's activations are rebuilt at a time during the backward pass. Under
the 1F1B pipeline schedule (Narayanan et al. 2021) the first stage holds
``min(m, p)`` micro-batches in flight.

LoRA (Hu et al. 2021): a model with ``A`` adapter parameters keeps its ``P`` base
weights frozen (2 B/param, sharded like the trainable states under fsdp, split over
``tp·pp`` under megatron) and the full 18 B/param of trainable state for the adapters
only: **2·P/shards + 18·A/(dp·tp·pp)**.

KV cache (vLLM; Kwon et al. 2023): ``2 · layers · kv_heads · head_dim · 2`` bytes
per token in bf16, split over ``min(tg, kv_heads)`` tensor ranks (kv heads are
replicated when tg exceeds them) and ``pg`` pipeline stages.
"""
from __future__ import annotations

from .engine import DEFAULT_ENGINE, shards_weights_over_dp
from .layout import Layout
from .models import ModelSpec

__all__ = [
    "TRAINABLE_BYTES_PER_PARAM", "FROZEN_BYTES_PER_PARAM", "OPTIMIZER_STEP_BYTES_PER_PARAM",
    "MEGATRON_REPLICATED_BYTES_PER_PARAM", "OPTIMIZER_BYTES_PER_PARAM", "resident_bytes", "gathered_param_bytes", "layer_activation_bytes", "logits_bytes",
    "train_activation_bytes", "forward_activation_bytes", "kv_bytes_per_sequence", "generation_weight_bytes",
]

TRAINABLE_BYTES_PER_PARAM = 18
"""bf16 weight 2 + fp32 gradient 4 + fp32 master weight, Adam m and v 12 (ZeRO §3.1)."""
FROZEN_BYTES_PER_PARAM = 2
"""bf16 weight."""
OPTIMIZER_STEP_BYTES_PER_PARAM = 30
"""Adam step traffic: reads fp32 gradient, master, m, v (16 B), writes master, m, v (12 B) and the bf16 weight (2 B)."""
PARAM_BYTES = 2
"""bf16."""
OPTIMIZER_BYTES_PER_PARAM = 12
"""fp32 master weight, Adam m and v: the part the megatron engine's distributed optimizer shards over dp."""
MEGATRON_REPLICATED_BYTES_PER_PARAM = TRAINABLE_BYTES_PER_PARAM - OPTIMIZER_BYTES_PER_PARAM
"""bf16 weight 2 + fp32 gradient buffer 4: replicated over dp by the megatron engine."""


def resident_bytes(model: ModelSpec, layout: Layout, trainable: bool, engine: str = DEFAULT_ENGINE) -> float:
    """Model-state bytes each device keeps between uses.

    Trainable: 18·P/(dp·tp·pp) (fsdp) or 6·P/(tp·pp) + 12·P/(dp·tp·pp)
    (megatron); frozen: 2·P/(tp·pp) in both; with A LoRA adapter parameters
    (``model.adapter_params``) trained: 2·P/(dp·tp·pp) (fsdp) or 2·P/(tp·pp)
    (megatron) + 18·A/(dp·tp·pp).
    """
    if trainable and model.adapter_params:
        base_shards = layout.size if shards_weights_over_dp(engine) else layout.model_parallel
        return FROZEN_BYTES_PER_PARAM * model.params / base_shards + TRAINABLE_BYTES_PER_PARAM * model.adapter_params / layout.size
    if not trainable:
        return FROZEN_BYTES_PER_PARAM * model.params / layout.model_parallel
    if shards_weights_over_dp(engine):
        return TRAINABLE_BYTES_PER_PARAM * model.params / layout.size
    return (MEGATRON_REPLICATED_BYTES_PER_PARAM * model.params / layout.model_parallel
            + OPTIMIZER_BYTES_PER_PARAM * model.params / layout.size)


def gathered_param_bytes(model: ModelSpec, layout: Layout, trainable: bool, engine: str = DEFAULT_ENGINE) -> float:
    """ZeRO-3 working buffer: two layers' bf16 weights unsharded over dp (the current one and the prefetched next).

    0 when nothing is sharded over dp (frozen models, dp = 1, or the megatron engine).
    """
    if not trainable or layout.dp == 1 or not shards_weights_over_dp(engine):
        return 0.0
    return 2 * PARAM_BYTES * model.layer_params / layout.tp


def layer_activation_bytes(model: ModelSpec, tokens: float, tp: int) -> float:
    """Activations of one layer for ``tokens = s·b`` tokens: tokens·h·(10 + 24/t) (Korthikanti eq. 2, FlashAttention)."""
    return tokens * model.hidden * (10 + 24 / tp)


def logits_bytes(model: ModelSpec, tokens: float, tp: int) -> float:
    """fp32 logits and their log-softmax for ``tokens`` tokens, vocab split over tp: 8·tokens·V/t."""
    return 8 * tokens * model.vocab / tp


def train_activation_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                           micro_batches: int, checkpointing: bool) -> float:
    """Peak activation bytes of one device while training (first pipeline stage, worst case).

    With recomputation: (L/p)·min(m, p)·2·s·b·h stored inputs + one layer's
    activations + logits; without: (L/p)·min(m, p) layers' full activations + logits.
    """
    tokens = seq_len * micro_batch
    in_flight = min(micro_batches, layout.pp)
    layers_per_stage = model.layers / layout.pp
    full_layer = layer_activation_bytes(model, tokens, layout.tp)
    if checkpointing:
        stored = layers_per_stage * in_flight * 2 * tokens * model.hidden + full_layer
    else:
        stored = layers_per_stage * in_flight * full_layer
    return stored + logits_bytes(model, tokens, layout.tp)


def forward_activation_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int) -> float:
    """Peak activation bytes of a forward-only pass: one layer's activations + logits (nothing is kept for backward)."""
    tokens = seq_len * micro_batch
    return layer_activation_bytes(model, tokens, layout.tp) + logits_bytes(model, tokens, layout.tp)


def kv_bytes_per_sequence(model: ModelSpec, gen: Layout, seq_len: int) -> float:
    """KV cache of one sequence of ``seq_len`` tokens on one device: seq_len·kv_bytes_per_token / (min(tg, kv_heads)·pg)."""
    return seq_len * model.kv_bytes_per_token() / (min(gen.tp, model.kv_heads) * gen.pp)


def generation_weight_bytes(model: ModelSpec, gen: Layout) -> float:
    """bf16 weights of one generation shard: 2·N/(tg·pg) — the hybrid engine's peak M/(tg·pg) (HybridFlow table 2)."""
    return PARAM_BYTES * model.params / gen.model_parallel
