"""Tiny models and tokenizers: ids, determinism, save/load through transformers, generation."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.data import (
    bench_model_shape,
    create_tiny_model_dir,
    load_causal_lm,
    load_tokenizer,
    make_tiny_model,
    make_tiny_tokenizer,
    tokenize_prompts,
)
from hybridflow.data.tasks import countdown
from hybridflow.errors import ConfigError

torch.set_num_threads(1)
ARCHS = ("qwen2", "llama")
SMALL = dict(hidden=32, layers=1, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {arch: create_tiny_model_dir(root / arch, arch=arch, seed=7) for arch in ARCHS}


def test_arithmetic_tokenizer_ids_by_hand():
    tok = make_tiny_tokenizer("arithmetic")
    # ids: <pad> 0, <bos> 1, <eos> 2, <unk> 3, <system> 4, <user> 5, <assistant> 6,
    # then the alphabet "0123456789+-*/=() ": '0' 7 ... '9' 16, '+' 17, '=' 21, ' ' 24
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 25
    assert tok("1 + 2=")["input_ids"] == [1, 8, 24, 17, 24, 9, 21]
    assert tok("1+x", add_special_tokens=False)["input_ids"] == [8, 17, 3]  # 'x' is not in the alphabet
    assert tok("12=<eos>", add_special_tokens=False)["input_ids"] == [8, 9, 21, 2]
    assert tok.decode([1, 8, 24, 17, 24, 9, 21, 2], skip_special_tokens=True) == "1 + 2="


def test_chat_template_by_hand():
    tok = make_tiny_tokenizer("arithmetic")
    text = tok.apply_chat_template([{"role": "user", "content": "3+4="}], tokenize=False, add_generation_prompt=True)
    assert text == "<bos><user>3+4=<eos><assistant>"
    # <bos> 1, <user> 5, '3' 10, '+' 17, '4' 11, '=' 21, <eos> 2, <assistant> 6
    assert tok(text, add_special_tokens=False)["input_ids"] == [1, 5, 10, 17, 11, 21, 2, 6]


def test_custom_alphabet_and_unknown_task():
    tok = make_tiny_tokenizer(alphabet="ab a", add_bos=False)
    assert len(tok) == 7 + 3 and tok("ba b")["input_ids"] == [8, 7, 9, 8]
    with pytest.raises(ConfigError, match="unknown task 'poetry'"):
        make_tiny_tokenizer("poetry")


def test_countdown_tokenizer_covers_its_prompts():
    tok = make_tiny_tokenizer("countdown")
    for row in countdown.make_countdown_rows(5, seed=1):
        ids = tok(row["prompt"])["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == row["prompt"]


@pytest.mark.parametrize("arch", ARCHS)
def test_same_seed_same_weights_other_seed_other_weights(arch):
    before = torch.random.get_rng_state()
    a = make_tiny_model(arch, vocab_size=25, seed=3, **SMALL).state_dict()
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is left alone
    b = make_tiny_model(arch, vocab_size=25, seed=3, **SMALL).state_dict()
    c = make_tiny_model(arch, vocab_size=25, seed=4, **SMALL).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].dim() == 2)


@pytest.mark.parametrize("arch", ARCHS)
def test_default_size_and_special_ids(arch, model_dirs):
    model = load_causal_lm(model_dirs[arch])
    n_params = sum(p.numel() for p in model.parameters())
    assert 1e5 < n_params < 5e6
    assert model.config.model_type == arch
    for cfg in (model.config, model.generation_config):
        assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)


@pytest.mark.parametrize("arch", ARCHS)
def test_saved_folder_loads_with_identical_weights_and_logits(arch, model_dirs, tmp_path):
    fresh = make_tiny_model(arch, vocab_size=25, seed=7)  # what create_tiny_model_dir built
    loaded = AutoModelForCausalLM.from_pretrained(model_dirs[arch])
    ours = load_causal_lm(model_dirs[arch], dtype="float32")
    want = fresh.state_dict()
    for model in (loaded, ours):
        got = model.state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    ids = torch.tensor([[1, 8, 17, 9, 21], [1, 16, 17, 16, 21]])
    with torch.no_grad():
        expected = fresh.eval()(ids).logits
        assert torch.equal(loaded.eval()(ids).logits, expected)
        assert torch.equal(ours.eval()(ids).logits, expected)


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_round_trips_through_the_project_loader(arch, model_dirs):
    made, tok = make_tiny_tokenizer("arithmetic"), load_tokenizer(model_dirs[arch])
    for text in ["1 + 2 = 3", "  12*(3-4) =", "7+7=<eos>", "9/3= 3<pad>"]:
        assert tok(text)["input_ids"] == made(text)["input_ids"]
        assert tok.decode(tok(text)["input_ids"]) == "<bos>" + text  # spaces survive
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.padding_side == "left" and len(tok) == len(made)
    assert tok.apply_chat_template([{"role": "user", "content": "1 + 1="}], tokenize=False,
                                   add_generation_prompt=True) == "<bos><user>1 + 1=<eos><assistant>"


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_a_few_tokens(arch, model_dirs):
    tok, model = load_tokenizer(model_dirs[arch]), load_causal_lm(model_dirs[arch])
    ids, mask = tokenize_prompts(tok, ["1+2=", "12+34="])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
    assert ids.shape[1] < out.shape[1] <= ids.shape[1] + 3
    assert torch.equal(out[:, : ids.shape[1]], ids)
    assert int(out.max()) < len(tok)


def test_create_tiny_model_dir_takes_model_options(tmp_path):
    path = create_tiny_model_dir(tmp_path / "m", task="countdown", arch="llama", seed=1, hidden=64, layers=1)
    model = load_causal_lm(path)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 1
    assert model.config.vocab_size == len(load_tokenizer(path)) == len(make_tiny_tokenizer("countdown"))


def test_bad_model_options_raise_config_errors():
    with pytest.raises(ConfigError, match="unknown arch 'gpt9'"):
        make_tiny_model("gpt9", vocab_size=10)
    with pytest.raises(ConfigError, match="divisible"):
        make_tiny_model("qwen2", vocab_size=10, hidden=30, heads=4)


@pytest.mark.parametrize("size, low, high", [("tiny", 0.1e6, 0.2e6), ("10m", 7e6, 9e6), ("100m", 95e6, 110e6)])
def test_bench_models_have_their_advertised_sizes(size, low, high):
    # built on the meta device: the shape is what is checked, and no 400 MB of weights is made
    with torch.device("meta"):
        model = make_tiny_model("qwen2", vocab_size=len(make_tiny_tokenizer("arithmetic")), **bench_model_shape(size))
    params = sum(p.numel() for p in model.parameters())
    assert low <= params <= high, (size, params)
    config = model.config
    assert config.hidden_size % config.num_attention_heads == 0
    assert config.num_attention_heads % config.num_key_value_heads == 0


def test_unknown_bench_model_names_the_sizes():
    with pytest.raises(ConfigError, match="100m"):
        bench_model_shape("1b")
