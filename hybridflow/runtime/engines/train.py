"""The train engine: one torch module, AdamW, and PPO-style updates from registered loss ops.

An update runs ``ppo_epochs`` passes over the batch; each pass splits it into
mini-batches (one optimizer step each) and every mini-batch into
micro-batches whose gradients accumulate. Each loss op is called with the
*mini-batch's* token and sequence counts (``global_tokens``, ``global_seqs``),
so the micro-batch losses add up to the mini-batch loss and the gradient does
not depend on the micro-batch size (verl's global-token normalisation). With no
micro-batch size or token budget set, an update's micro-batches are width buckets
(rows sorted by response length, each bucket at its own width, see
:mod:`.micro_batches`), and every update micro-batch is cut to its longest response.

Model inputs of the losses come from the module: a causal LM gives
``log_probs`` and ``entropy`` (:mod:`.lm_logprobs`), a
:class:`~hybridflow.runtime.engines.critic.ValueModel` gives ``value_preds``.
Other inputs are batch fields of the same name.

Metrics (keys ``<prefix>/<name>``): each loss under its usual name
(``pg_loss``, ``vf_loss``, ``kl_loss``, ``entropy_loss``, see
:data:`~.loss_terms.LOSS_METRIC_NAMES`) as the mini-batch loss; the ops' own
metrics (``pg_clipfrac``, ``ppo_kl``, ``vf_clipfrac``, ...) as token-weighted
means over the mini-batch; ``entropy`` (actor), ``loss`` (the weighted sum),
``grad_norm`` (before clipping); all averaged over mini-batches and epochs.
``lr`` is the learning rate of this training step, the one every optimizer step
of the update used (the schedule follows training steps, not optimizer steps:
:class:`~.optim.TrainingStepSchedule`), and ``nan_skipped`` counts the
mini-batches whose loss or gradient norm was not finite: their optimizer step
is skipped and their gradients dropped, and they are left out of the means.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from hybridflow_ops.losses import count_seqs, count_tokens
from hybridflow_ops.masked import masked_mean

from hybridflow.errors import BatchError, OpError

from .grad_slots import flat_gradient_slots, gradients_into
from .loss_terms import LossTerm, MetricMeans, ResolvedTerm, resolve_loss_terms
from .lm_logprobs import response_log_probs
from .lora import adapter_state, apply_lora, is_lora, load_adapter_state
from .micro_batches import micro_batch_groups, restore_row_order, stand_in, take_rows, update_buckets
from .sequence import trim_response_width
from .optim import TrainEngineConfig, TrainingStepSchedule, build_optimizer
from ..token_partition import split_groups

__all__ = ["TrainEngine", "TrainEngineConfig", "LossTerm"]

SEQUENCE_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
CountReduce = Callable[[torch.Tensor], torch.Tensor]


class TrainEngine:
    """A trainable module (causal LM actor or :class:`ValueModel` critic) with its optimizer.

    With ``config.lora`` the module gets LoRA adapters (:mod:`.lora`, in place) and only they train: the
    optimizer holds them alone, and :meth:`state_dict` and :meth:`named_weights` give them alone.

    Args:
        module: the model; moved to ``device``.
        config: optimizer, schedule, batching, precision, thread and LoRA settings.
        metric_prefix: metric keys are ``f"{metric_prefix}/{name}"`` (``"actor"``, ``"critic"``).
        device: where the module lives and computes (default: where its parameters are).
    """

    def __init__(self, module: torch.nn.Module, config: TrainEngineConfig | None = None, *,
                 metric_prefix: str = "actor", device: str | torch.device | None = None):
        self.config = config or TrainEngineConfig()
        if self.config.num_threads is not None:
            torch.set_num_threads(self.config.num_threads)
        if self.config.lora is not None and not is_lora(module):
            module = apply_lora(module, self.config.lora)
        first = next(module.parameters())
        self.device = torch.device(device) if device is not None else first.device
        self.module = module.to(self.device)
        self.metric_prefix = metric_prefix
        self.optimizer = build_optimizer(self.module.parameters(), self.config)
        self.scheduler = TrainingStepSchedule(self.optimizer, self.config)
        self.shuffle_generator = torch.Generator().manual_seed(self.config.seed)
        """Orders the samples into mini-batches at each update (``config.shuffle``); checkpointed with the engine."""
        self.is_value_model = hasattr(self.module, "response_values")
        self._gradient_slots: list[tuple[torch.nn.Parameter, torch.Tensor]] | None = None
        """Each trainable parameter's gradient in the update's flat buffer (:meth:`_start_gradients`), None between
        updates."""
        self._zeroed: list[tuple[torch.nn.Parameter, torch.Tensor, int]] = []
        """The gradient buffers :meth:`_start_gradients` zeroed, with their versions then."""

    flat_gradients = True
    """On the CPU, an update's gradients live in one buffer given back at its end (:meth:`_start_gradients`); the FSDP
    engine's do not."""

    # ------------------------------------------------------------------ inference

    @property
    def use_bf16(self) -> bool:
        """Whether forward passes run under bf16 autocast (see ``TrainEngineConfig.precision``)."""
        if self.config.precision == "bf16":
            return True
        if self.config.precision == "fp32":
            return False
        return self.device.type == "cuda" and torch.cuda.is_bf16_supported()

    def _autocast(self):
        if not self.use_bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    @torch.no_grad()
    def compute_log_probs(self, batch, *, temperature: float | None = None) -> torch.Tensor:
        """Log-prob of each response token under the current weights: ``(b, R)`` float32 (on CPU).

        Reads ``prompt_ids``, ``prompt_mask``, ``response_ids``, ``response_mask``; runs in
        eval mode, ``micro_batch_size`` samples at a time; ``temperature`` defaults to the config's.
        """
        if self.is_value_model:
            raise OpError("compute_log_probs needs a causal LM; this engine trains a value model (use compute_values)")
        temperature = self.config.temperature if temperature is None else temperature
        self._mode(training=False)
        tensors, width = trim_response_width(self._tensors(batch, SEQUENCE_FIELDS, "compute_log_probs"))
        micro, groups = self.micro_batches(tensors)
        parts = [self._lm_outputs(t, with_entropy=False, temperature=temperature)["log_probs"].cpu() for t in micro]
        out = restore_row_order(parts[:len(groups)], groups)  # stand-ins' outputs dropped
        return torch.nn.functional.pad(out, (0, width - out.shape[-1]))  # 0 past the longest response

    @torch.no_grad()
    def compute_values(self, batch) -> torch.Tensor:
        """The critic's ``V(s_t)`` for each response position: ``(b, R)`` float32 (on CPU)."""
        if not self.is_value_model:
            raise OpError("compute_values needs a ValueModel; this engine trains a causal LM (use compute_log_probs)")
        self._mode(training=False)
        micro, groups = self.micro_batches(self._tensors(batch, SEQUENCE_FIELDS, "compute_values"))
        parts = [self._value_outputs(t)["value_preds"].cpu() for t in micro]
        return restore_row_order(parts[:len(groups)], groups)

    def _mode(self, *, training: bool) -> None:
        """``module.train(training)``, skipped when the module is in that mode already (it walks every submodule)."""
        if self.module.training != training:
            self.module.train(training)

    def _lm_outputs(self, t: Mapping[str, torch.Tensor], *, with_entropy: bool, temperature: float) -> dict:
        with self._autocast():
            out = response_log_probs(self.module, *(t[f] for f in SEQUENCE_FIELDS), temperature=temperature,
                                     chunk_size=self.config.logprob_chunk_size, with_entropy=with_entropy,
                                     packed=self.config.pack_sequences)
        result = {"log_probs": out.log_probs}
        if out.entropy is not None:
            result["entropy"] = out.entropy
        return result

    def _value_outputs(self, t: Mapping[str, torch.Tensor]) -> dict:
        packed = {"packed": True} if self.config.pack_sequences else {}
        with self._autocast():
            return {"value_preds": self.module.response_values(*(t[f] for f in SEQUENCE_FIELDS), **packed)}

    def _model_outputs(self, t: Mapping[str, torch.Tensor], needs: frozenset[str]) -> dict:
        provided = {"value_preds"} if self.is_value_model else {"log_probs", "entropy"}
        if not needs <= provided:
            kind = "a value model" if self.is_value_model else "a causal LM"
            raise OpError(f"the losses need model inputs {sorted(needs - provided)}, which {kind} does not produce "
                          f"(it gives {sorted(provided)}); put these losses on the other role")
        if self.is_value_model:
            return self._value_outputs(t)
        with_entropy = "entropy" in needs or self.config.entropy_metric
        return self._lm_outputs(t, with_entropy=with_entropy, temperature=self.config.temperature)

    # ------------------------------------------------------------------ update

    def update(self, batch, loss_terms: Sequence[LossTerm | Sequence], *,
               count_reduce: CountReduce | None = None) -> dict[str, float]:
        """One training iteration on ``batch``: ppo_epochs x mini-batches x micro-batches.

        ``loss_terms``: ``(op name, weight, attrs)`` triples, e.g.
        ``[("ppo_clip", 1.0, {"clip_low": 0.2}), ("kl_loss", 0.001, {"kl_type": "low_var_kl"})]``.
        ``count_reduce``: maps a mini-batch's ``[tokens, seqs]`` counts to the global ones
        (a sum over data-parallel ranks); None = this process holds the whole batch.
        Returns the metrics described in the module docstring. The update is one training step:
        it runs at the schedule's rate for this step and advances the schedule by one, whether or
        not its optimizer steps were taken.
        """
        terms = resolve_loss_terms(loss_terms)
        needs = frozenset(f.name for term in terms for f in term.spec.model_inputs)
        fields = tuple(dict.fromkeys(SEQUENCE_FIELDS + tuple(f.name for t in terms for f in t.spec.inputs)))
        tensors = self._tensors(batch, fields, f"update ({', '.join(t.spec.name for t in terms)})")
        tensors, _ = trim_response_width(tensors)  # columns past the longest response: padding only
        self._mode(training=True)
        lr = self.scheduler.apply()
        metrics, skipped = MetricMeans(), 0
        for _ in range(self.config.ppo_epochs):
            for mini in self._mini_batches(tensors):
                stats = self._mini_batch_step(mini, terms, needs, count_reduce)
                if stats is None:
                    skipped += 1
                else:
                    metrics.add_all(stats)
        self._release_gradients()
        self.scheduler.advance()
        out = {f"{self.metric_prefix}/{k}": v for k, v in metrics.means().items()}
        out[f"{self.metric_prefix}/lr"] = lr
        out[f"{self.metric_prefix}/nan_skipped"] = float(skipped)
        return out

    def _mini_batch_step(self, mini: dict, terms: tuple[ResolvedTerm, ...], needs: frozenset[str],
                         count_reduce: CountReduce | None) -> dict[str, float] | None:
        """Accumulate the micro-batch gradients and take one optimizer step; None when skipped (non-finite).

        The metrics stay tensors until one host sync after the gradient clipping (``tolist`` of one
        stacked tensor): a loss that is not finite is found there, its gradients (non-finite too, or
        meaningless) are dropped with the step, as a non-finite gradient norm's are.
        """
        mask = mini["response_mask"]
        counts = torch.stack([count_tokens(mask), count_seqs(mask)])
        if count_reduce is not None:
            counts = count_reduce(counts)
        global_counts = {"global_tokens": counts[0], "global_seqs": counts[1]}
        local_tokens = count_tokens(mask).float().clamp(min=1.0)
        self._start_gradients()
        pending: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []
        contributing = self._rows_that_contribute(mini, terms)
        micro_batches, groups = self.micro_batches(contributing, stand_ins_from=mini, buckets=True)
        # each micro-batch at its own width: its columns past its longest response are padding only
        micro_batches = [trim_response_width(micro)[0] for micro in micro_batches]
        mini = contributing
        for index, micro in enumerate(micro_batches):
            share = count_tokens(micro["response_mask"]).float() / local_tokens
            metrics = pending if index < len(groups) else []  # a stand-in's (zero) metrics are left out
            loss = self._micro_batch_loss(micro, terms, needs, global_counts, metrics, share)
            with gradients_into({id(param): grad for param, grad, _ in self._zeroed}):
                loss.backward()
        if len(mini["response_mask"]):
            self._forget_untouched_gradients()
        else:
            self._zero_gradients()  # no row contributes: the optimizer still takes its (zero-gradient) step
        grad_norm = self._clip_gradients()
        scalars = [grad_norm.float()] + [v for _, v, _ in pending] + [w for _, _, w in pending if w is not None]
        values = torch.stack([t.reshape(()).to(grad_norm.device, torch.float32) for t in scalars]).tolist()
        grad_norm_value, values, weights = values[0], values[1:len(pending) + 1], iter(values[len(pending) + 1:])
        token_means, loss_sums = MetricMeans(), {"loss": 0.0}
        for (name, _, share), value in zip(pending, values):
            if share is None:
                loss_sums[name] = loss_sums.get(name, 0.0) + value
            else:
                token_means.add(name, value, next(weights))
        if not (math.isfinite(loss_sums["loss"]) and math.isfinite(grad_norm_value)):
            self._drop_gradients()
            return None
        self.optimizer.step()
        if not self._flat_gradients:
            self._drop_gradients()  # on a GPU, the memory goes back to the caching allocator for the rollout
        return {**token_means.means(), **loss_sums, "grad_norm": grad_norm_value}

    def _micro_batch_loss(self, micro: dict, terms, needs, global_counts, pending: list,
                          share: torch.Tensor) -> torch.Tensor:
        """The weighted loss of one micro-batch; its metrics are appended to ``pending`` as tensors.

        ``pending`` entries: ``(name, value, share)``; share None for the losses (summed over
        micro-batches), the micro-batch's token share for the ops' metrics (token-weighted means).
        """
        outputs = self._model_outputs(micro, needs)
        total = torch.zeros((), device=self.device)
        for term in terms:
            result = term.evaluate(outputs, micro, global_counts)
            total = total + term.weight * result.loss
            pending.append((term.metric_name, result.loss.detach(), None))
            for name, value in zip(result._fields[1:], result[1:]):
                pending.append((name, torch.as_tensor(value).detach(), share))
        if "entropy" in outputs and self.config.entropy_metric:
            pending.append(("entropy", masked_mean(outputs["entropy"].detach(), micro["response_mask"]), share))
        pending.append(("loss", total.detach(), None))
        return total

    def _rows_that_contribute(self, mini: dict, terms: tuple[ResolvedTerm, ...]) -> dict:
        """``mini`` without the rows whose every loss term vanishes (see ``OpSpec.vanishes_with``).

        Such rows add exactly zero loss and gradient, so skipping them changes nothing but the
        time spent; the global counts were taken from the whole mini-batch before.
        """
        fields = {term.spec.vanishes_with for term in terms}
        if not self.config.skip_vanishing_rows or None in fields:
            return mini
        valid = mini["response_mask"] != 0
        keep = torch.zeros(valid.shape[0], dtype=torch.bool, device=valid.device)
        for name in fields:
            keep |= ((mini[name] != 0) & valid).flatten(1).any(-1)
        if bool(keep.all()):
            return mini
        return {k: v[keep] for k, v in mini.items()}

    def _drop_gradients(self) -> None:
        """``optimizer.zero_grad(set_to_none=True)`` as a plain loop: the same result without its profiler
        record and hook dispatch (0.13 ms a call on the tiny model, twice a mini-batch)."""
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                param.grad = None

    @property
    def _flat_gradients(self) -> bool:
        return self.flat_gradients and self.device.type == "cpu"

    def _start_gradients(self) -> None:
        """No gradient before a mini-batch's backward passes: on a GPU none at all (:meth:`_drop_gradients`), on the
        CPU each trainable parameter's slot of one zeroed buffer, which the backward adds into.

        The buffer is made at an update's first mini-batch, zeroed in place for the next ones, and given back at the
        update's end (:meth:`_release_gradients`), so that no gradient is resident while the rollout decodes (on the
        ~100M bench model the decode's reordered weight copies are as large as the gradients). One allocation of the
        model's size is mapped and unmapped as a whole; gradients allocated per parameter by each backward leave
        glibc's heap fragmented instead (docs/benchmarks.md). Each slot is its own tensor on the buffer's storage
        (``Tensor.set_``, not a view), with its own version counter: a slot that no backward of the mini-batch
        touches is set back to None (:meth:`_forget_untouched_gradients`), as ``set_to_none`` leaves it: clipping
        and AdamW skip its parameter exactly as before. ``0 + g`` is ``g``: the same numbers. The lean forward's
        backward functions add each weight gradient into its slot as they compute it (:mod:`.grad_slots`).
        """
        if not self._flat_gradients:
            return self._drop_gradients()
        if self._gradient_slots is None:
            self._gradient_slots = flat_gradient_slots(self.optimizer)
        else:
            for _, grad in self._gradient_slots:
                grad.zero_()
        self._zeroed = []
        for param, grad in self._gradient_slots:
            param.grad = grad
            self._zeroed.append((param, grad, grad._version))

    def _release_gradients(self) -> None:
        """Give the update's gradient buffer back (:meth:`_start_gradients`): no parameter keeps a gradient."""
        if self._gradient_slots is not None:
            self._drop_gradients()
            self._gradient_slots, self._zeroed = None, []

    def _forget_untouched_gradients(self) -> None:
        """Set back to None each buffer :meth:`_start_gradients` zeroed that no backward has written since (the same
        tensor at the same version: a backward adds into it in place or puts a new tensor there)."""
        for param, grad, version in self._zeroed:
            if param.grad is grad and grad._version == version:
                param.grad = None
        self._zeroed = []

    def _zero_gradients(self) -> None:
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param)

    def _clip_gradients(self) -> torch.Tensor:
        """Clip to ``max_grad_norm``; returns the norm before clipping (a 0-d tensor, not synced)."""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a DTensor, made whole

    # ------------------------------------------------------------------ batching

    def _tensors(self, batch, fields: Sequence[str], purpose: str) -> dict[str, torch.Tensor]:
        """The named tensor fields of ``batch`` on this engine's device; a missing one is an OpError."""
        out = {}
        for name in fields:
            try:
                value = batch[name]
            except (KeyError, LookupError, BatchError):
                raise OpError(f"{purpose} needs the batch field {name!r}, which the batch lacks; "
                              "compute it earlier in the graph or rename the field") from None
            if not isinstance(value, torch.Tensor):
                raise OpError(f"{purpose} needs {name!r} as a tensor, got {type(value).__name__}")
            out[name] = value.to(self.device)
        return out

    def _mini_batches(self, tensors: dict[str, torch.Tensor]) -> Iterator[dict[str, torch.Tensor]]:
        size = len(tensors["response_mask"])
        if self.config.shuffle:
            order = torch.randperm(size, generator=self.shuffle_generator).to(self.device)
            tensors = {k: v.index_select(0, order) for k, v in tensors.items()}
        step = self.config.mini_batch_size or size
        for start in range(0, size, step):
            yield {k: v[start:start + step] for k, v in tensors.items()}

    def micro_batches(self, tensors: dict[str, torch.Tensor], *, stand_ins_from: dict[str, torch.Tensor] | None = None,
                      buckets: bool = False) -> tuple[list[dict[str, torch.Tensor]], list[list[int]]]:
        """The micro-batches of ``tensors`` and their row indices (:mod:`.micro_batches`).

        As many micro-batches as :meth:`_agree_micro_batch_count` says: more rows split, then stand-ins
        (made from ``stand_ins_from``, default ``tensors``) after the real ones; their rows are not in
        the returned groups. ``buckets`` (updates): width buckets where the config sets no micro-batch
        size or token budget and ``length_buckets`` is on (:func:`.micro_batches.update_buckets`).
        """
        config = self.config
        if buckets and config.length_buckets and config.micro_batch_size is None and \
                config.max_tokens_per_micro_batch is None and not config.pack_sequences:
            groups = update_buckets(self.module, tensors)
        else:
            groups = micro_batch_groups(tensors, micro_batch_size=config.micro_batch_size,
                                        max_tokens=config.max_tokens_per_micro_batch)
        count = self._agree_micro_batch_count(len(groups))
        if count > len(groups):
            groups = split_groups(groups, count)
        parts = [take_rows(tensors, rows) for rows in groups]
        source = tensors if stand_ins_from is None else stand_ins_from
        parts += [stand_in(source) for _ in range(count - len(groups))]
        return parts, groups

    def _agree_micro_batch_count(self, count: int) -> int:
        """The number of micro-batches every rank runs, given this one's ``count``: ``count`` here (one process)."""
        return count

    # ------------------------------------------------------------------ state

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step will use."""
        return self.optimizer.param_groups[0]["lr"]

    def set_lr(self, lr: float) -> None:
        """Change the peak learning rate; the schedule's current factor still applies."""
        self.scheduler.set_base_lr(lr)

    def state_dict(self) -> dict[str, Any]:
        """Model (a LoRA module: its adapters), optimizer and schedule state (the schedule's under ``"scheduler"``)."""
        model = adapter_state(self.module) if is_lora(self.module) else self.module.state_dict()
        return {"model": model, "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "shuffle_rng": self.shuffle_generator.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if is_lora(self.module):
            load_adapter_state(self.module, state["model"])
        else:
            self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if "shuffle_rng" in state:
            self.shuffle_generator.set_state(state["shuffle_rng"])

    def move_states(self, items: Sequence[str], device: torch.device) -> None:
        """Move ``params`` (the module) and/or ``optimizer`` (Adam moments; ``step`` counters stay) to ``device``."""
        if "params" in items:
            self.module.to(device)
        if "optimizer" in items:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":
                        state[key] = value.to(device)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of every parameter and buffer (a LoRA module: of its adapters), detached, for weight
        sync to a rollout engine."""
        if is_lora(self.module):
            yield from adapter_state(self.module).items()
        else:
            yield from self.module.state_dict(keep_vars=False).items()

