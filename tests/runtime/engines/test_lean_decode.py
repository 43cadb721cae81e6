"""The lean decode path (runtime/engines/lean_decode.py) against the transformers loop it replaces.

Reference: ``decode(..., path="hf")``, the model's own forward with a ``DynamicCache`` one token
at a time. Same generator seed -> the same tokens and masks, and log-probs within float32
tolerance, over prompt lengths, left padding, EOS in the middle, n > 1, sampling settings and
both Llama-family architectures of hybridflow.data.tiny; other models fall back to the reference.
Also against transformers' own ``generate`` (greedy tokens) and full forward (log-probs), and after
an optimizer step and a weight load (the fused q/k/v and gate/up weights follow the model's).
"""
from __future__ import annotations

import pytest
import torch

from hybridflow.data.tiny import make_tiny_model
from hybridflow.errors import ExecutionError
from hybridflow.runtime.engines import lean_decode
from hybridflow.runtime.engines.decode import decode
from hybridflow.runtime.engines.lean_decode import supports_lean
from hybridflow.runtime.engines.sampling import SamplingParams

VOCAB, EOS, PAD = 24, 2, 0


def _model(arch: str, **shape):
    return make_tiny_model(arch, vocab_size=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, seed=3, **shape).eval()


def _prompts(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of the given lengths (token ids 4.. so no prompt token is EOS or pad)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(4, VOCAB, (n,), generator=g)
        mask[row, width - n:] = 1
    return ids, mask


def _both(model, ids, mask, params, seed=0):
    out = {}
    for path in ("hf", "lean"):
        gen = torch.Generator().manual_seed(seed)
        out[path] = decode(model, ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD, generator=gen, path=path)
    return out["hf"], out["lean"]


def _assert_same(ref, lean):
    assert torch.equal(ref.response_ids, lean.response_ids)
    assert torch.equal(ref.response_mask, lean.response_mask)
    torch.testing.assert_close(lean.log_probs, ref.log_probs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("lengths", [[1], [5, 5, 5], [1, 4, 9], [9, 2, 6, 3]])
@pytest.mark.parametrize("n", [1, 4])
def test_same_tokens_and_log_probs_as_the_transformers_loop(arch, lengths, n):
    model = _model(arch)
    assert supports_lean(model)
    ids, mask = _prompts(lengths, seed=len(lengths) + n)
    ref, lean = _both(model, ids, mask, SamplingParams(n=n, max_new_tokens=24), seed=n)
    _assert_same(ref, lean)
    assert ref.response_ids.shape == (len(lengths) * n, 24)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_layers_run_side_by_side_without_joined_weights_decode_alike(arch, monkeypatch):
    # above JOIN_LIMIT (here: always) q/k/v and gate/up write their columns of one output, with no weight copy
    monkeypatch.setattr(lean_decode, "JOIN_LIMIT", 0)
    model = _model(arch)
    ids, mask = _prompts([1, 4, 9], seed=7)
    ref, lean = _both(model, ids, mask, SamplingParams(n=4, max_new_tokens=24), seed=4)
    _assert_same(ref, lean)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("join_limit", [1 << 20, 0], ids=["joined", "side-by-side"])
def test_products_on_reordered_weights_decode_alike(arch, join_limit, monkeypatch):
    # from PACK_MIN weights (here: every one) a product runs on a oneDNN-reordered copy of the weight
    monkeypatch.setattr(lean_decode, "PACK_MIN", 0)
    monkeypatch.setattr(lean_decode, "JOIN_LIMIT", join_limit)
    model = _model(arch)
    ids, mask = _prompts([1, 4, 9], seed=7)
    ref, lean = _both(model, ids, mask, SamplingParams(n=4, max_new_tokens=24), seed=4)
    _assert_same(ref, lean)


def test_eos_in_the_middle_and_finished_rows_padded():
    model = _model("qwen2")
    ids, mask = _prompts([3, 7, 2, 5, 6, 4, 1, 8], seed=5)
    ref, lean = _both(model, ids, mask, SamplingParams(n=3, max_new_tokens=30), seed=11)
    _assert_same(ref, lean)
    lengths = ref.response_mask.sum(-1)
    assert ((lengths > 1) & (lengths < 30)).any(), "the case needs responses that end at an EOS mid-way"
    assert (lengths == 30).any(), "and some that run to the limit"
    ended = ref.response_ids[torch.arange(len(lengths)), (lengths.long() - 1).clamp(min=0)]
    assert torch.isin(ended[lengths < 30], torch.tensor([EOS, PAD])).all()


@pytest.mark.parametrize("params", [
    SamplingParams(n=2, max_new_tokens=12, temperature=0.7),
    SamplingParams(n=2, max_new_tokens=12, top_k=5, top_p=0.8),
    SamplingParams(n=1, max_new_tokens=12, greedy=True),
    SamplingParams(n=3, max_new_tokens=12, stop_at_eos=False),
    SamplingParams(n=2, max_new_tokens=1),
])
def test_sampling_settings(params):
    model = _model("llama", tie_embeddings=True)
    ids, mask = _prompts([2, 6, 4], seed=2)
    _assert_same(*_both(model, ids, mask, params, seed=4))


def test_successive_calls_continue_the_generator_alike():
    model = _model("qwen2")
    ids, mask = _prompts([3, 5], seed=1)
    params = SamplingParams(n=2, max_new_tokens=8)
    outs = {}
    for path in ("hf", "lean"):
        gen = torch.Generator().manual_seed(7)
        outs[path] = [decode(model, ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD, generator=gen, path=path)
                      for _ in range(3)]
    for ref, lean in zip(outs["hf"], outs["lean"]):
        _assert_same(ref, lean)
    assert not torch.equal(outs["hf"][0].response_ids, outs["hf"][1].response_ids)


def test_other_architectures_fall_back_and_lean_only_is_an_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    assert not supports_lean(model)
    ids, mask = _prompts([2, 4])
    params = SamplingParams(n=2, max_new_tokens=6)
    gen = torch.Generator().manual_seed(0)
    auto = decode(model, ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD, generator=gen)
    gen = torch.Generator().manual_seed(0)
    ref = decode(model, ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD, generator=gen, path="hf")
    _assert_same(ref, auto)
    with pytest.raises(ExecutionError, match="lean path"):
        decode(model, ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD, path="lean")
    with pytest.raises(ExecutionError, match="path must be one of"):
        decode(model, ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD, path="fast")


def test_sliding_window_layers_are_not_driven():
    model = _model("qwen2")
    model.config.layer_types = ["sliding_attention"] + list(model.config.layer_types[1:])
    assert not supports_lean(model)


def test_a_forward_hook_sends_decoding_through_the_model_forward():
    model = _model("qwen2")
    handle = model.lm_head.register_forward_hook(lambda module, args, output: output)
    try:
        assert not supports_lean(model)
    finally:
        handle.remove()
    assert supports_lean(model)


def test_the_lean_path_computes_as_in_eval_mode_so_the_engine_keeps_the_train_mode():
    from hybridflow.data.tiny import make_tiny_tokenizer
    from hybridflow.batch import Batch
    from hybridflow.runtime.engines import HFRolloutEngine

    model = _model("qwen2")
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5  # would change the model's own forward in train mode
    ids, mask = _prompts([3, 6], seed=9)
    params = SamplingParams(n=2, max_new_tokens=10)
    ref = decode(model.eval(), ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD,
                 generator=torch.Generator().manual_seed(0), path="hf")
    model.train()
    lean = decode(model, ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD,
                  generator=torch.Generator().manual_seed(0), path="lean")
    _assert_same(ref, lean)
    engine = HFRolloutEngine(model, tokenizer=make_tiny_tokenizer(), eos_token_ids=EOS, pad_token_id=PAD)
    out = engine.generate(Batch({"prompt_ids": ids, "prompt_mask": mask}, batch_size=2), params.model_copy(update={"seed": 0}))
    assert model.training  # no switch to eval and back: nothing in the lean path depends on the mode
    assert torch.equal(out["response_ids"], ref.response_ids)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_tokens_are_transformers_generate_and_log_probs_its_forward(arch):
    """The lean path against transformers' own ``generate`` (greedy tokens) and a full forward (log-probs).

    ``generate`` stops a row at EOS and, as our loop does, at a sampled pad token (both passed as
    its EOS ids), then fills with the pad id. The full forward runs prompt + response in one call
    with position ids ``cumsum(mask) - 1``; its ``log_softmax`` at each response token is what
    the decode loop recorded.
    """
    model = _model(arch)
    ids, mask = _prompts([2, 7, 4, 5], seed=6)
    steps = 16
    lean = decode(model, ids, mask, SamplingParams(n=1, max_new_tokens=steps, greedy=True), eos_token_ids=[EOS],
                  pad_token_id=PAD, path="lean")
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                         eos_token_id=[EOS, PAD], pad_token_id=PAD)[:, ids.shape[1]:]
    expected = torch.full((len(ids), steps), PAD)
    expected[:, :out.shape[1]] = out
    assert torch.equal(lean.response_ids, expected)

    full_ids = torch.cat([ids, lean.response_ids], dim=1)
    full_mask = torch.cat([mask, lean.response_mask.long()], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=full_ids, attention_mask=full_mask, position_ids=positions).logits
    width = ids.shape[1]
    reference = torch.log_softmax(logits[:, width - 1:-1].float(), -1).gather(-1, lean.response_ids[..., None])[..., 0]
    torch.testing.assert_close(lean.log_probs, reference * lean.response_mask, rtol=1e-5, atol=1e-5)


def test_without_onednn_a_product_is_f_linear(monkeypatch):
    # a torch build without oneDNN: a product at or above PACK_MIN falls back to F.linear, its numbers to the bit
    torch.manual_seed(0)
    layer = torch.nn.Linear(1024, 256)
    x = torch.randn(16, 1, 1024)
    with torch.no_grad():
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        reordered = lean_decode.product(layer, 16)(x)
        torch.testing.assert_close(reordered, expected, rtol=1e-5, atol=1e-5)
        if torch.backends.mkldnn.is_available():  # the case needs a product whose numbers oneDNN changes
            assert not torch.equal(reordered, expected)
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
        assert torch.equal(lean_decode.product(layer, 16)(x), expected)


@pytest.mark.parametrize("join_limit, pack_min", [(1 << 20, 1 << 17), (0, 1 << 17), (1 << 20, 0)],
                         ids=["joined", "side-by-side", "reordered"])
def test_the_fused_weights_follow_an_optimizer_step_and_a_weight_load(join_limit, pack_min, monkeypatch):
    """q/k/v and gate/up are concatenated (or reordered) when a decode call starts, or read in place: a call after
    an update sees the new weights."""
    from hybridflow.runtime.engines import HFRolloutEngine

    monkeypatch.setattr(lean_decode, "JOIN_LIMIT", join_limit)
    monkeypatch.setattr(lean_decode, "PACK_MIN", pack_min)
    model = _model("qwen2")
    ids, mask = _prompts([3, 6, 2], seed=8)
    params = SamplingParams(n=2, max_new_tokens=10)
    before = _both(model, ids, mask, params, seed=1)[1]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    logits = model(input_ids=ids, attention_mask=mask).logits
    logits.logsumexp(-1).mean().backward()
    optimizer.step()
    ref, lean = _both(model, ids, mask, params, seed=1)
    _assert_same(ref, lean)
    assert (lean.log_probs - before.log_probs).abs().max() > 1e-3, "the step must change what the model computes"

    engine = HFRolloutEngine(model, eos_token_ids=EOS, pad_token_id=PAD)
    layer = model.model.layers[0]
    new = {name: torch.randn_like(w) * 0.3 for name, w in model.state_dict().items()
           if name.startswith("model.layers.0.") and name.endswith(("k_proj.weight", "v_proj.bias", "up_proj.weight"))}
    assert engine.load_weights(new) == 3
    assert torch.equal(layer.self_attn.k_proj.weight, new["model.layers.0.self_attn.k_proj.weight"])
    ref2, lean2 = _both(model, ids, mask, params, seed=1)
    _assert_same(ref2, lean2)
    assert (lean2.log_probs - lean.log_probs).abs().max() > 1e-3


def test_rotary_whose_frequencies_follow_the_sequence_length_is_not_driven():
    model = _model("llama")
    model.model.rotary_emb.rope_type = "dynamic"
    assert not supports_lean(model)


# Dropping ended rows from the batch (LeanStepper compaction): rows that end at different steps


def _decode(model, ids, mask, params, seed=0, eos=(EOS,), **kwargs):
    gen = torch.Generator().manual_seed(seed)
    out = decode(model, ids, mask, params, eos_token_ids=list(eos), pad_token_id=PAD, generator=gen, path="lean",
                 **kwargs)
    return out, gen


def test_rows_that_stop_at_different_steps_decode_as_each_row_alone():
    """Greedy: each row of a batch whose rows end at different steps gets the tokens it gets decoded alone.

    This model's greedy answers cycle through a few tokens, so token 21 as the stop token ends nine of
    the twelve rows after 1, 2, 3 or 6 tokens and three never (they run to the limit): the batch is
    compacted more than once, down to :data:`ROW_BLOCK` rows (three going, one ended filling up). Alone, a row is a batch of one (another matmul kernel in the
    last bits): log-probs within float32 tolerance. Against the batch without compaction: to the bit.
    """
    model = _model("qwen2")
    ids, mask = _prompts([3, 7, 2, 5, 6, 4, 1, 8, 5, 3, 6, 2], seed=5)
    params = SamplingParams(n=1, max_new_tokens=24, greedy=True)
    batch, _ = _decode(model, ids, mask, params, eos=(21,))
    lengths = batch.response_mask.sum(-1)
    assert len(set(lengths.tolist())) >= 4 and (lengths == 24).any() and (lengths < 4).sum() >= 4, lengths
    assert batch.row_steps < len(ids) * 23
    for row in range(len(ids)):
        alone, _ = _decode(model, ids[row:row + 1], mask[row:row + 1], params, eos=(21,))
        assert torch.equal(alone.response_ids[0], batch.response_ids[row])
        assert torch.equal(alone.response_mask[0], batch.response_mask[row])
        torch.testing.assert_close(alone.log_probs[0], batch.log_probs[row], rtol=1e-5, atol=1e-5)
    full, _ = _decode(model, ids, mask, params, eos=(21,), compact=False)
    assert torch.equal(full.response_ids, batch.response_ids) and torch.equal(full.log_probs, batch.log_probs)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("params", [SamplingParams(n=2, max_new_tokens=24),
                                    SamplingParams(n=3, max_new_tokens=20, temperature=0.7, top_k=6, top_p=0.9)])
@pytest.mark.parametrize("pack_min", [1 << 17, 0], ids=["linear", "reordered"])
def test_dropping_ended_rows_keeps_the_sampled_tokens_log_probs_and_generator_to_the_bit(arch, params, pack_min,
                                                                                         monkeypatch):
    """Sampled: the rows share one generator, and the sampler still draws for every row at every step, so
    compaction changes no token, no log-prob and not where the generator ends (the next call's draws)."""
    monkeypatch.setattr(lean_decode, "PACK_MIN", pack_min)
    model = _model(arch)
    ids, mask = _prompts([3, 7, 2, 5, 6, 4, 1, 8], seed=5)
    lean, lean_gen = _decode(model, ids, mask, params, seed=11)
    full, full_gen = _decode(model, ids, mask, params, seed=11, compact=False)
    lengths = lean.response_mask.sum(-1)
    assert len(set(lengths.tolist())) >= 5, "the case needs rows that end at many different steps"
    assert lean.row_steps < full.row_steps
    assert torch.equal(lean.response_ids, full.response_ids)
    assert torch.equal(lean.response_mask, full.response_mask)
    assert torch.equal(lean.log_probs, full.log_probs)
    assert torch.equal(lean_gen.get_state(), full_gen.get_state())
    gen = torch.Generator().manual_seed(11)
    ref = decode(model, ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD, generator=gen, path="hf")
    _assert_same(ref, lean)


def test_row_steps_count_only_the_rows_still_going_and_a_minimum():
    """``Decoded.row_steps``: without compaction every row at every step after the first (``B x (steps - 1)``);
    with it fewer, yet at least every row's own steps (a row of ``L`` tokens is fed ``L - 1`` of them)
    and at least :data:`ROW_BLOCK` rows a step. Never compacted: a batch of ROW_BLOCK rows, and one of
    10 (not a multiple of ROW_BLOCK, under 12: its matmuls may round otherwise than a compacted one's)."""
    from hybridflow.runtime.engines.lean_decode import ROW_BLOCK

    model = _model("qwen2")
    ids, mask = _prompts([3, 7, 2, 5, 6, 4, 1, 8], seed=5)
    params = SamplingParams(n=2, max_new_tokens=24)
    lean, _ = _decode(model, ids, mask, params, seed=11)
    full, _ = _decode(model, ids, mask, params, seed=11, compact=False)
    rows, fed = len(ids) * 2, lean.steps - 1
    assert full.row_steps == rows * fed
    lengths = lean.response_mask.sum(-1).long()
    assert int((lengths - 1).sum()) <= lean.row_steps < rows * fed
    assert lean.row_steps >= ROW_BLOCK * fed
    for prompts in (2, 5):
        small, _ = _decode(model, ids[:prompts], mask[:prompts], params, seed=3)
        ends = small.response_mask.sum(-1)
        assert (ends < small.steps / 2).sum() >= prompts, "the case needs half the rows to end early"
        assert small.row_steps == 2 * prompts * (small.steps - 1)


def test_a_cut_compacted_decoding_continues_as_the_uncut_one():
    """Segments: a decoding cut after 6 steps (rows dropped by then) and continued from its carry gives the
    uncut decoding's tokens and log-probs to the bit, and the row-steps of both calls add up to the uncut one's."""
    model = _model("llama")
    ids, mask = _prompts([3, 7, 2, 5, 6, 4, 1, 8], seed=5)
    params = SamplingParams(n=2, max_new_tokens=24)
    whole, _ = _decode(model, ids, mask, params, seed=11)
    gen = torch.Generator().manual_seed(11)
    first = decode(model, ids, mask, params, eos_token_ids=[EOS], pad_token_id=PAD, generator=gen, path="lean",
                   steps=6, capacity=24)
    assert first.carry is not None and first.row_steps < 16 * 5
    rest = decode(model, None, None, params, eos_token_ids=[EOS], pad_token_id=PAD, generator=gen, path="lean",
                  steps=18, done=first.done, carry=first.carry)
    width = rest.steps
    assert torch.equal(torch.cat([first.response_ids, rest.response_ids[:, :width]], 1), whole.response_ids[:, :6 + width])
    assert torch.equal(torch.cat([first.log_probs, rest.log_probs[:, :width]], 1), whole.log_probs[:, :6 + width])
    assert first.row_steps + rest.row_steps == whole.row_steps
