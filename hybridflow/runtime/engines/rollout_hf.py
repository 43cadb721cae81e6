"""The rollout engine on transformers models: sampling with a KV cache, on CPU or one GPU.

``generate`` takes a batch of left-padded prompts (``prompt_ids``,
``prompt_mask`` and any other fields: ground truths, data sources, ...),
repeats each prompt ``n`` times, decodes (:func:`.decode.decode`) and returns
the repeated batch with

- ``response_ids`` int64[B, R] right-padded with the pad id to ``R = max_new_tokens``,
- ``response_mask`` float32[B, R]: 1 up to and including the first EOS, 0 after (a sampled
  pad token ends a response like an EOS, see :mod:`.decode`),
- ``rollout_log_probs`` float32[B, R]: ``log_softmax(logits / T)`` of each sampled token,
  before top-k/top-p truncation (see :mod:`.sampling`), 0 at padding,
- ``group_index`` int64[B]: the prompt each response belongs to (row of the input batch),
- ``policy_version`` int64[B, R]: :attr:`HFRolloutEngine.policy_version` when each token was decoded, -1 at padding,
- ``responses`` (column): the decoded text of each response, final EOS stripped.

With ``segment_tokens`` it decodes at most that many positions and adds the partial state
(``decoded_steps``, ``rollout_finished``); ``resume=True`` continues such a partial rollout
(:mod:`.segments`: partial rollouts).

The engine may share its module with the actor's train engine (colocated, same
device: weights are shared and :meth:`update_weights` has nothing to copy) or
hold its own copy, updated by :meth:`update_weights` after each training step.
It satisfies :class:`~.protocols.RolloutEngine` (registered as ``hf``); its
sampling randomness is one ``torch.Generator`` per seed, which
:meth:`rng_state` captures as base64 bytes.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch

from hybridflow.errors import ExecutionError

from ...batch import Batch
from ..byte_state import state_from_text, state_to_text
from .agent_loop import AgentParams, EnvHost, agent_rollout, hf_turn_decoder
from .decode import Carry, decode
from .lean_decode import supports_lean
from .sampling import SamplingParams
from .segments import check_resumable, piece_cut, piece_key, resume_prompt, stamp_versions
from .stream_decode import decode_groups
from .text import decode_responses

__all__ = ["HFRolloutEngine"]


def _special_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


class HFRolloutEngine:
    """Generates responses with a transformers causal LM.

    Args:
        model: a ``*ForCausalLM`` module (moved to ``device``).
        tokenizer: decodes the ``responses`` text column (None: no text column).
        sampling: default :class:`SamplingParams` of :meth:`generate`.
        eos_token_ids / pad_token_id: default from the model's generation config, then its
            config, then the tokenizer.
        device: where to generate (default: where the model's parameters are).
        micro_batch_size: responses decoded at once (whole prompt groups; None = all).
        num_threads: ``torch.set_num_threads`` for this process (CPU; one thread per worker is
            often fastest for tiny models on a busy machine); None leaves it alone.
        keep_products: a whole decode of a model being trained keeps its products for the update that follows
            (:mod:`.decode_tape`).
    """

    def __init__(self, model: torch.nn.Module, *, tokenizer=None, sampling: SamplingParams | None = None,
                 eos_token_ids: int | Sequence[int] | None = None, pad_token_id: int | None = None,
                 device: str | torch.device | None = None, micro_batch_size: int | None = None,
                 num_threads: int | None = None, keep_products: bool = False):
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.micro_batch_size = micro_batch_size
        self.keep_products = keep_products
        self.eos_token_ids = _special_ids(eos_token_ids) or self._model_special("eos_token_id")
        found_pad = pad_token_id if pad_token_id is not None else (self._model_special("pad_token_id") or (None,))[0]
        if found_pad is None:
            found_pad = self.eos_token_ids[0] if self.eos_token_ids else 0
        self.pad_token_id = int(found_pad)
        self._generators: dict[int, torch.Generator] = {}
        self.policy_version = 0
        """Weight syncs applied to this engine (the worker counts one per completed sync); stamped on each token."""
        self._held: dict[str, Carry] = {}
        """Cut decodings by :func:`.segments.piece_key`: continued from their KV cache while the weights are unchanged."""

    def _model_special(self, name: str) -> tuple[int, ...]:
        for source in (getattr(self.model, "generation_config", None), getattr(self.model, "config", None), self.tokenizer):
            ids = _special_ids(getattr(source, name, None))
            if ids:
                return ids
        return ()

    def _generator(self, seed: int | None) -> torch.Generator | None:
        """The engine's generator for ``seed``: seeded on first use, then continued across calls."""
        if seed is None:
            return None
        if seed not in self._generators:
            self._generators[seed] = torch.Generator(device=self.device).manual_seed(seed)
        return self._generators[seed]

    def generate(self, batch: Batch, sampling: SamplingParams | None = None, *, segment_tokens: int | None = None,
                 resume: bool = False) -> Batch:
        """Responses for every prompt of ``batch`` (``n`` each); see the module docstring for the fields.

        With a ``seed``, the engine's generator for that seed is created on the first call and
        continues on later ones: a run is reproducible and successive calls draw fresh samples.

        ``segment_tokens``: decode at most that many positions per response and return the partial state;
        ``resume``: ``batch`` is such a partial rollout (already ``n`` rows per prompt), continued for at most
        ``segment_tokens`` positions more (None: to the end). See :mod:`.segments`.
        """
        params = sampling or self.sampling
        if segment_tokens is not None and segment_tokens < 1:
            raise ExecutionError(f"generate: segment_tokens must be at least 1 (or None: no cut), got {segment_tokens}")
        if resume:
            check_resumable(batch)
        elif "prompt_ids" not in batch or "prompt_mask" not in batch:
            raise ExecutionError(f"generate needs prompt_ids and prompt_mask in the batch; it has {batch.keys()}")
        generator = self._generator(params.seed)
        if not resume:
            self._held.clear()  # a new generation: cut ones not continued by now are not coming back
        # eval mode for the model's own forward; the lean path computes as in eval mode in either (no dropout)
        switch = self.model.training and not supports_lean(self.model)
        if switch:
            self.model.eval()
        try:
            if resume:
                parts = [self._continue(piece, params, generator, segment_tokens) for piece in self._row_pieces(batch, params.n)]
            else:
                parts = [self._decode(piece, params, generator, segment_tokens) for piece in self._pieces(batch, params.n)]
        finally:
            if switch:
                self.model.train()
        fields = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
        if self.tokenizer is not None:
            fields["responses"] = decode_responses(self.tokenizer, fields["response_ids"], fields["response_mask"],
                                                   self.eos_token_ids)
        if resume:
            return batch.with_fields(**fields)
        repeated = batch.repeat_interleave(params.n) if params.n > 1 or "group_index" not in batch else batch
        return repeated.with_fields(**fields)

    def generate_stream(self, batch: Batch, sampling: SamplingParams | None = None) -> Iterator[tuple[torch.Tensor, Batch]]:
        """:meth:`generate` in pieces, each prompt group as soon as its ``n`` responses have ended
        (:func:`.stream_decode.decode_groups`): yields ``(rows, piece)``, ``rows`` int64 ``(k,)`` the rows of
        :meth:`generate`'s result that ``piece`` holds (whole groups, ascending).

        The same tokens as :meth:`generate` with the same generator state: the pieces put back in row order
        are its result, and the generator ends in the same state.
        """
        params = sampling or self.sampling
        if "prompt_ids" not in batch or "prompt_mask" not in batch:
            raise ExecutionError(f"generate needs prompt_ids and prompt_mask in the batch; it has {batch.keys()}")
        generator = self._generator(params.seed)
        repeated = batch.repeat_interleave(params.n) if params.n > 1 or "group_index" not in batch else batch
        switch = self.model.training and not supports_lean(self.model)
        if switch:
            self.model.eval()
        try:
            start = 0
            for micro in self._pieces(batch, params.n):
                for rows, out in decode_groups(self.model, micro["prompt_ids"].to(self.device),
                                               micro["prompt_mask"].to(self.device), params,
                                               eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id,
                                               generator=generator):
                    fields = {"response_ids": out.response_ids, "response_mask": out.response_mask,
                              "rollout_log_probs": out.log_probs,
                              "policy_version": stamp_versions(out.response_mask.cpu(), self.policy_version)}
                    if self.tokenizer is not None:
                        fields["responses"] = decode_responses(self.tokenizer, out.response_ids, out.response_mask,
                                                               self.eos_token_ids)
                    rows = rows + start
                    yield rows, repeated[rows].with_fields(**fields)
                start += len(micro) * params.n
        finally:
            if switch:
                self.model.train()

    def generate_agentic(self, batch: Batch, sampling: SamplingParams | None, agent: AgentParams,
                         envs: EnvHost | None = None) -> Batch:
        """Multi-turn trajectories against ``agent.env`` (:mod:`.agent_loop`), ``n`` per prompt; its environments where
        ``envs`` puts them (None: in this process)."""
        params = sampling or self.sampling
        switch = self.model.training and not supports_lean(self.model)
        if switch:
            self.model.eval()
        try:
            turns = hf_turn_decoder(self.model, params, eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id,
                                    generator=self._generator(params.seed), device=self.device)
            out = agent_rollout(turns, self.tokenizer, batch, params, agent, eos_token_ids=self.eos_token_ids,
                                pad_token_id=self.pad_token_id, envs=envs)
        finally:
            if switch:
                self.model.train()
        return out

    def _pieces(self, batch: Batch, n: int) -> list[Batch]:
        """Consecutive prompt pieces of about ``micro_batch_size`` responses each."""
        if not self.micro_batch_size or len(batch) * n <= self.micro_batch_size:
            return [batch]
        return batch.split(max(1, self.micro_batch_size // n))

    def _row_pieces(self, batch: Batch, n: int) -> list[Batch]:
        """The pieces of an already repeated batch that :meth:`_pieces` made of its prompts (same rows each)."""
        if not self.micro_batch_size or len(batch) <= self.micro_batch_size:
            return [batch]
        return batch.split(max(1, self.micro_batch_size // n) * n)

    def _decode(self, piece: Batch, params: SamplingParams, generator, segment: int | None) -> dict[str, torch.Tensor]:
        width = params.max_new_tokens
        out = decode(self.model, piece["prompt_ids"].to(self.device), piece["prompt_mask"].to(self.device), params,
                     eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id, generator=generator,
                     steps=None if segment is None else min(segment, width), capacity=width,
                     keep_products=self.keep_products and params.keep_products)
        pad = width - out.response_ids.shape[1]
        mask = torch.nn.functional.pad(out.response_mask.cpu(), (0, pad))
        fields = {"response_ids": torch.nn.functional.pad(out.response_ids.cpu(), (0, pad), value=self.pad_token_id),
                  "response_mask": mask, "rollout_log_probs": torch.nn.functional.pad(out.log_probs.cpu(), (0, pad)),
                  "policy_version": stamp_versions(mask, self.policy_version)}
        if segment is not None:
            steps = torch.full((mask.shape[0],), out.steps, dtype=torch.int64)
            fields["decoded_steps"] = steps
            fields["rollout_finished"] = out.done.cpu() | (steps >= width)
            if out.carry is not None and out.steps < width:
                rows = piece["prompt_ids"].repeat_interleave(params.n, 0), piece["prompt_mask"].repeat_interleave(params.n, 0)
                self._held[piece_key(*rows, fields["response_ids"], out.steps)] = out.carry
        return fields

    def _continue(self, piece: Batch, params: SamplingParams, generator, segment: int | None) -> dict[str, torch.Tensor]:
        """One piece of a partial rollout decoded on from its cut (:mod:`.segments`); kept positions unchanged."""
        width = params.max_new_tokens
        if piece["response_ids"].shape[1] != width:
            raise ExecutionError(f"generate(resume=True): the partial responses are {piece['response_ids'].shape[1]} "
                                 f"positions wide but max_new_tokens is {width}; resume with the sampling they were made with")
        kept = {name: piece[name].clone() for name in ("response_ids", "response_mask", "rollout_log_probs",
                                                       "policy_version", "decoded_steps", "rollout_finished")}
        cut = piece_cut(piece)
        if cut is None:
            return kept
        finished = piece["rollout_finished"].bool()
        steps = min(segment or width - cut, width - cut)
        carry = self._held.pop(piece_key(piece["prompt_ids"], piece["prompt_mask"], piece["response_ids"], cut), None)
        if carry is None:  # new weights since the cut (or another process cut it): recompute the KV cache
            ids, mask = resume_prompt(piece, cut)
            ids, mask = ids.to(self.device), mask.to(self.device)
        else:
            ids = mask = None
        out = decode(self.model, ids, mask, params.model_copy(update={"n": 1}), eos_token_ids=self.eos_token_ids,
                     pad_token_id=self.pad_token_id, generator=generator, steps=steps, done=finished,
                     capacity=width - cut, carry=carry)
        span = slice(cut, cut + steps)
        kept["response_ids"][:, span] = out.response_ids.cpu()
        kept["response_mask"][:, span] = out.response_mask.cpu()
        kept["rollout_log_probs"][:, span] = out.log_probs.cpu()
        kept["policy_version"][:, span] = stamp_versions(out.response_mask.cpu(), self.policy_version)
        decoded = torch.where(finished, kept["decoded_steps"], torch.full_like(kept["decoded_steps"], cut + out.steps))
        kept["decoded_steps"] = decoded
        kept["rollout_finished"] = finished | out.done.cpu() | (decoded >= width)
        if out.carry is not None and cut + out.steps < width:
            self._held[piece_key(piece["prompt_ids"], piece["prompt_mask"], kept["response_ids"], cut + out.steps)] = out.carry
        return kept

    # -- the rollout protocol (protocols.RolloutEngine) -------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(name, tensor)`` pairs into the model (any bucket of it); see :meth:`load_weights`."""
        return self.load_weights(named_tensors)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self.model.state_dict().items()}

    def shares_weights_with(self, train: Any) -> bool:
        return getattr(train, "module", None) is self.model

    def rng_state(self) -> dict[str, Any]:
        """``{"generators": {seed: base64 of the generator state}}`` of every seed used so far."""
        return {"generators": {str(seed): state_to_text(g.get_state())
                               for seed, g in self._generators.items()}}

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        for seed, text in state.get("generators", {}).items():
            generator = torch.Generator(device=self.device)
            generator.set_state(state_from_text(text))
            self._generators[int(seed)] = generator

    def sleep(self) -> None:
        """Move the model to host memory (a module of its own only: a shared one moves with its train engine)."""
        self._held.clear()
        self.model.to("cpu")

    def wake(self) -> None:
        self.model.to(self.device)

    @torch.no_grad()
    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy named tensors (a state dict, or ``(name, tensor)`` pairs) into the model; returns how many were copied.

        A tensor that already is the model's own (shared module) is skipped. An unknown name
        or a shape mismatch raises ExecutionError naming it.
        """
        self._held.clear()  # a cut decoding's KV cache is of the old weights: a continuation recomputes it
        own = self.model.state_dict(keep_vars=True)
        items = weights.items() if isinstance(weights, Mapping) else weights
        copied = 0
        for name, tensor in items:
            target = own.get(name)
            if target is None:
                raise ExecutionError(f"weight sync: the rollout model has no parameter {name!r} "
                                     f"(it has e.g. {list(own)[:3]}); train and rollout models must share names")
            if target.shape != tensor.shape:
                raise ExecutionError(f"weight sync: {name!r} has shape {tuple(tensor.shape)} but the rollout model "
                                     f"expects {tuple(target.shape)}")
            if target.data_ptr() == tensor.data_ptr() and target.device == tensor.device:
                continue
            # copy_ on the parameter (no_grad), not .data: its version counter advances (decode_tape)
            target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
            copied += 1
        return copied
