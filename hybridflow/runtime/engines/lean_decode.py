"""A lean one-token forward for Llama-family decoders: preallocated KV buffers, no per-token framework work.

On tiny models the per-token cost of a transformers forward is mostly Python:
building the causal mask, growing the ``DynamicCache`` by concatenation, the
rotary table, output records and decorators (the issue that asked for this path
measured ~6 of 16 ms of a rollout as arithmetic). :class:`LeanStepper` runs the
same arithmetic on the model's own weights and submodules with none of that:

- the prompts go through the same layer code once (the prefill, causal attention
  over each row's valid tokens), whose keys/values are written, repeated ``n``
  times, into one preallocated buffer per layer of shape ``(B, kv_heads, P + R, head_dim)``;
- the rotary ``cos/sin`` of every position a row will reach are computed once,
  by the model's own rotary module (element-wise, so the same numbers as one
  position at a time);
- the attention mask is one preallocated bool buffer ``(B, P + R)``; step ``t``
  writes column ``P + t`` and attends to the first ``P + t + 1`` columns;
- each layer: the model's ``input_layernorm`` (RMSNorm, the same operations inlined),
  ``q/k/v_proj``, its module's own
  ``apply_rotary_pos_emb``, a write into the buffers, scaled dot-product attention
  over them (grouped-query heads shared, ``scale = head_dim^-0.5`` as the module
  has it), ``o_proj``, residual, ``post_attention_layernorm``, ``mlp``, residual;
  then the model's final ``norm`` and ``lm_head``.

So the numbers are the model's up to float summation order (the reference test
compares tokens and log-probs with the transformers loop). Models it does not
cover (other architectures, sliding-window layers, logit scaling, forward hooks) make :func:`lean_stepper` return None and the caller uses the
transformers loop.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from .sequence import position_ids_from_mask

__all__ = ["LEAN_MODEL_TYPES", "LeanStepper", "lean_stepper", "supports_lean"]

LEAN_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})
"""``config.model_type`` values whose decoder layers have the structure driven here."""

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def supports_lean(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a Llama-family causal LM this path drives exactly (else: the transformers loop)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in LEAN_MODEL_TYPES:
        return False
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False  # sliding-window layers
    if getattr(config, "use_sliding_window", False) or getattr(config, "pretraining_tp", 1) not in (None, 1):
        return False
    if _has_hooks(model):
        return False  # a hook changes what the model's forward computes: only the forward itself is exact
    backbone = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if backbone is None or not all(hasattr(backbone, name) for name in needed) or not hasattr(model, "lm_head"):
        return False
    layer = backbone.layers[0]
    norms = (layer.input_layernorm, layer.post_attention_layernorm, backbone.norm)
    if not all(hasattr(norm, "weight") and hasattr(norm, "variance_epsilon") for norm in norms):
        return False
    projections = [getattr(layer.self_attn, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    return all(isinstance(p, torch.nn.Linear) for p in projections + [model.lm_head]) and all(
        hasattr(layer.self_attn, name) for name in ("head_dim", "scaling"))


def _has_hooks(model: torch.nn.Module) -> bool:
    """Whether a forward (pre-)hook is registered on the model, a submodule, or globally."""
    from torch.nn.modules import module as nn_module

    if getattr(nn_module, "_global_forward_hooks", None) or getattr(nn_module, "_global_forward_pre_hooks", None):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


class LeanStepper:
    """Prefill and one-token forward of a decode loop on preallocated buffers (see the module docstring).

    Args:
        model: a causal LM for which :func:`supports_lean` holds.
        prompt_ids, prompt_mask: ``(b, P)`` left-padded prompts.
        n: decoded rows per prompt (``B = b * n`` rows in ``repeat_interleave`` order).
        steps: the most tokens each row will be fed after the prompt (``max_new_tokens - 1``).

    :attr:`logits` ``(B, V)``: the prefill's logits at each row's last prompt position.
    """

    def __init__(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, steps: int):
        backbone = model.model
        self.layers = backbone.layers
        self.embed = backbone.embed_tokens.weight
        self.rotary = sys.modules[type(self.layers[0].self_attn).__module__].apply_rotary_pos_emb
        attention = self.layers[0].self_attn
        self.head_dim, self.scaling = attention.head_dim, attention.scaling
        self.plan = [(_norm(layer.input_layernorm), _linear(layer.self_attn.q_proj), _linear(layer.self_attn.k_proj),
                      _linear(layer.self_attn.v_proj), _linear(layer.self_attn.o_proj),
                      _norm(layer.post_attention_layernorm), _mlp(layer.mlp)) for layer in self.layers]
        self.final_norm, self.lm_head = _norm(backbone.norm), _linear(model.lm_head)
        self.gqa = attention.config.num_attention_heads != attention.config.num_key_value_heads
        kv_width = attention.config.num_key_value_heads * self.head_dim

        mask = prompt_mask.bool()
        b, p = mask.shape
        rows = torch.arange(b, device=mask.device).repeat_interleave(n)
        self.prompt_len, total = p, p + steps
        self.valid = torch.zeros((b * n, total), dtype=torch.bool, device=mask.device)
        self.valid[:, :p] = mask[rows]
        weight = self.plan[0][2][0]
        shape = (b * n, kv_width // self.head_dim, total, self.head_dim)
        self.keys = [weight.new_empty(shape) for _ in self.layers]
        self.values = [weight.new_empty(shape) for _ in self.layers]
        prompt_positions = position_ids_from_mask(mask)
        positions = prompt_positions[rows, -1:] + 1 + torch.arange(max(steps, 1), device=mask.device)
        probe = self.embed[:1, None].expand(b * n, -1, -1)
        self.cos, self.sin = backbone.rotary_emb(probe, positions)
        prompt_cos, prompt_sin = backbone.rotary_emb(probe[:b], prompt_positions)
        # Prefill: a query attends to the valid keys up to itself; a padding query (nothing valid
        # before it) to every key up to itself, so that its state stays finite. No later query
        # attends to a padding key, so what padding positions hold changes nothing.
        causal = torch.ones((p, p), dtype=torch.bool, device=mask.device).tril()
        allowed = causal & (mask[:, None, :] | ~mask[:, :, None])
        self.logits = self._forward(prompt_ids.long(), allowed[:, None], prompt_cos, prompt_sin, 0, p, rows)[rows]

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                 stop: int, rows: torch.Tensor | None) -> torch.Tensor:
        """Positions ``start:stop`` of every row through the layers -> the last position's logits ``(b, V)``.

        ``rows`` (prefill): the buffer rows each input row's keys/values are copied to; None: row for row.
        """
        h = F.embedding(ids, self.embed)
        b, q_len, d = h.shape[0], h.shape[1], self.head_dim
        for (norm1, q_proj, k_proj, v_proj, o_proj, norm2, mlp), kb, vb in zip(self.plan, self.keys, self.values):
            x = _rms_norm(h, *norm1)
            q = F.linear(x, *q_proj).view(b, q_len, -1, d).transpose(1, 2)
            k = F.linear(x, *k_proj).view(b, q_len, -1, d).transpose(1, 2)
            v = F.linear(x, *v_proj).view(b, q_len, -1, d).transpose(1, 2)
            q, k = self.rotary(q, k, cos, sin)
            if rows is None:
                kb[:, :, start:stop] = k
                vb[:, :, start:stop] = v
                keys, values = kb[:, :, :stop], vb[:, :, :stop]
            else:
                kb[:, :, start:stop] = k[rows]
                vb[:, :, start:stop] = v[rows]
                keys, values = k, v
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=self.gqa)
            h = h + F.linear(out.transpose(1, 2).reshape(b, q_len, -1), *o_proj)
            h = h + mlp(_rms_norm(h, *norm2))
        return F.linear(_rms_norm(h[:, -1], *self.final_norm), *self.lm_head)

    def step(self, t: int, token: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
        """Feed ``token`` ``(B,)`` as step ``t``'s input (``alive``: rows attended from now on) -> logits ``(B, V)``."""
        slot = self.prompt_len + t
        self.valid[:, slot] = alive
        return self._forward(token[:, None], self.valid[:, None, None, :slot + 1], self.cos[:, t:t + 1],
                             self.sin[:, t:t + 1], slot, slot + 1, None)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm, the same operations in the same order: ``w * (x / sqrt(mean(x^2) + eps))``, in float32."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _linear(module: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module.weight, module.bias


def _norm(module: torch.nn.Module) -> tuple[torch.Tensor, float]:
    return module.weight, float(module.variance_epsilon)


def _mlp(module: torch.nn.Module):
    """The gated MLP ``down(act(gate(x)) * up(x))`` on the module's weights (SiLU inlined), or the module itself."""
    if not all(isinstance(getattr(module, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
        return module
    gate, up, down = _linear(module.gate_proj), _linear(module.up_proj), _linear(module.down_proj)
    act = F.silu if type(getattr(module, "act_fn", None)).__name__ == "SiLUActivation" else module.act_fn
    return lambda x: F.linear(act(F.linear(x, *gate)) * F.linear(x, *up), *down)


def lean_stepper(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int,
                 steps: int) -> LeanStepper | None:
    """A :class:`LeanStepper` (prefill done) when the model is one this path drives, else None."""
    if not supports_lean(model):
        return None
    return LeanStepper(model, prompt_ids, prompt_mask, n, steps)
