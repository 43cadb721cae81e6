"""The decode's tape: an update that takes the decode's products has the states and gradients of one that computes them."""
from __future__ import annotations

import pytest
import torch

from hybridflow.data.tiny import make_tiny_model
from hybridflow.runtime.engines import decode_tape, lean_decode, lean_forward
from hybridflow.runtime.engines.decode import decode
from hybridflow.runtime.engines.lean_forward import lean_shared_hidden
from hybridflow.runtime.engines.sampling import SamplingParams
from hybridflow.runtime.engines.sequence import join_prompt_response, response_hidden
from hybridflow.runtime.engines.shared_prompt import prompt_groups, shared_response_hidden

VOCAB, EOS, PAD = 24, 2, 0


@pytest.fixture(autouse=True)
def _narrow_models_record(monkeypatch):
    monkeypatch.setattr(decode_tape, "MIN_HIDDEN", 0)  # these tiny models are narrower than the default


def _model(arch: str = "qwen2", seed: int = 3):
    torch.manual_seed(seed)
    return make_tiny_model(arch, vocab_size=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, seed=seed).train()


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded prompts of 5, 3 and 1 tokens (ids 4.., no EOS or pad)."""
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(5)[None] >= torch.tensor([[0], [2], [4]])).long()
    return torch.randint(4, VOCAB, (3, 5), generator=g) * mask, mask


def _decoded(model, n: int = 4, max_new_tokens: int = 12, compact: bool = True) -> dict[str, torch.Tensor]:
    ids, mask = _prompts()
    out = decode(model, ids, mask, SamplingParams(n=n, max_new_tokens=max_new_tokens), eos_token_ids=[EOS], keep_products=True,
                 pad_token_id=PAD, generator=torch.Generator().manual_seed(5), compact=compact)
    return {"prompt_ids": ids.repeat_interleave(n, 0), "prompt_mask": mask.repeat_interleave(n, 0),
            "response_ids": out.response_ids, "response_mask": out.response_mask}


def _states_and_gradients(model, fields: dict, computed: bool = False) -> tuple[torch.Tensor, dict]:
    """The states before each response token at the loss's positions, and every parameter's gradient: by the
    train engine's forward (taking a tape where one applies), or (``computed``) its shared-prompt forward with no
    tape."""
    model.zero_grad(set_to_none=True)
    f = [fields[k] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")]
    if computed:
        hidden = lean_shared_hidden(model.base_model, *f, prompt_groups(f[0], f[1]))
    else:
        hidden = shared_response_hidden(model.base_model, *f)
        if hidden is None:  # as the train engine does: the joined rows
            hidden = response_hidden(model.base_model, join_prompt_response(*f), f[0].shape[-1])
    valid = fields["response_mask"].bool()
    (hidden[valid] * torch.linspace(-1, 1, hidden.shape[-1])).sum().backward()
    return hidden[valid].detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _rows(fields: dict, rows) -> dict:
    return {k: v[rows] for k, v in fields.items()}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("pack_min, join_limit", [(1 << 17, 1 << 20), (0, 1 << 20), (0, 0)],
                         ids=["mkl", "onednn", "onednn-unjoined"])
@pytest.mark.parametrize("compact", [True, False], ids=["compacted", "every-row"])
def test_replayed_states_and_gradients_equal_the_recomputed_ones(arch, pack_min, join_limit, compact, monkeypatch):
    monkeypatch.setattr(lean_decode, "PACK_MIN", pack_min)
    # unjoined (the ~100M model): the decode's gate and up as two products writing a block each, the update's
    # q/k/v and gate/up each layer writing its columns
    monkeypatch.setattr(lean_decode, "JOIN_LIMIT", join_limit)
    monkeypatch.setattr(lean_forward, "JOIN_LIMIT", join_limit)
    monkeypatch.setattr(decode_tape, "FILL", float("nan"))  # a position read that no step wrote shows as NaN
    model = _model(arch)
    fields = _decoded(model, compact=compact)
    lengths = fields["response_mask"].sum(-1)
    # lengths from 1 (no position of the row is read) to the limit (no EOS), spread between
    assert int(lengths.min()) == 1 and int(lengths.max()) == 12 and len(set(lengths.tolist())) > 4
    tape = decode_tape._TAPES[model.base_model]
    # a micro-batch: rows of every group, in another order, one row twice
    rows = torch.tensor([9, 1, 5, 11, 2, 7, 1, 8, 6])
    replayed = _states_and_gradients(model, _rows(fields, rows))
    assert tape.served == 1
    recomputed = _states_and_gradients(model, _rows(fields, rows), computed=True)
    assert tape.served == 1
    torch.testing.assert_close(replayed[0], recomputed[0], rtol=1e-5, atol=1e-5)
    assert replayed[1].keys() == recomputed[1].keys() and len(replayed[1]) > 0
    for name, grad in recomputed[1].items():
        assert bool(torch.isfinite(replayed[1][name]).all()), name
        scale = float(grad.abs().max())
        torch.testing.assert_close(replayed[1][name], grad, rtol=1e-4, atol=1e-5 * max(scale, 1e-3)), name


def test_an_optimizer_step_or_a_weight_copy_ends_the_tape():
    model = _model()
    fields = _decoded(model)
    backbone = model.base_model
    assert decode_tape.replay_rows(backbone, *fields.values()) is not None
    _states_and_gradients(model, fields)
    torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True).step()  # fused: no version counter moves
    assert backbone not in decode_tape._TAPES
    assert decode_tape.replay_rows(backbone, *fields.values()) is None

    fields = _decoded(model)
    assert decode_tape.replay_rows(backbone, *fields.values()) is not None
    with torch.no_grad():
        backbone.layers[1].mlp.down_proj.weight.copy_(backbone.layers[1].mlp.down_proj.weight * 1.01)
    assert decode_tape.replay_rows(backbone, *fields.values()) is None
    assert backbone not in decode_tape._TAPES  # a stale tape is dropped when found


def test_rows_the_decode_did_not_produce_are_computed():
    model = _model()
    fields = _decoded(model)
    backbone = model.base_model
    long_row = int(fields["response_mask"].sum(-1).argmax())
    changed = {k: v.clone() for k, v in fields.items()}
    changed["response_ids"][long_row, 3] = (changed["response_ids"][long_row, 3] + 1 - 4) % (VOCAB - 4) + 4
    assert decode_tape.replay_rows(backbone, *changed.values()) is None
    holed = {k: v.clone() for k, v in fields.items()}
    holed["response_mask"][long_row, 2] = 0.0  # a masked token inside a response: another attention
    assert decode_tape.replay_rows(backbone, *holed.values()) is None
    other_prompt = {k: v.clone() for k, v in fields.items()}
    other_prompt["prompt_ids"][long_row, -1] = (other_prompt["prompt_ids"][long_row, -1] + 1 - 4) % (VOCAB - 4) + 4
    assert decode_tape.replay_rows(backbone, *other_prompt.values()) is None
    # and the forward falls back to computing its products: states as without any tape
    states, _ = _states_and_gradients(model, changed)
    tape = decode_tape._TAPES.pop(backbone)
    reference, _ = _states_and_gradients(model, changed)
    assert tape.served == 0
    torch.testing.assert_close(states, reference, rtol=0, atol=0)


def test_no_tape_where_nothing_trains_or_it_would_be_too_large(monkeypatch):
    model = _model()
    monkeypatch.setattr(decode_tape, "MIN_HIDDEN", 64)  # narrower than this: nothing recorded
    _decoded(model)
    assert model.base_model not in decode_tape._TAPES
    monkeypatch.setattr(decode_tape, "MIN_HIDDEN", 32)
    model.requires_grad_(False)
    _decoded(model)
    assert model.base_model not in decode_tape._TAPES
    model.requires_grad_(True)
    monkeypatch.setattr(decode_tape, "TAPE_LIMIT", 1000)
    _decoded(model)
    assert model.base_model not in decode_tape._TAPES
    monkeypatch.setattr(decode_tape, "TAPE_LIMIT", 1 << 30)
    ids, mask = _prompts()
    out = decode(model, ids, mask, SamplingParams(n=4, max_new_tokens=12), eos_token_ids=[EOS], pad_token_id=PAD, keep_products=True,
                 generator=torch.Generator().manual_seed(5))
    tape = decode_tape._TAPES[model.base_model]
    # room for 12 rows x 11 fed tokens; (q/k/v 32+16+16, o 32, gate/up 2 x intermediate, down 32) a layer
    widths = {name: t.shape[-1] for name, t in tape.layers[0].items()}
    assert widths == {"qkv": 64, "o": 32, "gate_up": 2 * model.config.intermediate_size, "down": 32}
    assert tape.layers[0]["qkv"].shape[0] == 12 * 11 and len(tape.layers) == 2
    # the steps' rows one after another: as many as the steps fed (fewer once ended rows were dropped)
    assert tape.used == out.row_steps < 12 * 11
    assert sorted(tape.index[tape.index >= 0].tolist()) == list(range(tape.used))
    # the next decode writes into the same memory
    buffer = tape.layers[1]["down"].data_ptr()
    _decoded(model)
    assert decode_tape._TAPES[model.base_model] is not tape and tape.keys is None
    assert decode_tape._TAPES[model.base_model].layers[1]["down"].data_ptr() == buffer
