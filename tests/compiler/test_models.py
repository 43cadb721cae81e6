"""ModelSpec: parameter counts against transformers' own models, presets against published sizes."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from hybridflow.compiler.models import MODEL_PRESETS, ModelSpec
from hybridflow.errors import ConfigError


def _built_params(model_cls, config) -> int:
    with torch.device("meta"):  # shapes only, no memory
        return model_cls(config).num_parameters()


TINY_CONFIGS = [
    (LlamaForCausalLM, LlamaConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                                   intermediate_size=96, vocab_size=101)),
    (LlamaForCausalLM, LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                   intermediate_size=80, vocab_size=50, tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    (LlamaForCausalLM, LlamaConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                   head_dim=20, intermediate_size=64, vocab_size=37)),
    (Qwen2ForCausalLM, Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=97, tie_word_embeddings=True)),
    (Qwen2ForCausalLM, Qwen2Config(hidden_size=96, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
                                   intermediate_size=64, vocab_size=211, tie_word_embeddings=False)),
]


@pytest.mark.parametrize("model_cls,config", TINY_CONFIGS)
def test_from_config_matches_num_parameters(model_cls, config):
    assert ModelSpec.from_config(config).params == _built_params(model_cls, config)


def test_from_config_dict_uses_the_model_types_defaults():
    # Qwen2Config defaults tie_word_embeddings to False; the dict names the sizes only.
    values = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 97}
    spec = ModelSpec.from_config(values, name="tiny-qwen")
    assert spec.name == "tiny-qwen" and spec.qkv_bias and not spec.tie_embeddings
    assert spec.params == _built_params(Qwen2ForCausalLM, Qwen2Config(**{k: v for k, v in values.items() if k != "model_type"}))


def test_from_config_rejects_configs_without_sizes():
    with pytest.raises(ConfigError, match="lacks"):
        ModelSpec.from_config({"hidden_size": 8})


@pytest.mark.parametrize("name,expected", [
    # published totals (Hugging Face model cards / safetensors metadata)
    ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320), ("llama2-70b", 68_976_648_192),
    ("codellama-34b", 33_743_970_304), ("qwen2.5-0.5b", 494_032_768), ("qwen2.5-7b", 7_615_616_512),
    ("qwen2.5-72b", 72_706_203_648),
])
def test_presets_have_published_parameter_counts(name, expected):
    assert ModelSpec.preset(name).params == expected


@pytest.mark.parametrize("name", ["llama2-7b", "qwen2.5-1.5b", "qwen2.5-14b"])
def test_presets_agree_with_transformers_models_of_the_same_shape(name):
    spec = ModelSpec.preset(name)
    cls, cfg_cls = (Qwen2ForCausalLM, Qwen2Config) if name.startswith("qwen") else (LlamaForCausalLM, LlamaConfig)
    config = cfg_cls(hidden_size=spec.hidden, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                     num_key_value_heads=spec.kv_heads, intermediate_size=spec.intermediate, vocab_size=spec.vocab,
                     tie_word_embeddings=spec.tie_embeddings)
    assert spec.params == _built_params(cls, config)


def test_sizes_derived_from_the_shape():
    m = ModelSpec.preset("llama2-70b")
    assert m.head_dim == 128
    # KV cache per token: 2 (K, V) x 80 layers x 8 kv heads x 128 x 2 bytes = 327,680
    assert m.kv_bytes_per_token() == 327_680
    # untied: the input embedding (32000 x 8192) does no matmul
    assert m.flop_params == m.params - 32000 * 8192
    assert ModelSpec.preset("qwen2.5-0.5b").flop_params == ModelSpec.preset("qwen2.5-0.5b").params  # tied


def test_every_preset_is_consistent_and_unknown_names_are_rejected():
    for spec in MODEL_PRESETS.values():
        assert spec.heads % spec.kv_heads == 0 and spec.params > 0
    with pytest.raises(ConfigError, match="unknown model preset"):
        ModelSpec.preset("gpt-5")
    with pytest.raises(ValueError, match="multiple of kv_heads"):  # pydantic wraps it in its ValidationError
        ModelSpec(name="bad", layers=1, hidden=8, heads=4, kv_heads=3, intermediate=8, vocab=8)
