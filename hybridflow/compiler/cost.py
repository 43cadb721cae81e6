"""The analytical cost model: one rule per node kind, in a table keyed by kind.

Each work record (:class:`Generate`, :class:`Infer`, :class:`Score`,
:class:`Compute`, :class:`Update`, and the transitions :class:`WeightSync`,
:class:`Offload`, :class:`Onload`) names its ``kind``; :data:`COST_RULES` maps
the kind to a pure function ``(work, cluster, options) -> CostRecord`` giving
the time in seconds and the peak memory of one device. :func:`estimate` looks
the rule up. A new node kind is a new record plus one table entry.

Formulas (N = ``flop_params``, FLOP-bearing parameters; ``peak`` = device
bf16 FLOP/s; every rate is scaled by the cluster's efficiency factors):

- generation (prefill + decode; Pope et al. 2022 "Efficiently Scaling
  Transformer Inference", §2): prefill is compute-bound,
  ``2·N·b·P / (tg·peak·mfu_prefill)``; each of the ``R`` decode steps reads the
  weights and the batch's KV cache, ``(2·N/tg + KV(b)/min(tg, kv)) / (bw·eff)``,
  or computes ``2·N·b/(tg·peak·mfu_infer)``, whichever is longer (roofline).
  The batch ``b = ceil(S/dg)`` runs in waves when its KV cache does not fit.
  Pipeline stages (pg) run one after another for a batch: pg buys memory, not speed.
- forward passes (log-probs, values, scores): ``2·N`` FLOPs per token (Kaplan
  et al. 2020, §2.1); training: ``6·N`` per token, ``8·N`` with full activation
  recomputation (one extra forward; Korthikanti et al. 2022, §4), plus the
  Adam step, memory-bound over ``30`` bytes/param of its shard.
- tensor parallelism (Shoeybi et al. 2019, §3): 2 all-reduces of ``tokens·h·2``
  bytes per layer per forward, 2 per backward (and 2 per recomputed forward).
- data parallelism depends on the training engine (a work record's
  ``engine``; :mod:`hybridflow.compiler.engine` derives both rules):
  ``fsdp`` (ZeRO-3 / FSDP; Rajbhandari et al. 2020; Zhao et al. 2023): per
  micro-batch an all-gather of the bf16 shard for the forward, another for the
  backward, and a reduce-scatter of the gradients; prefetching overlaps them
  with compute, so a step costs ``max(compute, dp comm)``, and a trainable
  model's forward-only pass gathers once per micro-batch.
  ``megatron`` (distributed optimizer): per optimizer step a reduce-scatter of
  the fp32 gradients (``4·P/mp``-byte buffer) and an all-gather of the bf16
  weights (``2·P/mp``), over the dp ranks; only the reduce-scatter overlaps,
  with the last micro-batch's backward (``6/8`` of its FLOPs with
  recomputation, ``4/6`` without), so a step adds
  ``max(0, T_rs − T_backward_last) + T_ag``; forward-only passes communicate
  nothing over dp.
- pipeline parallelism: bubble ``(p−1)/m`` of the compute for ``m``
  micro-batches (Narayanan et al. 2021, §2.2), plus sending activations between
  stages.
- fixed per-call times (the cluster's ``*_overhead_s`` fields, 0 in every
  preset): ``prefill_overhead_s`` per generation wave, ``decode_step_overhead_s``
  per decode step, ``forward_overhead_s`` per forward micro-batch,
  ``train_micro_batch_overhead_s`` per training micro-batch and
  ``optimizer_step_overhead_s`` per optimizer step. A decode step's compute
  runs at ``ClusterSpec.decode_mfu`` (``mfu_decode``, else ``mfu_infer``).
- generation time is multiplied by the rollout engine's factor
  (``CostOptions.rollout_engine``, :mod:`.rollout_engines`; 1 for ``hf``).
- with ``CostOptions.shared_prefill`` each prompt is prefilled once for its
  ``n`` samples (the HF rollout engine copies the KV cache), so the prefill
  covers ``ceil(b/n)`` prompts instead of ``b`` sequences.
- with ``CostOptions.shared_prompt_min_saved`` the train engine's forward (log-probs,
  values, update) runs each distinct prompt of a micro-batch once for its rows
  (groups of ``samples`` consecutive rows), where that saves at least that many
  prompt positions: a micro-batch of ``m`` rows then costs
  ``ceil(m/samples)·prompt_len + m·(seq_len − prompt_len)`` tokens and two
  backbone calls (twice the per-micro-batch overhead) instead of ``m·seq_len``.
- with ``CostOptions.real_seq_len`` (sequence packing or token-budget micro-batches)
  the train engine's forwards and updates cost that many tokens per sequence instead
  of the padded ``seq_len`` (whichever is smaller); scores stay padded.
- memory: :mod:`hybridflow.compiler.memory`; collectives: :mod:`hybridflow.compiler.comm`;
  data-parallel communication per training engine: :mod:`hybridflow.compiler.dp_comm`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..capabilities import DEFAULT_ROLLOUT_ENGINE, shared_prompt_threshold
from ..errors import PlanError
from . import memory as mem
from .cluster import ClusterSpec
from .comm import all_reduce_time
from .dp_comm import DP_RULES, zero3_time
from .layout import Layout
from .models import ModelSpec
from .engine import DEFAULT_ENGINE, shards_weights_over_dp
from .reshard import transition_figures
from .rollout_engines import rollout_engine_cost

__all__ = [
    "CostOptions", "CostRecord", "Generate", "Infer", "Score", "Compute", "Update",
    "WeightSync", "Offload", "Onload", "COST_RULES", "estimate", "generation_plan", "generation_time", "waves_for",
]

INF = math.inf


class CostOptions(BaseModel):
    """Engine settings the cost model needs besides the cluster's figures."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    activation_checkpointing: bool = Field(default=True, description="Training recomputes activations (8·N FLOPs/token, 2·s·b·h bytes kept per layer).")
    train_micro_batch: int = Field(default=4, ge=1, description="Sequences per training micro-batch.")
    infer_micro_batch: int = Field(default=16, ge=1, description="Sequences per forward-only micro-batch (log-probs, values, scores).")
    data_parallel_only: bool = Field(default=False, description="The engines that will run the plan shard models by data parallelism only (FSDP2, as hybridflow's runtime does today): layouts with tensor or pipeline parallelism are not candidates. Off for studies of the paper's systems.")
    controller_bytes_per_token: float = Field(default=64.0, ge=0, description="Bytes the controller reads and writes per token in a compute node (a few fp32 fields, read and written).")
    shared_prefill: bool = Field(default=False, description="The rollout engine prefills each prompt once and copies its KV cache to the prompt's n samples (hybridflow's HF engine does); False: every sequence is prefilled.")
    shared_prompt_min_saved: int | None = Field(default=None, ge=1, description="The train engine's forwards (log-probs, values, update) run each distinct prompt of a micro-batch once for its rows where that saves at least this many prompt positions in a model of width 256, this x 256 / hidden in others (hybridflow's engines do: runtime.engines.shared_prompt.MIN_SAVED_POSITIONS, min_saved_positions); None: every row's prompt is run.")
    reuse_rollout_log_probs: bool = Field(default=False, description="A policy's logprob node is served from its rollout's log-probs where the rollout engine shares the train engine's module and precision (compiler pass 'reuse'); on only when both compute in fp32, which the compiler cannot see (the trainer turns it on for CPU runs).")
    rollout_engine: str = Field(default=DEFAULT_ROLLOUT_ENGINE, description="The rollout engine of the generating role (hf, vllm): generation time is scaled by its factor (hybridflow.compiler.rollout_engines) and the plan records it.")
    real_seq_len: float | None = Field(default=None, gt=0, description="Mean real tokens per sequence (prompt + response, no padding) in the train engine's forwards (log-probs, values, update) when it packs sequences or forms micro-batches by a token budget: their compute, communication and activations are priced at this length, never above the padded prompt_len + response_len. Reward-model scores keep the padded width. None: the padded width.")
    tool_call_s: float = Field(default=0.0, ge=0, description="Multi-turn rollouts (generate nodes with env=): expected seconds of one environment step (a tool call). Samples step concurrently on the role's environment pool (env_workers workers x ENV_WORKER_THREADS calls at once), so a turn after the first waits for one step per round of that many samples.")
    env_workers: int = Field(default=2, ge=1, description="Multi-turn rollouts: environment worker processes in each generating role's environment pool (the plan's ``env`` pool); each holds whole samples' environments and steps them concurrently on threads.")
    generation_time_cv: float = Field(default=0.0, ge=0, description="Staleness k >= 1: coefficient of variation (std / mean) of one step's generation time, which varies with the sampled response lengths; the predicted step comes from a simulation of the bounded buffer (hybridflow.compiler.async_cost), where a larger k absorbs more of the variation. 0: every step's generation takes its predicted time.")
    async_weight_sync: Literal["collective", "staged"] = Field(default="collective", description="Staleness k >= 1: how a new policy version reaches a rollout pool of its own; a run sets it from its config field of the same name. 'collective' (the runtime's default): one collective of both pools after each update, so training waits for the generation in progress and the pools move in lock step; 'staged' (the runtime's async_weight_sync=staged on Ray, hybridflow.runtime.staged_sync): the update leaves its weights in a staging buffer and the rollout pool loads them before its next generation (the bounded-buffer pipeline). See hybridflow.compiler.async_cost.")
    overlap_grad_reduce: bool = Field(default=True, description="megatron engine: the gradient reduce-scatter overlaps the last micro-batch's backward (Megatron-core's DistributedDataParallelConfig.overlap_grad_reduce, whose own default is False); False: it is wholly exposed. The fsdp engine ignores it.")


@dataclass(frozen=True)
class CostRecord:
    """Predicted time (s) and per-device peak memory (bytes) of one node, with its parts."""

    kind: str
    time_s: float
    peak_memory_bytes: float
    parts: tuple[tuple[str, float], ...] = ()
    problem: str | None = None
    """Why the work cannot run (then ``time_s`` is inf)."""

    @property
    def feasible(self) -> bool:
        return self.problem is None


def _infeasible(kind: str, problem: str, peak: float = INF) -> CostRecord:
    return CostRecord(kind=kind, time_s=INF, peak_memory_bytes=peak, problem=problem)


# ---------------------------------------------------------------- work records
@dataclass(frozen=True)
class Generate:
    """Generate ``response_len`` tokens for each of ``sequences`` prompts of ``prompt_len`` tokens on ``layout`` (dg, tg, pg).

    ``samples``: sequences per distinct prompt (the node's ``n``; with
    ``CostOptions.shared_prefill`` a prompt is prefilled once for all of them).
    ``memory_used_bytes``: what else each device holds meanwhile (model states);
    the KV cache gets what is left of the usable memory.
    """

    kind: ClassVar[str] = "generate"
    model: ModelSpec
    layout: Layout
    sequences: int
    prompt_len: int
    response_len: int
    memory_used_bytes: float = 0.0
    samples: int = 1
    turns: int = 1
    """Model turns of a multi-turn rollout: ``response_len`` tokens in ``turns`` turns, each turn prefilling the
    whole context so far (prompt and earlier turns) again; 1 for a one-turn rollout."""
    tool_s: float = 0.0
    """Host seconds the rollout waits for its environment steps (tool calls), on the critical path."""


@dataclass(frozen=True)
class Infer:
    """``passes`` forward passes over ``sequences`` sequences of ``seq_len`` tokens (log-probs or values).

    ``engine``: the training engine holding a trainable model's states (``fsdp`` or ``megatron``).
    ``prompt_len`` / ``samples``: the first ``prompt_len`` of the ``seq_len`` tokens are a
    prompt that comes ``samples`` times in a row (see ``CostOptions.shared_prompt_min_saved``).
    """

    kind: ClassVar[str] = "infer"
    model: ModelSpec
    layout: Layout
    trainable: bool
    sequences: int
    seq_len: int
    passes: int = 1
    engine: str = DEFAULT_ENGINE
    prompt_len: int = 0
    samples: int = 1


@dataclass(frozen=True)
class Score(Infer):
    """A reward model's forward pass; costed like :class:`Infer`."""

    kind: ClassVar[str] = "score"


@dataclass(frozen=True)
class Compute:
    """Controller-side tensor math (advantages, KL, ...) over ``tokens`` tokens."""

    kind: ClassVar[str] = "compute"
    tokens: int


@dataclass(frozen=True)
class Update:
    """``epochs`` passes of ``mini_batches`` optimizer steps each over ``sequences`` sequences of ``seq_len`` tokens, by ``engine``.

    ``prompt_len`` / ``samples``: as in :class:`Infer`.
    """

    kind: ClassVar[str] = "update"
    model: ModelSpec
    layout: Layout
    sequences: int
    seq_len: int
    epochs: int = 1
    mini_batches: int = 1
    engine: str = DEFAULT_ENGINE
    prompt_len: int = 0
    samples: int = 1


@dataclass(frozen=True)
class WeightSync:
    """The hybrid-engine transition of the actor from ``train`` to ``gen`` layout on one pool, trained by ``engine``."""

    kind: ClassVar[str] = "weight_sync"
    model: ModelSpec
    train: Layout
    gen: Layout
    engine: str = DEFAULT_ENGINE


@dataclass(frozen=True)
class Offload:
    """Move ``nbytes`` per device from device to host memory."""

    kind: ClassVar[str] = "offload"
    nbytes: float


@dataclass(frozen=True)
class Onload(Offload):
    """Move ``nbytes`` per device from host back to device memory."""

    kind: ClassVar[str] = "onload"


# ---------------------------------------------------------------- rules
def generation_plan(model: ModelSpec, layout: Layout, sequences: int, seq_len: int, memory_used: float,
                    cluster: ClusterSpec) -> tuple[int, int] | None:
    """(waves, sequences per wave) of one generation replica, or None when not one sequence's KV cache fits.

    Each of the ``dg`` replicas gets ``ceil(S/dg)`` sequences; the KV cache may
    use what the states (``memory_used``) and the generation weights leave.
    """
    weights = mem.generation_weight_bytes(model, layout)
    per_seq = mem.kv_bytes_per_sequence(model, layout, seq_len)
    return waves_for(cluster.usable_memory_bytes - memory_used - weights, per_seq, math.ceil(sequences / layout.dp))


def waves_for(kv_budget: float, per_seq: float, seqs: int) -> tuple[int, int] | None:
    """(waves, batch) for ``seqs`` sequences of ``per_seq`` KV bytes in ``kv_budget`` bytes; None if one does not fit."""
    if kv_budget < per_seq:
        return None
    waves = math.ceil(seqs / int(kv_budget // per_seq))
    return waves, math.ceil(seqs / waves)


@lru_cache(maxsize=100_000)
def generation_time(model: ModelSpec, layout: Layout, batch: int, prompt_len: int, response_len: int,
                    cluster: ClusterSpec, prefill_batch: int | None = None) -> tuple[float, float]:
    """(prefill, decode) seconds of one wave of ``batch`` sequences on one replica (module docstring).

    ``prefill_batch``: prompts the prefill runs over (default ``batch``; fewer when
    the samples of a prompt share its prefill).
    """
    n = model.flop_params
    tokens_prefill = (batch if prefill_batch is None else prefill_batch) * prompt_len
    prefill = cluster.prefill_overhead_s + 2 * n * tokens_prefill / (layout.tp * cluster.peak_flops * cluster.mfu_prefill)
    prefill += 2 * model.layers * all_reduce_time(tokens_prefill * model.hidden * 2, layout.tp, layout.tp, cluster)
    context = prompt_len + (response_len - 1) / 2  # mean context length over the decode steps
    read = 2 * n / layout.tp + batch * context * model.kv_bytes_per_token() / min(layout.tp, model.kv_heads)
    step_memory = read / (cluster.memory_bandwidth * cluster.memory_bandwidth_efficiency)
    step_compute = 2 * n * batch / (layout.tp * cluster.peak_flops * cluster.decode_mfu)
    step_comm = 2 * model.layers * all_reduce_time(batch * model.hidden * 2, layout.tp, layout.tp, cluster)
    return prefill, response_len * (cluster.decode_step_overhead_s + max(step_memory, step_compute) + step_comm)


def generate_cost(w: Generate, c: ClusterSpec, o: CostOptions) -> CostRecord:
    """Prefill + decode roofline of the module docstring, in waves when a replica's KV cache does not fit at once."""
    m, g = w.model, w.layout
    plan = generation_plan(m, g, w.sequences, w.prompt_len + w.response_len, w.memory_used_bytes, c)
    if plan is None:
        weights = mem.generation_weight_bytes(m, g)
        return _infeasible("generate", f"{m.name} on {g}: weights {weights / 2**30:.1f} GiB and "
                           f"{w.memory_used_bytes / 2**30:.1f} GiB of states leave no room for one sequence's KV cache")
    waves, batch = plan
    prompts = math.ceil(batch / w.samples) if o.shared_prefill else batch
    prefill, decode = generation_time(m, g, batch, w.prompt_len, w.response_len, c, prompts)
    if w.turns > 1:  # turn k prefills the prompt and k earlier turns again (each sample its own context)
        per_turn = w.response_len / w.turns
        prefill += sum(generation_time(m, g, batch, max(1, round(w.prompt_len + k * per_turn)), 1, c, batch)[0]
                       for k in range(1, w.turns))
    factor = rollout_engine_cost(o.rollout_engine).time_factor
    prefill, decode = factor * prefill, factor * decode
    peak = (w.memory_used_bytes + mem.generation_weight_bytes(m, g)
            + batch * mem.kv_bytes_per_sequence(m, g, w.prompt_len + w.response_len))
    parts = (("prefill", waves * prefill), ("decode", waves * decode), ("waves", float(waves)))
    if w.turns > 1 or w.tool_s:
        parts += (("turns", float(w.turns)), ("tool", w.tool_s))
    return CostRecord("generate", waves * (prefill + decode) + w.tool_s, peak, parts)


def _forward_parts(model: ModelSpec, layout: Layout, tokens_per_micro: float, micro_batches: int,
                   all_reduces_per_layer: int, sends: int, c: ClusterSpec) -> tuple[float, float]:
    """(tensor-parallel all-reduce time, pipeline send time) of one device for ``micro_batches`` micro-batches.

    Each all-reduce and each stage-to-stage send moves the micro-batch's bf16
    activations, tokens·h·2 bytes.
    """
    act = tokens_per_micro * model.hidden * 2
    layers = model.layers / layout.pp
    tp = layers * all_reduces_per_layer * micro_batches * all_reduce_time(act, layout.tp, layout.tp, c)
    pp = 0.0 if layout.pp == 1 else micro_batches * sends * act / c.link_bandwidth(layout.model_parallel)
    return tp, pp


def shared_prompt_cost(micro: int, seq_len: int, prompt_len: int, samples: int, hidden: int,
                       o: CostOptions) -> tuple[float, int]:
    """(fraction of a micro-batch's ``micro·seq_len`` tokens the backbone runs, backbone calls) under prompt sharing.

    ``(1.0, 1)`` where the engine runs every row's prompt: sharing off, no repeated
    prompt, or fewer than :func:`shared_prompt_threshold` prompt positions saved.
    """
    if o.shared_prompt_min_saved is None or samples < 2 or not 0 < prompt_len < seq_len or micro < 2:
        return 1.0, 1
    distinct = math.ceil(micro / samples)
    if (micro - distinct) * prompt_len < shared_prompt_threshold(o.shared_prompt_min_saved, hidden):
        return 1.0, 1
    return (distinct * prompt_len + micro * (seq_len - prompt_len)) / (micro * seq_len), 2


def priced_seq_len(w: Infer | Update, o: CostOptions) -> float:
    """Tokens per sequence a forward of ``w`` runs: ``o.real_seq_len`` capped at the padded ``w.seq_len`` (packing
    or token budgets), the padded width without it and for reward-model scores."""
    if o.real_seq_len is None or w.kind == "score":
        return w.seq_len
    return min(o.real_seq_len, w.seq_len)


def infer_cost(w: Infer, c: ClusterSpec, o: CostOptions) -> CostRecord:
    """Forward passes: max(2·N·tokens/(t·p·peak·mfu_infer), ZeRO-3 gathers) + bubble + TP/PP comm + micro-batches x forward_overhead_s."""
    m, l = w.model, w.layout
    seqs = math.ceil(w.sequences / l.dp)
    micro = min(o.infer_micro_batch, seqs)
    micro_batches = math.ceil(seqs / micro)
    seq_len = priced_seq_len(w, o)
    share, calls = shared_prompt_cost(micro, seq_len, w.prompt_len, w.samples, m.hidden, o)
    compute = 2 * m.flop_params * seqs * seq_len * share / (l.model_parallel * c.peak_flops * c.mfu_infer)
    bubble = compute * (l.pp - 1) / micro_batches
    tp, pp = _forward_parts(m, l, micro * seq_len * share, micro_batches, 2, 1, c)
    dp = micro_batches * zero3_time(m, l, calls, c) if w.trainable and shards_weights_over_dp(w.engine) else 0.0
    overhead = micro_batches * calls * c.forward_overhead_s
    once = max(compute, dp) + bubble + tp + pp + overhead
    peak = (mem.resident_bytes(m, l, w.trainable, w.engine) + mem.gathered_param_bytes(m, l, w.trainable, w.engine)
            + mem.forward_activation_bytes(m, l, seq_len, micro))
    return CostRecord(w.kind, w.passes * once, peak,
                      (("compute", w.passes * compute), ("dp_comm", w.passes * dp), ("bubble", w.passes * bubble),
                       ("tp_comm", w.passes * tp), ("pp_comm", w.passes * pp), ("overhead", w.passes * overhead)))


def _train_flops_per_token(m: ModelSpec, checkpointing: bool) -> float:
    """(6|8)·N per token; with LoRA adapters (A params) the frozen weights get no weight gradient: (4|6)·N + 6·A."""
    if m.adapter_params:
        return (6 if checkpointing else 4) * m.flop_params + 6 * m.adapter_params
    return (8 if checkpointing else 6) * m.flop_params


def update_cost(w: Update, c: ClusterSpec, o: CostOptions) -> CostRecord:
    """Training steps: max((6|8)·N·tokens/(t·p·peak·mfu_train), overlapped dp comm) + exposed dp comm + bubble + TP/PP comm + Adam step + overheads.

    Overheads per optimizer step: micro-batches x ``train_micro_batch_overhead_s``
    + ``optimizer_step_overhead_s``.
    """
    m, l = w.model, w.layout
    steps = w.epochs * w.mini_batches
    seqs = math.ceil(w.sequences / (w.mini_batches * l.dp))
    micro = min(o.train_micro_batch, seqs)
    micro_batches = math.ceil(seqs / micro)
    seq_len = priced_seq_len(w, o)
    share, calls = shared_prompt_cost(micro, seq_len, w.prompt_len, w.samples, m.hidden, o)
    flops_per_token = _train_flops_per_token(m, o.activation_checkpointing)
    compute = flops_per_token * seqs * seq_len * share / (l.model_parallel * c.peak_flops * c.mfu_train)
    bubble = compute * (l.pp - 1) / micro_batches
    tp, pp = _forward_parts(m, l, micro * seq_len * share, micro_batches, 6 if o.activation_checkpointing else 4, 2, c)
    rule = DP_RULES.get(w.engine)
    if rule is None:
        raise PlanError(f"update of {m.name}: unknown training engine {w.engine!r}; known: {', '.join(DP_RULES)}")
    overlapped, exposed = rule(m, l, compute, micro_batches, flops_per_token, c, o)
    dp = overlapped + exposed
    adam = mem.OPTIMIZER_STEP_BYTES_PER_PARAM * m.trainable_params / l.size / (c.memory_bandwidth * c.memory_bandwidth_efficiency)
    overhead = micro_batches * calls * c.train_micro_batch_overhead_s + c.optimizer_step_overhead_s
    step = max(compute, overlapped) + exposed + bubble + tp + pp + adam + overhead
    peak = (mem.resident_bytes(m, l, True, w.engine) + mem.gathered_param_bytes(m, l, True, w.engine)
            + mem.train_activation_bytes(m, l, seq_len, micro, micro_batches, o.activation_checkpointing))
    return CostRecord("update", steps * step, peak,
                      (("compute", steps * compute), ("dp_comm", steps * dp), ("bubble", steps * bubble),
                       ("tp_comm", steps * tp), ("pp_comm", steps * pp), ("optimizer", steps * adam),
                       ("overhead", steps * overhead)))


def compute_cost(w: Compute, c: ClusterSpec, o: CostOptions) -> CostRecord:
    """Controller math, memory-bound on the host: tokens·controller_bytes_per_token / host bandwidth."""
    return CostRecord("compute", w.tokens * o.controller_bytes_per_token / c.host_bandwidth, 0.0)


def weight_sync_cost(w: WeightSync, c: ClusterSpec, o: CostOptions) -> CostRecord:
    """Hybrid-engine all-gather within micro-DP groups, peak M/(tg·pg) (:func:`~.reshard.transition_figures`).

    fsdp: (M/(tg·pg) − M/(t·p·d)) bytes per rank; the micro-DP groups are
    strided so that the generation TP groups stay inside a node, so they cross
    nodes whenever the pool does. megatron: (M/(tg·pg) − M/(t·p)) bytes per
    rank, within one replica's t·p model-parallel ranks (HybridFlow §5), so
    they cross nodes only when t·p does.
    """
    model_bytes = mem.PARAM_BYTES * w.model.trainable_params  # a LoRA policy syncs its adapters only
    try:
        figures = transition_figures(model_bytes, w.train, w.gen, w.engine)
    except PlanError as err:
        return _infeasible("weight_sync", str(err))
    if figures.comm_volume_bytes <= 0:
        return CostRecord("weight_sync", 0.0, figures.peak_memory_bytes)
    span = w.train.size if shards_weights_over_dp(w.engine) else w.train.model_parallel
    time = c.collective_latency_s + figures.comm_volume_bytes / c.link_bandwidth(span)
    return CostRecord("weight_sync", time, figures.peak_memory_bytes, (("all_gather", time),))


def transfer_cost(w: Offload, c: ClusterSpec, o: CostOptions) -> CostRecord:
    """Host <-> device copy over PCIe: nbytes / (host_bandwidth · comm_efficiency)."""
    return CostRecord(w.kind, w.nbytes / (c.host_bandwidth * c.comm_efficiency), 0.0)


COST_RULES: dict[str, Callable[..., CostRecord]] = {
    "generate": generate_cost,
    "infer": infer_cost,
    "score": infer_cost,
    "compute": compute_cost,
    "update": update_cost,
    "weight_sync": weight_sync_cost,
    "offload": transfer_cost,
    "onload": transfer_cost,
}


def estimate(work: object, cluster: ClusterSpec, options: CostOptions | None = None) -> CostRecord:
    """Cost of ``work`` by the rule registered for its ``kind``."""
    kind = getattr(work, "kind", None)
    rule = COST_RULES.get(kind) if isinstance(kind, str) else None
    if rule is None:
        raise PlanError(f"no cost rule for {type(work).__name__} (kind {kind!r}); register one in hybridflow.compiler.cost.COST_RULES")
    return rule(work, cluster, options or DEFAULT_OPTIONS)


DEFAULT_OPTIONS = CostOptions()
