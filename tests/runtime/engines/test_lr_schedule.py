"""The learning-rate factor (linear warm-up, then constant / linear / cosine decay), and the train engine
stepping it once per training step: skipped updates (non-finite loss, zero advantage) and resumed runs included."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from engine_testkit import prompt_batch, tiny_model

from hybridflow.errors import CheckpointError
from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig, lr_factor


def factors(n, **kw):
    return [lr_factor(k, **kw) for k in range(n)]


def test_warmup_then_constant():
    # W = 4: (k + 1) / 4 for k < 4, then 1
    assert factors(6, warmup_steps=4, schedule="constant", total_steps=None, min_lr_ratio=0.0) == [0.25, 0.5, 0.75, 1, 1, 1]


def test_linear_decay_to_the_floor():
    # W = 2, N = 6, m = 0.2: progress (k - 2) / 4 -> f = 0.2 + 0.8 (1 - p)
    got = factors(8, warmup_steps=2, schedule="linear", total_steps=6, min_lr_ratio=0.2)
    assert got == pytest.approx([0.5, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2])


def test_cosine_decay():
    # W = 0, N = 4: p = k / 4 -> f = (1 + cos(pi p)) / 2: 1, 0.8536, 0.5, 0.1464, 0
    got = factors(5, warmup_steps=0, schedule="cosine", total_steps=4, min_lr_ratio=0.0)
    assert got == pytest.approx([1.0, 0.853553, 0.5, 0.146447, 0.0], abs=1e-6)


def test_decay_needs_total_steps():
    with pytest.raises(ValueError, match="total_steps"):
        TrainEngineConfig(lr_schedule="cosine")
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainEngineConfig(mini_batch_size=2, micro_batch_size=4)


# -- the schedule in a train engine: it follows training steps (update calls), taken or skipped ----

# W = 2, N = 6, m = 0.1, lr = 1e-2. f(0) = 1/2, f(1) = 1; then p = (k - 2) / 4 and
# f = 0.1 + 0.9 (1 + cos(pi p)) / 2: k = 2: 1, k = 3: 0.1 + 0.9 * 0.853553 = 0.868198,
# k = 4: 0.1 + 0.9 * 0.5 = 0.55, k = 5: 0.1 + 0.9 * 0.146447 = 0.231802.
SCHEDULE = dict(lr=1e-2, warmup_steps=2, lr_schedule="cosine", total_steps=6, min_lr_ratio=0.1)
EXPECTED_LR = [5e-3, 1e-2, 1e-2, 8.68198e-3, 5.5e-3, 2.31802e-3]
PG = [("ppo_clip", 1.0, {})]


def _batch(tokenizer, engine, seed=0) -> dict:
    """8 prompts with 4 random response tokens each, old log-probs from ``engine``, random advantages."""
    prompts, gen = prompt_batch(tokenizer), torch.Generator().manual_seed(seed)
    rows = len(prompts["prompt_ids"])
    batch = {"prompt_ids": prompts["prompt_ids"], "prompt_mask": prompts["prompt_mask"],
             "response_ids": torch.randint(3, len(tokenizer), (rows, 4), generator=gen),
             "response_mask": torch.ones(rows, 4, dtype=torch.long)}
    advantages = torch.randn(rows, 4, generator=gen)
    return {**batch, "old_log_probs": engine.compute_log_probs(batch), "advantages": advantages}


def _with_advantages(batch: dict, kind: str) -> dict:
    """The batch with its advantages made: ``nan_all`` (non-finite loss in both mini-batches of 4),
    ``nan_first`` (in the first one only), ``zero`` (every row vanishes) or left as they are (``ok``)."""
    adv = batch["advantages"].clone()
    if kind == "nan_all":
        adv[[0, 4], 0] = float("nan")
    elif kind == "nan_first":
        adv[0, 0] = float("nan")
    elif kind == "zero":
        adv.zero_()
    return {**batch, "advantages": adv}


def _run(engine: TrainEngine, batch: dict, kinds: list[str]) -> tuple[list[dict], list[list[float]]]:
    """The metrics of one update per entry of ``kinds`` and the lr of every optimizer step each update took
    (read by a torch step pre-hook), with every warning an error."""
    used: list[list[float]] = []

    def record(optimizer, args, kwargs):
        used[-1].append(optimizer.param_groups[0]["lr"])

    hook = engine.optimizer.register_step_pre_hook(record)
    metrics = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for kind in kinds:
                used.append([])
                metrics.append(engine.update(_with_advantages(batch, kind), PG))
    finally:
        hook.remove()
    return metrics, used


def test_lr_follows_training_steps_taken_or_skipped(tokenizer, model):
    # two mini-batches of 4 per update: step 0 skips both (non-finite loss: torch's LambdaLR warned
    # "lr_scheduler.step() before optimizer.step()" there), step 2 skips its first mini-batch, step 3's
    # rows all vanish (zero advantage: no forward, zero-gradient optimizer steps)
    engine = TrainEngine(model, TrainEngineConfig(**SCHEDULE, mini_batch_size=4))
    batch = _batch(tokenizer, engine)
    metrics, used = _run(engine, batch, ["nan_all", "ok", "nan_first", "zero", "ok", "ok"])
    assert [m["actor/nan_skipped"] for m in metrics] == [2, 0, 1, 0, 0, 0]
    assert [m["actor/lr"] for m in metrics] == pytest.approx(EXPECTED_LR, rel=1e-5)
    taken = [0, 2, 1, 2, 2, 2]  # optimizer steps of each update
    assert used == [pytest.approx([lr] * n, rel=1e-5) for lr, n in zip(EXPECTED_LR, taken)]
    assert engine.scheduler.training_step == 6
    assert engine.lr == pytest.approx(1e-3)  # step 6: the end of the decay, m * lr


def test_resume_in_the_middle_keeps_the_schedule_position(tokenizer, model):
    config = TrainEngineConfig(**SCHEDULE, mini_batch_size=4)
    first = TrainEngine(model, config)
    batch = _batch(tokenizer, first)
    _run(first, batch, ["nan_all", "ok", "nan_first"])
    resumed = TrainEngine(tiny_model(tokenizer, seed=5), config)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert resumed.scheduler.training_step == 3 and resumed.lr == pytest.approx(EXPECTED_LR[3], rel=1e-5)
    rest = ["zero", "ok", "ok"]
    (on, on_used), (again, again_used) = _run(first, batch, rest), _run(resumed, batch, rest)
    assert [m["actor/lr"] for m in again] == pytest.approx(EXPECTED_LR[3:], rel=1e-5)
    assert again == on and again_used == on_used


def test_an_older_checkpoints_lambda_lr_state_loads_at_its_position(tokenizer, model):
    # before TrainingStepSchedule the "scheduler" entry was torch's LambdaLR state, stepped once per update
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=1e-2)
    old = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0)
    for _ in range(4):
        param.grad = torch.ones(1)
        optimizer.step()
        old.step()
    engine = TrainEngine(model, TrainEngineConfig(**SCHEDULE))
    engine.load_state_dict({**copy.deepcopy(engine.state_dict()), "scheduler": old.state_dict()})
    assert engine.scheduler.training_step == 4 and engine.lr == pytest.approx(EXPECTED_LR[4], rel=1e-5)
    with pytest.raises(CheckpointError, match="neither training_step and base_lr nor a torch LambdaLR"):
        engine.load_state_dict({**engine.state_dict(), "scheduler": {"epoch": 3}})
    with pytest.raises(CheckpointError, match="malformed: training step -1"):
        engine.load_state_dict({**engine.state_dict(), "scheduler": {"training_step": -1, "base_lr": 1e-2}})
