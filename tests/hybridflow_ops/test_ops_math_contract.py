"""The registered RL-math ops keep the field contract, never mutate inputs, and ignore padding.

One generic check per op, driven by the registry: inputs are built from each
op's declared fields, so a new op or a changed field list is checked too.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import IS_WEIGHTED_LOSSES, get_op

# op -> (model_inputs, inputs, outputs, kind): the contract the graph layer relies on.
CONTRACT = {
    "gae": ((), ("token_rewards", "values", "response_mask"), ("advantages", "returns"), "compute"),
    "grpo_advantage": ((), ("scores", "group_index", "response_mask"), ("advantages",), "compute"),
    "rloo_advantage": ((), ("scores", "group_index", "response_mask"), ("advantages",), "compute"),
    "reinforce_pp_advantage": ((), ("token_rewards", "response_mask"), ("advantages", "returns"), "compute"),
    "reinforce_pp_baseline_advantage": ((), ("scores", "group_index", "response_mask"), ("advantages",), "compute"),
    "gpg_advantage": ((), ("scores", "group_index", "response_mask"), ("advantages",), "compute"),
    "opo_advantage": ((), ("scores", "group_index", "response_mask"), ("advantages",), "compute"),
    "passk_advantage": ((), ("scores", "group_index", "response_mask"), ("advantages",), "compute"),
    "remax_advantage": ((), ("scores", "baseline_scores", "response_mask"), ("advantages", "returns"), "compute"),
    "kl_in_reward": ((), ("scores", "old_log_probs", "ref_log_probs", "response_mask"), ("token_rewards",), "compute"),
    "score_to_token_rewards": ((), ("scores", "response_mask"), ("token_rewards",), "compute"),
    "kl": ((), ("old_log_probs", "ref_log_probs", "response_mask"), ("kl",), "compute"),
    "truncated_is_weight": ((), ("old_log_probs", "rollout_log_probs", "response_mask"), ("is_weights",), "compute"),
    "sequence_is_weight": ((), ("old_log_probs", "rollout_log_probs", "response_mask"), ("is_weights",), "compute"),
    "icepop_is_weight": ((), ("old_log_probs", "rollout_log_probs", "response_mask"), ("is_weights",), "compute"),
    "normalize_is_weight": ((), ("is_weights", "response_mask"), ("is_weights",), "compute"),
    "sequence_rejection_mask": ((), ("old_log_probs", "rollout_log_probs", "response_mask"), ("response_mask",), "compute"),
    "ppo_clip": (("log_probs",), ("old_log_probs", "advantages", "response_mask"), ("loss",), "loss"),
    "ppo_clip_is": (("log_probs",), ("old_log_probs", "advantages", "response_mask", "is_weights"), ("loss",), "loss"),
    "gspo": (("log_probs",), ("old_log_probs", "advantages", "response_mask"), ("loss",), "loss"),
    "gmpo": (("log_probs",), ("old_log_probs", "advantages", "response_mask"), ("loss",), "loss"),
    "cispo": (("log_probs",), ("old_log_probs", "advantages", "response_mask"), ("loss",), "loss"),
    "reinforce": (("log_probs",), ("advantages", "response_mask"), ("loss",), "loss"),
    "gpg": (("log_probs",), ("advantages", "response_mask"), ("loss",), "loss"),
    "clip_cov": (("log_probs",), ("old_log_probs", "advantages", "response_mask"), ("loss",), "loss"),
    "kl_cov": (("log_probs",), ("old_log_probs", "advantages", "response_mask"), ("loss",), "loss"),
    "sapo": (("log_probs",), ("old_log_probs", "advantages", "response_mask"), ("loss",), "loss"),
    "dppo_tv": (("log_probs",), ("old_log_probs", "advantages", "response_mask"), ("loss",), "loss"),
    "dppo_kl": (("log_probs",), ("old_log_probs", "advantages", "response_mask"), ("loss",), "loss"),
    "kl_loss": (("log_probs",), ("ref_log_probs", "response_mask"), ("loss",), "loss"),
    "value_clip": (("value_preds",), ("values", "returns", "response_mask"), ("loss",), "loss"),
    "entropy_bonus": (("entropy",), ("response_mask",), ("loss",), "loss"),
    "kl_rejection_mask": ((), ("old_log_probs", "rollout_log_probs", "response_mask"), ("response_mask",), "compute"),
    "chained_rejection_mask": ((), ("old_log_probs", "rollout_log_probs", "response_mask"), ("response_mask",), "compute"),
    "decoupled_is_weight": ((), ("old_log_probs", "rollout_log_probs", "response_mask"), ("is_weights",), "compute"),
    "old_log_probs_from_rollout": ((), ("rollout_log_probs", "response_mask"), ("old_log_probs",), "compute"),
}
# Every policy-gradient loss's IS-weighted op: its fields plus is_weights.
CONTRACT.update({f"{name}_is": (model, inputs + ("is_weights",), outputs, kind)
                 for name, (model, inputs, outputs, kind) in list(CONTRACT.items())
                 if kind == "loss" and name in IS_WEIGHTED_LOSSES and name != "ppo_clip"})
OPS = sorted(CONTRACT)
# Hyper-parameters the generic checks pass where an op's defaults do not fit their inputs (groups of two).
ATTRS = {"passk_advantage": {"k": 2}, "kl_rejection_mask": {"high": 0.5}}
NAN = float("nan")


@pytest.mark.parametrize("name", OPS)
def test_registered_fields_match_contract(name):
    spec = get_op(name)
    model_inputs, inputs, outputs, kind = CONTRACT[name]
    assert tuple(f.name for f in spec.model_inputs) == model_inputs
    assert spec.input_names == inputs
    assert spec.output_names == outputs
    assert spec.kind == kind
    if kind == "loss":
        assert {"loss_agg_mode", "global_tokens", "global_seqs"} <= set(spec.attrs)
    assert spec.doc  # formula, shapes, reference live there


def make_inputs(name, b, r, seed):
    """Tensors for every declared field: response_mask with a valid first token, log-probs < 0."""
    gen = torch.Generator().manual_seed(seed)
    spec = get_op(name)
    mask = (torch.rand(b, r, generator=gen) > 0.3).float()
    mask[:, 0] = 1.0
    tensors = []
    for field in spec.model_inputs + spec.inputs:
        shape = (b, r) if field.dims == ("B", "R") else (b,)
        if field.name == "response_mask":
            value = mask.clone()
        elif field.name == "group_index":
            value = torch.arange(b) // 2
        elif field.name == "scores" and name == "passk_advantage":
            value = (torch.rand(shape, generator=gen) > 0.5).float()  # pass/fail rewards
        elif "log_probs" in field.name:
            value = -torch.rand(shape, generator=gen) * 3
        elif field.name in ("is_weights", "entropy"):
            value = torch.rand(shape, generator=gen) * 2
        else:
            value = torch.randn(shape, generator=gen)
        tensors.append(value)
    n_model = len(spec.model_inputs)
    for t in tensors[:n_model]:
        t.requires_grad_(True)
    return tensors, mask


@pytest.mark.parametrize("name", OPS)
def test_op_result_shapes_and_no_mutation(name):
    spec = get_op(name)
    b, r = 4, 5
    tensors, _ = make_inputs(name, b, r, seed=0)
    copies = [t.detach().clone() for t in tensors]
    result = spec(*tensors, **ATTRS.get(name, {}))
    assert hasattr(result, "_fields") and result._fields[: len(spec.outputs)] == spec.output_names
    for t, c in zip(tensors, copies):
        assert torch.equal(t.detach(), c), f"{name} mutated an input"
    for field, value in zip(spec.outputs, result):
        expected = {("B", "R"): (b, r), ("B",): (b,), (): ()}[field.dims]
        assert tuple(value.shape) == expected and value.dtype == torch.float32
    if spec.kind == "loss":
        assert result.loss.requires_grad
        result.loss.backward()
        for metric in result[1:]:
            assert metric.dim() == 0 and not metric.requires_grad


@pytest.mark.parametrize("name", OPS)
@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 4), r=st.integers(1, 6), seed=st.integers(0, 1000),
    extra=st.integers(1, 3), garbage=st.sampled_from([NAN, math.inf, -math.inf, 1e30]), data=st.data(),
)
def test_op_ignores_inserted_padding_with_garbage(name, b, r, seed, extra, garbage, data):
    # Insert `extra` masked columns anywhere, holding garbage in every
    # per-token input: outputs at the original positions, losses and metrics must not change,
    # outputs at the new positions must be 0, and gradients there exactly 0.
    spec = get_op(name)
    tensors, mask = make_inputs(name, 2 * b, r, seed)
    positions = sorted(data.draw(st.lists(st.integers(0, r), min_size=extra, max_size=extra)), reverse=True)
    keep = list(range(r))
    for p in positions:
        keep.insert(p, -1)
    index = torch.tensor([k if k >= 0 else 0 for k in keep])
    is_new = torch.tensor([k < 0 for k in keep])
    n_model = len(spec.model_inputs)

    def widen(t, field):
        if field.dims != ("B", "R"):
            return t.detach().clone()
        fill = 0.0 if field.name == "response_mask" else garbage
        return torch.where(is_new, torch.full_like(t[:, index], fill), t.detach()[:, index])

    fields = spec.model_inputs + spec.inputs
    wide = [widen(t, f) for t, f in zip(tensors, fields)]
    for t in wide[:n_model]:
        t.requires_grad_(True)
    base, out = spec(*tensors, **ATTRS.get(name, {})), spec(*wide, **ATTRS.get(name, {}))
    for field, a, c in zip(spec.outputs, base, out):
        if field.dims == ("B", "R"):
            torch.testing.assert_close(c[:, ~is_new], a)
            assert torch.all(c[:, is_new] == 0)
    if spec.kind == "loss":
        for a, c in zip(base, out):
            torch.testing.assert_close(c, a)
        base.loss.backward()
        out.loss.backward()
        for t, w in zip(tensors[:n_model], wide[:n_model]):
            torch.testing.assert_close(w.grad[:, ~is_new], t.grad)
            assert torch.all(w.grad[:, is_new] == 0)


def test_vanishes_with_must_name_an_input():
    from hybridflow_ops.registry import OpRegistryError, get_op, register_op

    with pytest.raises(OpRegistryError, match="vanishes_with"):
        register_op("bad_vanish", inputs=("advantages: float32[B, R]",), outputs=("loss: float32",), kind="loss",
                    vanishes_with="scores")
    vanishing = ("ppo_clip", "ppo_clip_is", "gspo", "gmpo", "cispo", "reinforce", "gpg", "sapo", "dppo_tv", "dppo_kl")
    assert {get_op(n).vanishes_with for n in vanishing} == {"advantages"}
    # Clip-Cov / KL-Cov select tokens from batch statistics (and KL-Cov penalises zero-advantage tokens): not separable.
    assert {get_op(n).vanishes_with for n in ("kl_loss", "clip_cov", "kl_cov")} == {None}


@pytest.mark.parametrize("name", sorted(n for n in CONTRACT if get_op(n).vanishes_with))
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), b=st.integers(2, 4), r=st.integers(1, 5))
def test_vanishing_rows_add_zero_loss_and_gradient_and_can_be_dropped(name, seed, b, r):
    # The vanishes_with contract as an engine uses it: zero the field on some rows; the loss and the
    # gradient of the other rows are those of the batch without these rows (global counts kept), and
    # the zeroed rows get exactly zero gradient.
    spec = get_op(name)
    tensors, mask = make_inputs(name, b, r, seed)
    fields = [f.name for f in spec.model_inputs + spec.inputs]
    zero_rows = torch.arange(b) % 2 == 0
    k = fields.index(spec.vanishes_with)
    tensors[k] = torch.where(zero_rows[:, None], torch.zeros_like(tensors[k]), tensors[k])
    counts = dict(global_tokens=mask.sum(), global_seqs=mask.bool().any(-1).sum(), norm_length=r)
    full = spec(*tensors, **counts)
    full.loss.backward()
    n_model = len(spec.model_inputs)
    kept = [t.detach()[~zero_rows].requires_grad_(i < n_model) for i, t in enumerate(tensors)]
    part = spec(*kept, **counts)
    torch.testing.assert_close(part.loss, full.loss)
    part.loss.backward()
    for t, p in zip(tensors[:n_model], kept[:n_model]):
        assert torch.all(t.grad[zero_rows] == 0)
        torch.testing.assert_close(t.grad[~zero_rows], p.grad)
