"""The lean train forward: the transformers backbone's states and gradients, and the transformers forward where it cannot be exact."""
from __future__ import annotations

import functools

import pytest
import torch
from engine_testkit import grouped_batch

from hybridflow.data.tiny import make_tiny_model
from hybridflow.runtime.engines import lean_decode, lean_forward
from hybridflow.runtime.engines.lean_decode import joined_weights, linear_into
from hybridflow.runtime.engines.lean_forward import joined_linear, lean_forward_applies, lean_hidden, lean_shared_hidden
from hybridflow.runtime.engines.sequence import join_prompt_response, response_hidden
from hybridflow.runtime.engines.shared_prompt import prompt_groups, shared_response_hidden

FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


def _batch(width: int, groups: int = 3, n: int = 4, seed: int = 1) -> dict:
    """``groups`` left-padded prompts (row 0 unpadded, row 2 padded to a single token) x ``n`` responses of lengths 1..width."""
    batch = grouped_batch(width, groups, n, seed, pads=(0, 2, 5))
    batch.pop("generator")
    return batch


def _transformers_states(backbone, fields) -> torch.Tensor:
    """The backbone's own forward on the joined rows: the reference (the states before each response token)."""
    inputs = join_prompt_response(*fields)
    out = backbone(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, position_ids=inputs.position_ids,
                   use_cache=False)
    return out.last_hidden_state[:, fields[0].shape[-1] - 1:]


def _states_and_gradients(model, states_of, fields, valid) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    hidden = states_of(model.base_model, fields)
    weights = torch.linspace(-1, 1, hidden.shape[-1])
    (hidden[valid] * weights).sum().backward()
    return hidden[valid].detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _assert_same(result, reference) -> None:
    (states, grads), (ref_states, ref_grads) = result, reference
    torch.testing.assert_close(states, ref_states, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name, grad in ref_grads.items():
        scale = float(grad.abs().max())  # the float error of a gradient's sum grows with its terms
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5 * max(scale, 1e-3)), name


@pytest.mark.parametrize("arch, kv_heads", [("qwen2", 2), ("llama", 4), ("llama", 2)])
@pytest.mark.parametrize("width", [1, 5])
@pytest.mark.parametrize("pack_min", [1 << 17, 0], ids=["mkl", "onednn"])
@pytest.mark.parametrize("group_cost", [lean_forward.GROUP_COST, 0], ids=["groups-by-cost", "most-groups"])
def test_joined_and_shared_states_and_gradients_equal_the_transformers_forward(arch, kv_heads, width, pack_min,
                                                                              group_cost, monkeypatch):
    monkeypatch.setattr(lean_decode, "PACK_MIN", pack_min)  # 0: every product on oneDNN (lean_decode.dense)
    monkeypatch.setattr(lean_forward, "GROUP_COST", group_cost)  # 0: attention in up to 8 groups of rows
    torch.manual_seed(0)
    model = make_tiny_model(arch, vocab_size=24, hidden=32, layers=2, heads=4, kv_heads=kv_heads).train()
    batch = _batch(width)
    fields = [batch[k] for k in FIELDS]
    valid = batch["response_mask"].bool()
    assert lean_forward_applies(model.base_model)
    reference = _states_and_gradients(model, _transformers_states, fields, valid)
    joined = _states_and_gradients(model, lambda backbone, f: response_hidden(
        backbone, join_prompt_response(*f), f[0].shape[-1]), fields, valid)
    shared = _states_and_gradients(model, lambda backbone, f: lean_shared_hidden(
        backbone, *f, prompt_groups(f[0], f[1])), fields, valid)
    _assert_same(joined, reference)
    _assert_same(shared, reference)
    # the embedding's padding row gets no gradient, as nn.Embedding's padding_idx has it
    assert float(shared[1]["model.embed_tokens.weight"][model.config.pad_token_id].abs().max()) == 0.0


def test_attention_groups_cut_rows_sorted_by_width_by_hand(monkeypatch):
    # rows of widths 4, 1, 1, 4 (Q = 4) after 2 cached keys: one group computes 4 x 4 x (2 + 4) = 96 key positions;
    # two, rows 1-2 at width 1 and rows 0, 3 at width 4: 2 x 1 x 3 + 2 x 4 x 6 = 54; four: 54 as well (a tie
    # keeps fewer groups)
    valid = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    packed = valid.reshape(-1).nonzero().squeeze(-1)
    allowed = torch.ones(4, 1, 4, 6, dtype=torch.bool)
    monkeypatch.setattr(lean_forward, "GROUP_COST", 0)
    layout = lean_forward._AttentionGroups(valid, packed, allowed, past=2)
    assert [(rows.tolist(), width, start, tuple(mask.shape)) for rows, width, start, mask in layout.groups] == [
        ([1, 2], 1, 0, (2, 1, 1, 3)), ([0, 3], 4, 2, (2, 1, 4, 6))]
    # the packed positions (row 0's four, row 1's, row 2's, row 3's four) in the joined layout of 2 + 8 rows
    assert layout.total == 10 and layout.dest.tolist() == [2, 3, 4, 5, 0, 1, 6, 7, 8, 9]
    monkeypatch.setattr(lean_forward, "GROUP_COST", 100)  # 196 against 254: one group
    assert [rows.tolist() for rows, *_ in lean_forward._AttentionGroups(valid, packed, allowed, past=2).groups] == [
        [1, 2, 0, 3]]


def _outputs_and_gradients(forward, *, leaves: list[torch.Tensor], upstream: torch.Tensor) -> list[torch.Tensor]:
    """``forward()``'s output and the gradients of ``leaves`` after its backward from ``upstream``."""
    for leaf in leaves:
        leaf.grad = None
    out = forward()
    out.backward(upstream)
    return [out.detach()] + [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("join_limit, pack_min", [(1 << 20, 1 << 17), (0, 1 << 17), (1 << 20, 0)],
                         ids=["small-joined", "large-per-layer", "joined-onednn"])
@pytest.mark.parametrize("biases", [(True, True, True), (False, False, False), (True, False, True)])
def test_joined_projections_give_the_separate_layers_outputs_and_gradients(biases, join_limit, pack_min, monkeypatch):
    # below JOIN_LIMIT the input's gradient is one matmul on the weights joined again, above it one per layer;
    # from PACK_MIN weights the forward and the input's gradient are oneDNN's products (lean_decode.dense)
    monkeypatch.setattr(lean_forward, "JOIN_LIMIT", join_limit)
    monkeypatch.setattr(lean_decode, "PACK_MIN", pack_min)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(48, width, bias=bias) for width, bias in zip((48, 16, 16), biases)]
    x = torch.randn(3, 5, 48, requires_grad=True)
    upstream = torch.randn(3, 5, 80)
    leaves = [x] + [p for layer in layers for p in layer.parameters()]
    outputs_and_gradients = functools.partial(_outputs_and_gradients, leaves=leaves, upstream=upstream)
    ours = outputs_and_gradients(lambda: joined_linear(x, *layers))
    reference = outputs_and_gradients(lambda: torch.cat([layer(x) for layer in layers], dim=-1))
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    # each weight's gradient is the same mm of its own columns as the layer's backward takes, to the bit
    assert all(torch.equal(a, b) for a, b in zip(ours[1:], reference[1:]) if a.dim() == 2)
    if join_limit and pack_min:  # small layers: one matmul on the joined weights, a differentiable cat's numbers to the bit

        def concatenated():
            bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in layers])
            return torch.nn.functional.linear(x, torch.cat([m.weight for m in layers]), bias if any(biases) else None)

        assert all(torch.equal(a, b) for a, b in zip(ours, outputs_and_gradients(concatenated)))


def test_linear_into_gives_the_layers_outputs_side_by_side():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, width) for width in (256, 128, 128)]
    x = torch.randn(64, 1, 256)
    with torch.no_grad():
        joined = torch.nn.functional.linear(x, *joined_weights(*layers))
        sliced = linear_into(x, [m.weight for m in layers], [m.bias for m in layers])
        torch.testing.assert_close(sliced, torch.cat([m(x) for m in layers], dim=-1), rtol=1e-6, atol=1e-6)
    assert sliced.shape == joined.shape
    torch.testing.assert_close(sliced, joined, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,bias", [((37, 128), False), ((3, 5, 128), True)])
def test_the_gated_mlp_gives_autograds_numbers_to_the_bit(shape, bias):
    torch.manual_seed(0)
    width = shape[-1] // 2
    both = torch.randn(*shape, requires_grad=True)
    down = torch.nn.Linear(width, 24, bias=bias)
    upstream = torch.randn(*shape[:-1], 24)
    outputs_and_gradients = functools.partial(_outputs_and_gradients, leaves=[both, *down.parameters()],
                                              upstream=upstream)

    def autograd():
        gate, up = both.split(width, dim=-1)
        return down(torch.nn.functional.silu(gate) * up)

    ours = outputs_and_gradients(lambda: lean_forward._SwiGLUDown.apply(both, down.weight, down.bias))
    assert all(torch.equal(a, b) for a, b in zip(ours, outputs_and_gradients(autograd)))


@pytest.mark.parametrize("bias", [False, True])
def test_the_gated_mlp_on_onednn_products_gives_autograds_numbers(bias, monkeypatch):
    # from PACK_MIN weights (here: every one) the down projection and the product's gradient are oneDNN's
    monkeypatch.setattr(lean_decode, "PACK_MIN", 0)
    torch.manual_seed(0)
    both = torch.randn(3, 41, 256, requires_grad=True)
    down = torch.nn.Linear(128, 96, bias=bias)
    outputs_and_gradients = functools.partial(_outputs_and_gradients, leaves=[both, *down.parameters()],
                                              upstream=torch.randn(3, 41, 96))

    def autograd():
        gate, up = both.split(128, dim=-1)
        return down(torch.nn.functional.silu(gate) * up)

    ours = outputs_and_gradients(lambda: lean_forward._SwiGLUDown.apply(both, down.weight, down.bias))
    for a, b in zip(ours, outputs_and_gradients(autograd)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_gated_mlp_keeps_no_product_for_backward():
    # autograd would keep silu(gate) * up as well: one more (tokens, intermediate) tensor a layer
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=32, layers=1, heads=4, kv_heads=2).train()
    mlp = model.base_model.layers[0].mlp
    x = torch.randn(7, 32, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = lean_forward._mlp(mlp, x)
    out.sum().backward()
    allowed = {x.untyped_storage().data_ptr()} | {p.untyped_storage().data_ptr() for p in mlp.parameters()}
    kept = {t.untyped_storage().data_ptr(): t for t in saved if t.untyped_storage().data_ptr() not in allowed}
    width = mlp.gate_proj.out_features
    assert sorted(t.shape for t in kept.values()) == [(7, width), (7, 2 * width)]  # silu(gate); [gate, up]
    assert all(p.grad is not None for p in mlp.parameters()) and x.grad is not None


def test_an_update_keeps_no_joined_copy_of_the_weights_for_its_backward():
    # a differentiable torch.cat of q/k/v (and gate/up) weights would be kept from the forward to the backward,
    # one copy per layer: on a large model a second copy of most of its weights alive through the update
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=32, layers=2, heads=4, kv_heads=2).train()
    batch = _batch(5)
    fields = [batch[k] for k in FIELDS]
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        hidden = lean_shared_hidden(model.base_model, *fields, prompt_groups(fields[0], fields[1]))
    hidden[batch["response_mask"].bool()].sum().backward()
    joined = []
    for layer in model.base_model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        joined += [torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach(),
                   torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()]
    weights = {p.data_ptr() for p in model.parameters()}
    assert any(t.data_ptr() in weights for t in saved)  # the hook sees what is kept: the weights themselves are
    # a weight is saved as it is or as its transpose (linear keeps W.t() for its input's gradient)
    matrices = [view for t in saved if t.dim() == 2 for view in (t, t.mT)]
    copies = [m for m in matrices for w in joined if m.shape == w.shape and torch.equal(m, w)]
    assert not copies
    assert all(p.grad is not None for n, p in model.named_parameters() if "proj" in n)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("pack_min", [1 << 17, 0], ids=["mkl", "onednn"])
def test_without_gradients_every_state_is_the_transformers_one(shared, pack_min, monkeypatch):
    # compute_log_probs returns every response position, past a response's end too: there the states are the
    # model's as well (with gradients, in an update, only the valid positions are computed: the others are 0)
    monkeypatch.setattr(lean_decode, "PACK_MIN", pack_min)  # 0: products on oneDNN-reordered weights
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=32, layers=2, heads=4, kv_heads=2).eval()
    batch = _batch(5)
    fields = [batch[k] for k in FIELDS]
    backbone = model.base_model
    if shared:
        states = lambda: lean_shared_hidden(backbone, *fields, prompt_groups(fields[0], fields[1]))  # noqa: E731
    else:
        states = lambda: response_hidden(backbone, join_prompt_response(*fields), fields[0].shape[-1])  # noqa: E731
    with torch.no_grad():
        lean, reference = states(), _transformers_states(backbone, fields)
    torch.testing.assert_close(lean, reference, rtol=1e-5, atol=1e-5)
    with_grad = states().detach()  # computed with gradients on: the valid positions alone
    fed = torch.cat([torch.ones(len(fields[0]), 1), batch["response_mask"][:, :-1]], 1).bool()  # state before a token
    assert float(with_grad[~fed].abs().max()) == 0.0 and float(with_grad[fed].abs().min()) > 0.0
    torch.testing.assert_close(with_grad[fed], reference[fed], rtol=1e-5, atol=1e-5)


def test_a_cached_call_continues_the_states_of_one_call():
    # lean_hidden on the first positions, then the rest on top of their keys/values: one call's states
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=32, layers=2, heads=4, kv_heads=2).eval()
    ids = torch.randint(4, 20, (3, 7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    whole, _ = lean_hidden(model.base_model, ids, mask, positions)
    first, cache = lean_hidden(model.base_model, ids[:, :4], mask[:, :4], positions[:, :4])
    rest, _ = lean_hidden(model.base_model, ids[:, 4:], mask, positions[:, 4:], cache)
    valid = mask.bool()
    torch.testing.assert_close(torch.cat([first, rest], 1)[valid], whole[valid], rtol=1e-5, atol=1e-6)


def test_the_forward_where_it_is_not_exact_is_the_models_own():
    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=32, layers=2, heads=4, kv_heads=2).train()
    backbone = model.base_model
    assert lean_forward_applies(backbone)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not lean_forward_applies(backbone)  # the model's forward decides the casts
    handle = backbone.layers[0].mlp.register_forward_hook(lambda module, args, out: out * 2)
    assert not lean_forward_applies(backbone)  # a hook changes what the forward computes
    batch = _batch(3)
    fields = [batch[k] for k in FIELDS]
    valid = batch["response_mask"].bool()
    torch.testing.assert_close(response_hidden(backbone, join_prompt_response(*fields), 6)[valid],
                               _transformers_states(backbone, fields)[valid], rtol=0, atol=0)
    handle.remove()
    model.config.attention_dropout = 0.1
    assert not lean_forward_applies(backbone)  # dropout active in train mode
    assert lean_forward_applies(backbone.eval())
    model.config.attention_dropout = 0.0
    backbone.train().gradient_checkpointing = True
    assert not lean_forward_applies(backbone)
    backbone.gradient_checkpointing = False
    model.config.model_type = "gemma"  # an architecture the lean paths do not drive
    assert not lean_forward_applies(backbone)


def test_the_shared_prompt_forward_takes_the_lean_path_where_it_applies(monkeypatch):
    from hybridflow.runtime.engines import lean_decode, lean_forward

    torch.manual_seed(0)
    model = make_tiny_model("qwen2", vocab_size=24, hidden=64, layers=2, heads=4, kv_heads=2).train()
    batch = _batch(4, groups=8, n=8)
    fields = [batch[k] for k in FIELDS]
    calls = []
    monkeypatch.setattr(lean_forward, "lean_shared_hidden",
                        lambda *args: calls.append(1) or lean_shared_hidden(*args))
    lean = shared_response_hidden(model.base_model, *fields)
    assert calls == [1]
    monkeypatch.setattr(lean_forward, "lean_forward_applies", lambda backbone: False)
    own = shared_response_hidden(model.base_model, *fields)  # the DynamicCache path
    valid = batch["response_mask"].bool()
    torch.testing.assert_close(lean[valid], own[valid], rtol=1e-5, atol=1e-5)

