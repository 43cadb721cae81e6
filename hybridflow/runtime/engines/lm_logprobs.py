"""Log-probabilities of response tokens under a causal LM, without the full logits.

The backbone produces the hidden states before each response token
(:func:`~hybridflow.runtime.engines.sequence.response_hidden`, or
:func:`~hybridflow.runtime.engines.shared_prompt.shared_response_hidden` running each
distinct prompt of a batch once); the fused
``token_logprobs_from_hidden`` op applies the lm_head chunk by chunk, so the
``(b, R, V)`` logits never exist. Models whose output layer is not a plain
linear map (a logit scale or soft-capping, as in Gemma 2 or Cohere) go through
the model's own logits and ``token_logprobs_from_logits`` instead.

    log_probs[b, t] = log_softmax(lm_head(h[b, P-1+t]) / T)[y[b, t]]

which is exactly what the rollout engine records for a sampled token
(:mod:`~hybridflow.runtime.engines.sampling`). Under bf16 autocast the
backbone runs in bf16 and the lm_head / log-softmax in float32.

With ``packed=True`` the rows run as one packed row of real tokens
(:mod:`~hybridflow.runtime.engines.packing`): the lm_head then sees only the
``M`` valid response states, and the results are scattered back to ``(b, R)``.
"""
from __future__ import annotations

import torch
from hybridflow_ops.logprob import DEFAULT_CHUNK_SIZE, TokenLogProbs, token_logprobs_from_hidden, token_logprobs_from_logits

from .packing import pack_rows, packed_hidden, packed_logits, unpack
from .sequence import join_prompt_response, response_hidden
from .shared_prompt import shared_response_hidden

__all__ = ["plain_lm_head", "response_log_probs"]

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def plain_lm_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output ``nn.Linear`` when the logits are exactly ``lm_head(hidden)``, else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    return head


def response_log_probs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       response_ids: torch.Tensor, response_mask: torch.Tensor, *, temperature: float = 1.0,
                       chunk_size: int = DEFAULT_CHUNK_SIZE, with_entropy: bool = False,
                       packed: bool = False) -> TokenLogProbs:
    """Log-prob (and entropy) of every response token under ``model`` at ``temperature``.

    Shapes: prompt_ids, prompt_mask ``(b, P)``; response_ids, response_mask ``(b, R)``
    -> log_probs ``(b, R)`` float32, entropy ``(b, R)`` float32 or None. Values at
    padding positions are finite but meaningless (0 when ``packed``); mask them with ``response_mask``.
    Gradients flow to the model's parameters when grad mode is on. ``packed``: run the rows
    packed into one row of real tokens (the same numbers up to float summation order).
    """
    if packed:
        return _packed_log_probs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature,
                                 chunk_size=chunk_size, with_entropy=with_entropy)
    inputs = join_prompt_response(prompt_ids, prompt_mask, response_ids, response_mask)
    prompt_len = prompt_ids.shape[-1]
    head = plain_lm_head(model)
    if head is not None and hasattr(model, "base_model") and model.base_model is not model:
        hidden = shared_response_hidden(model.base_model, prompt_ids, prompt_mask, response_ids, response_mask)
        if hidden is None:  # no prompt repeats, or the shared-prompt forward would not be exact
            hidden = response_hidden(model.base_model, inputs, prompt_len)
        # Outside autocast: the op upcasts each chunk to float32, and its matmuls must stay there.
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            return token_logprobs_from_hidden(hidden, head.weight, response_ids, bias=head.bias,
                                              chunk_size=chunk_size, with_entropy=with_entropy,
                                              temperature=temperature)
    logits = model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                   position_ids=inputs.position_ids, use_cache=False).logits[:, prompt_len - 1:]
    return token_logprobs_from_logits(logits, response_ids, chunk_size=chunk_size, with_entropy=with_entropy,
                                      temperature=temperature)


def _packed_log_probs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      response_ids: torch.Tensor, response_mask: torch.Tensor, *, temperature: float,
                      chunk_size: int, with_entropy: bool) -> TokenLogProbs:
    """:func:`response_log_probs` on the packed rows: ``(M,)`` valid states -> ``(b, R)``, zeros at padding."""
    packed = pack_rows(prompt_ids, prompt_mask, response_ids, response_mask)
    targets = response_ids.long()[packed.rows, packed.cols][None]  # (1, M)
    head = plain_lm_head(model)
    if head is not None and hasattr(model, "base_model") and model.base_model is not model:
        hidden = packed_hidden(model.base_model, packed)[None]  # (1, M, h)
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            out = token_logprobs_from_hidden(hidden, head.weight, targets, bias=head.bias, chunk_size=chunk_size,
                                             with_entropy=with_entropy, temperature=temperature)
    else:
        out = token_logprobs_from_logits(packed_logits(model, packed)[None], targets, chunk_size=chunk_size,
                                         with_entropy=with_entropy, temperature=temperature)
    entropy = unpack(out.entropy[0], packed) if out.entropy is not None else None
    return TokenLogProbs(unpack(out.log_probs[0], packed), entropy)
