"""TrainEngine: log-probs equal the rollout's, lr=0 is a no-op, micro-batching does not change the update."""
from __future__ import annotations

import copy
import math
import weakref

import pytest
import torch
from engine_testkit import prompt_batch, tiny_model

from hybridflow.errors import OpError
from hybridflow_ops.registry import register_op
from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams, TrainEngine, TrainEngineConfig

PG = [("ppo_clip", 1.0, {"clip_low": 0.2, "clip_high": 0.28})]


def rollout(tokenizer, model, *, temperature=1.0, n=1, seed=0, **kw):
    """Sampled responses of ``model`` with old_log_probs = rollout_log_probs and random advantages."""
    params = SamplingParams(n=n, max_new_tokens=8, temperature=temperature, seed=seed, **kw)
    batch = HFRolloutEngine(model, tokenizer=tokenizer).generate(prompt_batch(tokenizer), params)
    adv = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(seed))
    return batch.with_fields(old_log_probs=batch["rollout_log_probs"], advantages=adv,
                             ref_log_probs=batch["rollout_log_probs"] - 0.1)


def weights(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("temperature,top_k,top_p,n", [(1.0, 0, 1.0, 1), (0.7, 5, 0.9, 1), (1.2, 0, 0.95, 4)])
def test_log_probs_equal_the_rollout_engines(tokenizer, model, temperature, top_k, top_p, n):
    # n > 1 also checks the shared prefill: one prompt forward, its KV cache repeated n times
    batch = rollout(tokenizer, model, temperature=temperature, top_k=top_k, top_p=top_p, n=n)
    engine = TrainEngine(model, TrainEngineConfig(temperature=temperature))
    log_probs = engine.compute_log_probs(batch)
    mask = batch["response_mask"]
    assert log_probs.shape == mask.shape and log_probs.dtype == torch.float32
    assert ((log_probs - batch["rollout_log_probs"]) * mask).abs().max() <= 1e-5


def test_first_ppo_ratio_is_one(tokenizer, model):
    batch = rollout(tokenizer, model, temperature=0.7, n=2)
    # One mini-batch (two micro-batches): every sample is seen with the rollout's weights.
    single = TrainEngine(copy.deepcopy(model), TrainEngineConfig(lr=1e-2, temperature=0.7, micro_batch_size=8))
    first = single.update(batch, PG)
    assert abs(first["actor/ppo_kl"]) < 1e-6 and first["actor/pg_clipfrac"] == 0.0
    # Two mini-batches: the second one sees weights moved by the first step, so the ratio is no longer 1.
    engine = TrainEngine(model, TrainEngineConfig(lr=1e-2, temperature=0.7, mini_batch_size=8))
    assert abs(engine.update(batch, PG)["actor/ppo_kl"]) > 1e-5


def test_bf16_autocast_on_cpu_when_asked(tokenizer, model):
    batch = rollout(tokenizer, model)
    engine = TrainEngine(model, TrainEngineConfig(precision="bf16", lr=1e-3))
    assert engine.use_bf16 and not TrainEngine(model).use_bf16  # 'auto' is off on CPU
    log_probs = engine.compute_log_probs(batch)
    mask = batch["response_mask"].bool()
    assert log_probs.dtype == torch.float32
    # bf16 matmuls: close to the fp32 rollout, not equal
    assert (log_probs - batch["rollout_log_probs"])[mask].abs().max() < 0.1
    metrics = engine.update(batch, PG)
    assert metrics["actor/nan_skipped"] == 0 and math.isfinite(metrics["actor/grad_norm"])
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_lr_zero_leaves_every_weight_unchanged(tokenizer, model):
    batch = rollout(tokenizer, model)
    engine = TrainEngine(model, TrainEngineConfig(lr=0.0, weight_decay=0.1, mini_batch_size=4, ppo_epochs=2))
    before = weights(model)
    terms = PG + [("kl_loss", 0.1, {}), ("entropy_bonus", 0.01, {})]
    metrics = engine.update(batch, terms)
    assert metrics["actor/grad_norm"] > 0  # gradients were there; lr 0 made them harmless
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def _one_update(model, batch, terms, **config):
    # float64: Adam's first step is ~ lr * g / (|g| + eps), which magnifies float32 rounding of
    # gradients that nearly cancel (|g| ~ eps) far beyond 1e-6; in float64 that rounding is ~1e-16.
    engine = TrainEngine(copy.deepcopy(model).double(), TrainEngineConfig(lr=1e-2, max_grad_norm=0.5, **config))
    return engine.update(batch, terms), weights(engine.module)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_of_2_give_the_same_update_as_one_batch_of_8(tokenizer, model, agg):
    batch = rollout(tokenizer, model, temperature=1.3)
    terms = [("ppo_clip", 1.0, {"loss_agg_mode": agg}), ("kl_loss", 0.5, {"loss_agg_mode": agg}),
             ("entropy_bonus", 0.01, {"loss_agg_mode": agg})]
    whole_metrics, whole = _one_update(model, batch, terms)
    micro_metrics, micro = _one_update(model, batch, terms, micro_batch_size=2)
    changed = max((whole[k] - p.double()).abs().max().item() for k, p in weights(model).items())
    assert changed > 1e-3  # the step really moved the weights
    for name in whole:
        assert (whole[name] - micro[name]).abs().max().item() <= 1e-6, name
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac"):
        assert math.isclose(whole_metrics[key], micro_metrics[key], rel_tol=1e-5, abs_tol=1e-6), key


def test_nan_loss_skips_the_step_without_crashing(tokenizer, model):
    batch = rollout(tokenizer, model)
    adv = batch["advantages"].clone()
    adv[0, 0] = float("nan")  # a valid position (every response has at least one token)
    engine = TrainEngine(model, TrainEngineConfig(lr=1e-2, mini_batch_size=4))
    before = weights(model)
    metrics = engine.update(batch.with_fields(advantages=adv), PG)
    assert metrics["actor/nan_skipped"] == 1.0  # the first mini-batch; the second one stepped
    assert all(math.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())  # the update gave its gradient buffer back


def test_one_flat_gradient_buffer_gives_the_numbers_of_gradients_made_per_parameter(tokenizer, model):
    batch = rollout(tokenizer, model, n=2)
    config = TrainEngineConfig(lr=1e-2, weight_decay=0.1, mini_batch_size=4, micro_batch_size=2)
    flat, fresh = TrainEngine(copy.deepcopy(model), config), TrainEngine(copy.deepcopy(model), config)
    fresh.flat_gradients = False
    storages = {"flat": [], "fresh": []}
    for name, engine in (("flat", flat), ("fresh", fresh)):
        engine.optimizer.register_step_pre_hook(lambda opt, args, kwargs, seen=storages[name]: seen.append(
            {p.grad.untyped_storage().data_ptr() for group in opt.param_groups for p in group["params"]}))
    for _ in range(3):
        assert flat.update(batch, PG) == fresh.update(batch, PG)
    assert all(torch.equal(a, b) for a, b in zip(flat.module.state_dict().values(), fresh.module.state_dict().values()))
    # several mini-batches an update: every optimizer step's gradients shared one storage, the update's
    assert len(storages["flat"]) == len(storages["fresh"]) > 3 and all(len(step) == 1 for step in storages["flat"])
    assert storages["flat"][0] == storages["flat"][1]
    assert all(len(step) > 1 for step in storages["fresh"])  # each backward made its own
    assert all(p.grad is None for p in flat.module.parameters())  # given back: none resident between updates


@pytest.mark.parametrize("rows_contribute", [True, False])
def test_an_update_gives_its_gradient_buffer_back(tokenizer, model, rows_contribute):
    # the buffer is the model's size: none of its slots may outlive the update (the rollout decodes in between),
    # also where no row contributes and the optimizer steps on the zeroed slots
    batch = rollout(tokenizer, model)
    if not rows_contribute:
        batch = batch.with_fields(advantages=torch.zeros_like(batch["advantages"]))
    engine = TrainEngine(model, TrainEngineConfig(lr=1e-2, mini_batch_size=4, weight_decay=0.0))
    slots = []
    engine.optimizer.register_step_pre_hook(lambda opt, args, kwargs: slots.extend(
        weakref.ref(p.grad) for group in opt.param_groups for p in group["params"] if p.grad is not None))
    before = weights(model)
    engine.update(batch, PG)
    assert len(slots) == 2 * len(list(model.parameters()))  # two mini-batches, every parameter a slot
    assert all(ref() is None for ref in slots) and all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items()) == rows_contribute


def test_a_gradient_slot_no_backward_touches_leaves_its_parameter_alone(tokenizer, model):
    # AdamW skips a parameter whose gradient is None; a zeroed slot of the flat buffer that no backward touched is
    # set back to None, or weight decay (and the moments of earlier steps) would move a parameter no loss depends on
    model.register_parameter("unused", torch.nn.Parameter(torch.ones(3)))
    engine = TrainEngine(model, TrainEngineConfig(lr=1e-2, weight_decay=0.1))
    model.unused.grad = torch.full((3,), 0.5)  # a gradient left from elsewhere
    head = model.lm_head.weight.detach().clone()
    engine.update(rollout(tokenizer, model), PG)
    assert torch.equal(model.unused.detach(), torch.ones(3)) and model.unused.grad is None
    assert not torch.equal(model.lm_head.weight.detach(), head)


def test_metric_keys_and_lr_schedule(tokenizer, model):
    batch = rollout(tokenizer, model)
    config = TrainEngineConfig(lr=1e-3, warmup_steps=2, lr_schedule="cosine", total_steps=4, mini_batch_size=4)
    engine = TrainEngine(model, config, metric_prefix="policy")
    lrs = [engine.update(batch, PG)["policy/lr"] for _ in range(4)]
    # warm-up 1/2, 2/2; then cosine over 2 steps: progress 0 -> 1, progress 1/2 -> 0.5
    assert lrs == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4])
    metrics = engine.update(batch, PG)
    assert {"policy/pg_loss", "policy/pg_clipfrac", "policy/ppo_kl", "policy/entropy", "policy/grad_norm",
            "policy/loss", "policy/lr", "policy/nan_skipped"} <= set(metrics)
    engine.set_lr(1e-2)  # after the decay (progress clipped at 1, min ratio 0) the factor is 0
    assert engine.lr == 0.0


def test_state_dict_round_trip_continues_identically(tokenizer, model):
    batch = rollout(tokenizer, model)
    config = TrainEngineConfig(lr=1e-2, warmup_steps=3, shuffle=True, mini_batch_size=4)
    a = TrainEngine(model, config)
    a.update(batch, PG)
    b = TrainEngine(tiny_model(tokenizer, seed=5), config)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    ma, mb = a.update(batch, PG), b.update(batch, PG)
    assert ma == mb
    for name, tensor in a.module.state_dict().items():
        assert torch.equal(tensor, b.module.state_dict()[name]), name


def test_bad_loss_terms_and_fields_are_named(tokenizer, model):
    batch = rollout(tokenizer, model)
    engine = TrainEngine(model)
    with pytest.raises(OpError, match="unknown op 'nope'"):
        engine.update(batch, [("nope", 1.0, {})])
    with pytest.raises(OpError, match="clip_lo"):
        engine.update(batch, [("ppo_clip", 1.0, {"clip_lo": 0.2})])
    with pytest.raises(OpError, match="'gae' is a compute op"):
        engine.update(batch, [("gae", 1.0, {})])
    with pytest.raises(OpError, match="value_preds"):
        engine.update(batch.with_fields(returns=batch["advantages"], values=batch["advantages"]), [("value_clip", 1.0, {})])
    with pytest.raises(OpError, match="'advantages'"):
        engine.update(batch.drop("advantages"), PG)


@register_op("t_per_token_loss", model_inputs=("log_probs: float32[B, R]",),
             inputs=("advantages: float32[B, R]", "response_mask: float32[B, R]"), outputs=("loss: float32",),
             kind="loss", replace=True)
def t_per_token_loss(log_probs, advantages, response_mask, *, global_tokens=None, global_seqs=None):
    """A custom loss that forgot to reduce: ``(b, r)`` where a scalar is due."""
    return -advantages * log_probs * response_mask


def test_a_loss_op_returning_a_non_scalar_is_named(tokenizer, model):
    engine = TrainEngine(model)
    with pytest.raises(OpError, match=r"loss op 't_per_token_loss' returned a tensor of shape \[8, 8\] as its loss; "
                                      r"a loss op returns a scalar"):
        engine.update(rollout(tokenizer, model), [("t_per_token_loss", 1.0, {})])


@pytest.mark.parametrize("mini_batch_size", [None, 4])
def test_skipping_zero_advantage_rows_leaves_the_update_unchanged(tokenizer, model, mini_batch_size):
    batch = rollout(tokenizer, model, temperature=1.3)
    adv = batch["advantages"].clone()
    adv[4:] = 0.0  # with mini-batches of 4 the whole second mini-batch vanishes: Adam must still step
    adv[1] = 0.0
    batch = batch.with_fields(advantages=adv)
    config = dict(mini_batch_size=mini_batch_size, ppo_epochs=2, weight_decay=0.1)
    _, skipped = _one_update(model, batch, PG, **config)
    _, full = _one_update(model, batch, PG, skip_vanishing_rows=False, **config)
    for name in full:
        assert (full[name] - skipped[name]).abs().max().item() <= 1e-12, name
    # A term that does not vanish with the advantages (kl_loss) keeps every row.
    _, with_kl = _one_update(model, batch, PG + [("kl_loss", 0.5, {})], **config)
    _, with_kl_full = _one_update(model, batch, PG + [("kl_loss", 0.5, {})], skip_vanishing_rows=False, **config)
    assert all(torch.equal(with_kl[k], with_kl_full[k]) for k in with_kl)
