"""Model shapes for the cost model: parameter counts and the sizes that set FLOPs, memory and KV cache.

:class:`ModelSpec` describes a decoder-only transformer of the Llama / Qwen2
family: token embedding, ``layers`` blocks of (RMSNorm, attention with grouped
query heads, RMSNorm, gated MLP), a final RMSNorm and an LM head that is either
tied to the embedding or separate. ``params`` is computed from those sizes
(:func:`count_params`) unless given, and agrees with ``num_parameters()`` of the
transformers model built from the same config (tested).

Presets are entered by hand from the published ``config.json`` files (no
download): Llama-2 7B/13B/70B (meta-llama/Llama-2-*-hf), CodeLlama-34B (the
34B shape of the Llama-2 family, codellama/CodeLlama-34b-hf) and Qwen2.5
0.5B-72B (Qwen/Qwen2.5-*).
"""
from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError

__all__ = ["ModelSpec", "MODEL_PRESETS", "count_params", "lora_adapter_params", "LORA_ALL_LINEAR"]

LORA_ALL_LINEAR = "all-linear"
"""LoRA target shorthand: every linear layer of the blocks (q, k, v, o, gate, up, down), not the LM head."""


class ModelSpec(BaseModel):
    """A decoder-only transformer's sizes (Llama / Qwen2 family)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Preset or user name.")
    layers: int = Field(ge=1, description="Transformer blocks (num_hidden_layers).")
    hidden: int = Field(ge=1, description="Model width (hidden_size).")
    heads: int = Field(ge=1, description="Attention (query) heads.")
    kv_heads: int = Field(ge=1, description="Key/value heads (grouped-query attention); = heads for multi-head attention.")
    head_dim: int = Field(default=0, ge=0, description="Width of one head; 0 means hidden // heads.")
    intermediate: int = Field(ge=1, description="Gated-MLP inner width (intermediate_size).")
    vocab: int = Field(ge=1, description="Vocabulary size.")
    tie_embeddings: bool = Field(default=False, description="LM head shares the input embedding matrix.")
    qkv_bias: bool = Field(default=False, description="q/k/v projections have a bias (Qwen2; Llama with attention_bias).")
    o_bias: bool = Field(default=False, description="Attention output projection has a bias (Llama with attention_bias).")
    mlp_bias: bool = Field(default=False, description="MLP projections have biases (Llama with mlp_bias).")
    params: int = Field(default=0, ge=0, description="Total parameters; 0 means computed by count_params.")
    adapter_params: int = Field(default=0, ge=0, description="LoRA adapter parameters added to the model (lora_adapter_params); 0: no adapters, every parameter trains. With adapters only they train (gradients, Adam state, weight syncs); the base weights are frozen.")

    def model_post_init(self, context: Any) -> None:
        """Fill head_dim and params; checks raise ConfigError (not wrapped by pydantic, unlike validators)."""
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ConfigError(f"model {self.name!r}: hidden {self.hidden} is not divisible by heads {self.heads}; give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name!r}: heads {self.heads} must be a multiple of kv_heads {self.kv_heads}")
        if self.params == 0:
            object.__setattr__(self, "params", count_params(self))

    # ----------------------------------------------------------------- sizes
    @property
    def embedding_params(self) -> int:
        """Input embedding table: vocab x hidden."""
        return self.vocab * self.hidden

    @property
    def layer_params(self) -> int:
        """Parameters of one block (attention + MLP + two norms)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        attn += (q + 2 * kv) * self.qkv_bias + self.hidden * self.o_bias
        mlp = 3 * self.hidden * self.intermediate + (2 * self.intermediate + self.hidden) * self.mlp_bias
        return attn + mlp + 2 * self.hidden

    @property
    def flop_params(self) -> int:
        """Parameters that take part in matmuls: all but the input embedding (a lookup, no FLOPs).

        With tied embeddings the table is used once as the LM head, so it counts.
        """
        return self.params if self.tie_embeddings else self.params - self.embedding_params

    @property
    def trainable_params(self) -> int:
        """Parameters that train and that a weight sync sends: the LoRA adapters when there are any, else all."""
        return self.adapter_params or self.params

    def with_lora(self, rank: int, targets: str | tuple[str, ...] | list[str] = LORA_ALL_LINEAR) -> "ModelSpec":
        """This model with LoRA adapters of ``rank`` on ``targets`` (rank 0: without adapters)."""
        return self.model_copy(update={"adapter_params": lora_adapter_params(self, rank, targets) if rank else 0})

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache per token: 2 (K and V) x layers x kv_heads x head_dim x dtype_bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    # ----------------------------------------------------------------- constructors
    @classmethod
    def preset(cls, name: str) -> "ModelSpec":
        """A hand-entered preset by name (case-insensitive), e.g. ``"llama2-70b"``, ``"qwen2.5-7b"``."""
        key = name.lower()
        if key not in MODEL_PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(MODEL_PRESETS)}")
        return MODEL_PRESETS[key]

    @classmethod
    def from_config(cls, config: Any, name: str | None = None) -> "ModelSpec":
        """Read sizes from a transformers ``PretrainedConfig`` or a ``config.json``-style dict.

        A dict with ``model_type`` is first turned into its transformers config
        class (so its defaults, e.g. ``tie_word_embeddings``, apply); a dict
        without it must name every size. Qwen2-family configs get q/k/v biases.
        """
        if isinstance(config, Mapping):
            config = _config_from_dict(dict(config))
        get = (lambda k, d=None: getattr(config, k, d))
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size") if get(k) is None]
        if missing:
            raise ConfigError(f"model config lacks {', '.join(missing)}; give a transformers config of a decoder-only model")
        model_type = get("model_type", "") or ""
        attention_bias = bool(get("attention_bias", False))
        is_qwen2 = model_type.startswith("qwen2")
        return cls(
            name=name or get("_name_or_path") or model_type or "model",
            layers=get("num_hidden_layers"), hidden=get("hidden_size"), heads=get("num_attention_heads"),
            kv_heads=get("num_key_value_heads") or get("num_attention_heads"), head_dim=get("head_dim") or 0,
            intermediate=get("intermediate_size"), vocab=get("vocab_size"),
            tie_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=attention_bias or is_qwen2, o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(get("mlp_bias", False)))


def _config_from_dict(values: dict[str, Any]) -> Any:
    if "model_type" not in values:
        return _Namespace(values)
    from transformers import AutoConfig

    model_type = values.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **values)
    except ValueError as err:
        raise ConfigError(f"model config: transformers does not know model_type {model_type!r} ({err})") from None


class _Namespace:
    def __init__(self, values: dict[str, Any]):
        self.__dict__.update(values)


def count_params(m: ModelSpec) -> int:
    """Parameters of a Llama/Qwen2-style decoder.

    embedding V·h + layers x [attention h·(a·d) + 2·h·(k·d) + (a·d)·h (+ biases)
    + gated MLP 3·h·I (+ biases) + 2 norms 2·h] + final norm h + LM head V·h
    unless tied; a = heads, k = kv_heads, d = head_dim, I = intermediate.
    Llama-2-7B: 32000·4096·2 + 32·(4·4096² + 3·4096·11008 + 2·4096) + 4096 = 6,738,415,616.
    """
    head = 0 if m.tie_embeddings else m.vocab * m.hidden
    return m.vocab * m.hidden + m.layers * m.layer_params + m.hidden + head


def _linear_shapes(m: ModelSpec) -> dict[str, tuple[int, int, int]]:
    """LoRA-targetable linear layers: name -> (in features, out features, how many in the model)."""
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    return {"q_proj": (m.hidden, q, m.layers), "k_proj": (m.hidden, kv, m.layers), "v_proj": (m.hidden, kv, m.layers),
            "o_proj": (q, m.hidden, m.layers), "gate_proj": (m.hidden, m.intermediate, m.layers),
            "up_proj": (m.hidden, m.intermediate, m.layers), "down_proj": (m.intermediate, m.hidden, m.layers),
            "lm_head": (m.hidden, m.vocab, 1)}


def lora_adapter_params(m: ModelSpec, rank: int, targets: str | tuple[str, ...] | list[str] = LORA_ALL_LINEAR) -> int:
    """Parameters of LoRA adapters of ``rank`` on the ``targets`` layers: rank·(in + out) per adapted linear layer.

    ``targets``: ``"all-linear"`` (every block's q, k, v, o, gate, up and down projection) or layer names.
    Qwen2.5-7B at rank 16 on all-linear: 28·16·(5·3584 + 2·512 + 2·18944 + 18944 + 3584 + ...) = 40,370,176.
    """
    shapes = _linear_shapes(m)
    names = [n for n in shapes if n != "lm_head"] if targets == LORA_ALL_LINEAR else list(targets)
    unknown = sorted(set(names) - set(shapes))
    if unknown:
        raise ConfigError(f"model {m.name!r}: LoRA targets {unknown} are not linear layers of a Llama/Qwen2 model; "
                          f"use 'all-linear' or some of {', '.join(shapes)}")
    return sum(rank * (shapes[n][0] + shapes[n][1]) * shapes[n][2] for n in dict.fromkeys(names))


def _preset(name: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, tie: bool, qkv_bias: bool) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv, intermediate=inter,
                     vocab=vocab, tie_embeddings=tie, qkv_bias=qkv_bias)


MODEL_PRESETS: dict[str, ModelSpec] = {
    p.name: p
    for p in (
        #        name             layers hidden heads kv  intermediate vocab  tie    qkv_bias
        _preset("llama2-7b",      32,   4096,  32,  32, 11008,       32000,  False, False),
        _preset("llama2-13b",     40,   5120,  40,  40, 13824,       32000,  False, False),
        _preset("codellama-34b",  48,   8192,  64,  8,  22016,       32000,  False, False),
        _preset("llama2-70b",     80,   8192,  64,  8,  28672,       32000,  False, False),
        _preset("qwen2.5-0.5b",   24,   896,   14,  2,  4864,        151936, True,  True),
        _preset("qwen2.5-1.5b",   28,   1536,  12,  2,  8960,        151936, True,  True),
        _preset("qwen2.5-3b",     36,   2048,  16,  2,  11008,       151936, True,  True),
        _preset("qwen2.5-7b",     28,   3584,  28,  4,  18944,       152064, False, True),
        _preset("qwen2.5-14b",    48,   5120,  40,  8,  13824,       152064, False, True),
        _preset("qwen2.5-32b",    64,   5120,  40,  8,  27648,       152064, False, True),
        _preset("qwen2.5-72b",    80,   8192,  64,  8,  29568,       152064, False, True),
    )
}
# The paper's 34B point uses the Llama-2 family's 34B shape, published as CodeLlama-34B.
MODEL_PRESETS["llama2-34b"] = MODEL_PRESETS["codellama-34b"].model_copy(update={"name": "llama2-34b"})
