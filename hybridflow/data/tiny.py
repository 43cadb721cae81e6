"""Tiny causal language models and tokenizers made in code, for tests and CPU examples.

Nothing here touches the network: the tokenizer is built from an alphabet with
the ``tokenizers`` library, the model from a transformers config with random
weights. :func:`create_tiny_model_dir` writes both as an ordinary transformers
folder, which :func:`hybridflow.data.load_causal_lm` (or plain
``AutoModelForCausalLM.from_pretrained``) loads like any model from the hub.

The tokenizer is character level: every character of the alphabet is one
token, so ``"12+7="`` is five tokens and answers are spelled digit by digit.
Token ids are fixed by position: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2,
``<unk>`` 3, the chat role markers next, then the alphabet in the order given.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from ..errors import ConfigError

__all__ = [
    "PAD_TOKEN",
    "BOS_TOKEN",
    "EOS_TOKEN",
    "UNK_TOKEN",
    "ROLE_TOKENS",
    "CHAT_TEMPLATE",
    "make_tiny_tokenizer",
    "make_tiny_model",
    "save_tiny",
    "create_tiny_model_dir",
    "BENCH_MODELS",
    "bench_model_shape",
]

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<bos>", "<eos>", "<unk>"
#: one special token per chat role, so a role marker is a single token
ROLE_TOKENS: tuple[str, ...] = ("<system>", "<user>", "<assistant>")

#: ``<bos><user>3+4=<eos><assistant>`` for one user message and a generation prompt
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<' + message['role'] + '>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant>' }}{% endif %}"
)


BENCH_MODELS: Mapping[str, Mapping[str, int]] = {
    # the built-in task's model (``hybridflow quickstart``, the learning tests): ~0.1M parameters
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2),
    # ~7.9M parameters: the rollout and TRL benches' mid size
    "10m": dict(hidden=256, layers=8, heads=8, kv_heads=4, intermediate=1024),
    # ~104M parameters, GPT-2-small's width and depth with grouped-query attention (12 query, 4 KV heads)
    "100m": dict(hidden=768, layers=12, heads=12, kv_heads=4, intermediate=3072, max_positions=2048),
}
"""The standard bench models, by name: keyword arguments of :func:`make_tiny_model` (a character-level
vocabulary adds only ~25 x hidden x 2 embedding parameters). Benches and tools take ``--size`` from here."""


def bench_model_shape(size: str) -> dict[str, int]:
    """The :func:`make_tiny_model` keyword arguments of the bench model ``size`` (a key of :data:`BENCH_MODELS`)."""
    if size not in BENCH_MODELS:
        raise ConfigError(f"unknown bench model size {size!r}; choose one of {sorted(BENCH_MODELS)}")
    return dict(BENCH_MODELS[size])


def _alphabet_for(task: str, alphabet: str | None) -> str:
    if alphabet is not None:
        return alphabet
    from .tasks import task_alphabet

    return task_alphabet(task)


def _unique_chars(alphabet: str) -> list[str]:
    """The alphabet's characters in first-seen order, duplicates dropped."""
    return list(dict.fromkeys(alphabet))


def make_tiny_tokenizer(task: str = "arithmetic", *, alphabet: str | None = None, add_bos: bool = True):
    """A character-level ``PreTrainedTokenizerFast`` over a task's alphabet.

    Args:
        task: a name in ``hybridflow.data.tasks.TASKS`` (``"arithmetic"``:
            digits, ``+ - * / = ( )`` and space; ``"countdown"``: printable ASCII).
        alphabet: the characters to use instead of the task's; any character
            outside it encodes as ``<unk>``.
        add_bos: prepend ``<bos>`` when encoding with ``add_special_tokens=True``.

    Special tokens: ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2), ``<unk>`` (3),
    and the chat roles ``<system>``, ``<user>``, ``<assistant>``; the chat
    template is :data:`CHAT_TEMPLATE`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, *ROLE_TOKENS]
    chars = [c for c in _unique_chars(_alphabet_for(task, alphabet)) if c not in specials]
    if not chars:
        raise ConfigError("make_tiny_tokenizer: the alphabet is empty; give at least one character.")
    vocab = {token: i for i, token in enumerate(specials + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    core.decoder = decoders.Fuse()  # join characters back without separators
    core.add_special_tokens(specials)
    if add_bos:
        bos = (BOS_TOKEN, vocab[BOS_TOKEN])
        core.post_processor = processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[bos]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=4096,
    )


def _config_classes() -> Mapping[str, type]:
    from transformers import LlamaConfig, Qwen2Config

    return {"qwen2": Qwen2Config, "llama": LlamaConfig}


def make_tiny_model(
    arch: str = "qwen2",
    *,
    vocab_size: int,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    max_positions: int = 512,
    tie_embeddings: bool = False,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    seed: int = 0,
):
    """A randomly initialised causal LM of the ``qwen2`` or ``llama`` architecture.

    The same arguments and ``seed`` give identical weights; the global torch RNG
    is left as it was. The defaults (hidden 128, 2 layers, 4 heads, 2 KV heads,
    MLP 4x hidden) make about half a million parameters for a vocabulary of 25.
    ``pad/bos/eos`` ids go into both the config and the generation config.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    classes = _config_classes()
    if arch not in classes:
        raise ConfigError(f"make_tiny_model: unknown arch {arch!r}; choose one of {sorted(classes)}.")
    if hidden % heads or heads % kv_heads:
        raise ConfigError(
            f"make_tiny_model: hidden ({hidden}) must be divisible by heads ({heads}), "
            f"and heads by kv_heads ({kv_heads})."
        )
    special_ids = dict(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    config = classes[arch](
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_embeddings,
        **special_ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(**special_ids)
    return model


def save_tiny(path: str | Path, model, tokenizer) -> Path:
    """Write ``model`` and ``tokenizer`` as a transformers folder at ``path``; returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def create_tiny_model_dir(
    path: str | Path,
    task: str = "arithmetic",
    *,
    arch: str = "qwen2",
    seed: int = 0,
    alphabet: str | None = None,
    **model_kwargs,
) -> Path:
    """Build a tiny tokenizer for ``task`` and a matching tiny model, and save both at ``path``.

    ``model_kwargs`` go to :func:`make_tiny_model` (hidden, layers, heads, ...).
    The folder loads with ``AutoModelForCausalLM.from_pretrained(path)`` and with
    :func:`hybridflow.data.load_tokenizer` / :func:`hybridflow.data.load_causal_lm`.
    Load the tokenizer with :func:`~hybridflow.data.load_tokenizer` (or
    ``PreTrainedTokenizerFast.from_pretrained``): transformers 5 ``AutoTokenizer``
    replaces it with Qwen's byte-level tokenizer when ``arch="qwen2"``, whatever
    ``tokenizer_config.json`` says (it is faithful for ``"llama"``).
    """
    tokenizer = make_tiny_tokenizer(task, alphabet=alphabet)
    model = make_tiny_model(
        arch,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        seed=seed,
        **model_kwargs,
    )
    return save_tiny(path, model, tokenizer)
