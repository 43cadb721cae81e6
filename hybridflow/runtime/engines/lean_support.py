"""Which models the lean paths drive exactly: Llama-family decoders with no hooks and no position-dependent rotary.

:mod:`.lean_decode` (the decode's one-token forward) and :mod:`.lean_forward` (the train forward) run the same
arithmetic as the model's own forward on its weights and submodules; where a model's settings or hooks would make
that arithmetic differ from its forward, :func:`supports_lean` and :func:`supports_lean_backbone` say no and the
callers run the model's forward.
"""
from __future__ import annotations

import torch

__all__ = ["LEAN_MODEL_TYPES", "supports_lean", "supports_lean_backbone"]

LEAN_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})
"""``config.model_type`` values whose decoder layers have the structure driven here."""

_POSITION_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})
"""Rotary types whose tables change with the sequence length a forward sees (the lean path computes them once)."""

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def supports_lean(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a Llama-family causal LM this path drives exactly (else: the transformers loop)."""
    config = getattr(model, "config", None)
    if config is None or any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return False
    backbone, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if backbone is None or not isinstance(head, torch.nn.Linear):
        return False
    if any(m._forward_hooks or m._forward_pre_hooks for m in (model, head)):
        return False  # a hook changes what the model's forward computes: only the forward itself is exact
    return supports_lean_backbone(backbone)  # the backbone's modules and the global hooks


def supports_lean_backbone(backbone: torch.nn.Module) -> bool:
    """Whether ``backbone`` (a Llama-family base model: ``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``) has
    the structure and settings the lean paths drive exactly (:mod:`.lean_forward` too), and no hooks."""
    config = getattr(backbone, "config", None)
    if config is None or getattr(config, "model_type", None) not in LEAN_MODEL_TYPES:
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False  # sliding-window layers
    if getattr(config, "use_sliding_window", False) or getattr(config, "pretraining_tp", 1) not in (None, 1):
        return False
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if not all(hasattr(backbone, name) for name in needed):
        return False
    if getattr(backbone.rotary_emb, "rope_type", "default") in _POSITION_DEPENDENT_ROPE:
        return False  # its frequencies depend on the longest position of a call: only the model's own loop matches
    if _has_hooks(backbone):
        return False  # a hook changes what the model's forward computes: only the forward itself is exact
    layer = backbone.layers[0]
    norms = (layer.input_layernorm, layer.post_attention_layernorm, backbone.norm)
    if not all(hasattr(norm, "weight") and hasattr(norm, "variance_epsilon") for norm in norms):
        return False
    # every layer's projections plain Linear modules (an adapter such as a LoRA layer on any of them: the forward)
    projections = [getattr(each.self_attn, name, None) for each in backbone.layers
                   for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    return all(isinstance(p, torch.nn.Linear) for p in projections) and all(
        hasattr(layer.self_attn, name) for name in ("head_dim", "scaling"))


def _has_hooks(model: torch.nn.Module) -> bool:
    """Whether a forward (pre-)hook is registered on the model, a submodule, or globally."""
    from torch.nn.modules import module as nn_module

    if getattr(nn_module, "_global_forward_hooks", None) or getattr(nn_module, "_global_forward_pre_hooks", None):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
