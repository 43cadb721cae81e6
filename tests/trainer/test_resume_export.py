"""Resumption is bit-identical, and an exported checkpoint is a transformers model that generates the same tokens."""
from __future__ import annotations

import json

import pytest
import torch

from hybridflow.errors import CheckpointError, ConfigError, OutputDirError
from hybridflow.trainer import PPOTrainer, SafeRLHFTrainer, Trainer
from hybridflow.trainer.metrics import JsonlTracker
from run_testkit import StopAt, learned


def _run_config(fast_config, out, **kw):
    # eval_freq=2: validation runs at step 2 and 4 too, with its own generator, and must not disturb training
    return fast_config(output_dir=str(out), max_steps=6, save_freq=3, eval_freq=2, batch_size=4, **kw)


def test_resume_after_step_3_reproduces_steps_4_to_6(fast_config, tmp_path):
    full = PPOTrainer(config=_run_config(fast_config, tmp_path / "full")).train()
    with pytest.raises(KeyboardInterrupt):  # killed during step 4 (metrics written), after step 3's checkpoint
        trackers = [JsonlTracker(tmp_path / "cut" / "metrics.jsonl"), StopAt(4)]
        PPOTrainer(config=_run_config(fast_config, tmp_path / "cut"), trackers=trackers).train()
    resumed_trainer = PPOTrainer(config=_run_config(fast_config, tmp_path / "cut"))
    resumed = resumed_trainer.train()
    assert resumed_trainer.resumed_from.name == "step_00000003"
    assert len(full) == 6 and len(resumed) == 3
    for step, (a, b) in enumerate(zip(full[3:], resumed), start=4):
        assert learned(a) == learned(b), f"step {step} differs"
    assert any(a["actor/pg_loss"] != full[3]["actor/pg_loss"] for a in full[4:])  # the metrics do move
    # the resumed metrics file has each step once, as the uninterrupted one
    steps = [json.loads(line)["step"] for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4, 5, 6]


def test_train_on_a_finished_run_returns_its_history(fast_config, tmp_path):
    config = fast_config(output_dir=str(tmp_path / "run"), max_steps=2, save_freq=2, eval_freq=2, batch_size=4)
    first = PPOTrainer(config=config).train()
    again = PPOTrainer(config=config)
    history = again.train()  # resumed at step 2 of 2: nothing left to run
    assert again.resumed_from.name == "step_00000002" and again.step == 2
    assert len(history) == len(first) == 2
    for ran, recorded in zip(first, history):
        assert recorded.keys() == ran.keys() and recorded == pytest.approx(ran, rel=1e-12, abs=0)


def test_safe_rlhf_resume_continues_the_lagrange_multiplier(fast_config, tmp_path):
    # lambda moves every step (cost limit 0.1, lr 0.5); after a kill in step 4 the resumed run must
    # start step 4 from the lambda of step 3's checkpoint, not from the configured initial value
    safe = dict(cost_fn="hybridflow_ops.rewards.arithmetic:long_answer_cost", cost_limit=0.1, lagrange_lambda=0.2,
                lambda_lr=0.5)
    full = SafeRLHFTrainer(config=_run_config(fast_config, tmp_path / "full", **safe)).train()
    with pytest.raises(KeyboardInterrupt):
        SafeRLHFTrainer(config=_run_config(fast_config, tmp_path / "cut", **safe), trackers=[StopAt(4)]).train()
    resumed = SafeRLHFTrainer(config=_run_config(fast_config, tmp_path / "cut", **safe)).train()
    assert len(full) == 6 and len(resumed) == 3
    for step, (a, b) in enumerate(zip(full[3:], resumed), start=4):
        assert learned(a) == learned(b), f"step {step} differs"
    assert resumed[0]["safe/lagrange_lambda"] != 0.2 and len({m["safe/lagrange_lambda"] for m in full}) == 6


def test_resume_refuses_another_algorithm(fast_config, tmp_path):
    PPOTrainer(config=fast_config(max_steps=1, save_freq=1)).train()
    with pytest.raises(CheckpointError, match="written by a ppo run; this trainer runs grpo"):
        Trainer(fast_config(max_steps=2, save_freq=1), algorithm="grpo").train()


def test_resume_never_refuses_a_folder_with_checkpoints_and_deletes_nothing(fast_config, tmp_path):
    PPOTrainer(config=fast_config(max_steps=2, save_freq=1)).train()
    with pytest.raises(OutputDirError, match=r"holds 2 checkpoint\(s\).*nothing was deleted.*new output_dir.*"
                                             r"resume='auto'.*overwrite=true"):
        PPOTrainer(config=fast_config(max_steps=1, save_freq=1, resume="never")).train()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_00000001", "step_00000002"]


def test_resume_never_with_overwrite_starts_over(fast_config, tmp_path):
    PPOTrainer(config=fast_config(max_steps=2, save_freq=1)).train()
    trainer = PPOTrainer(config=fast_config(max_steps=1, save_freq=1, resume="never", overwrite=True))
    assert len(trainer.train()) == 1 and trainer.resumed_from is None
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_00000001"]


def test_overwrite_needs_resume_never(fast_config):
    with pytest.raises(ConfigError, match="overwrite=true .* needs resume='never'"):
        fast_config(overwrite=True)


def test_export_generates_the_same_tokens_as_the_trained_actor(fast_config, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from hybridflow.cli import main
    from hybridflow.data import load_tokenizer, make_prompt_batch
    from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams

    trainer = PPOTrainer(config=fast_config(max_steps=2, save_freq=2))
    trainer.train()
    assert main(["export", str(trainer.output_dir), "--to", str(tmp_path / "hf")]) == 0
    assert "exported to" in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    actor = trainer.policy_model()  # the trained weights, from the worker (an export plan)
    trained, loaded = actor.state_dict(), exported.state_dict()
    assert trained.keys() == loaded.keys() and all(torch.equal(trained[k], loaded[k]) for k in trained)
    tokenizer = load_tokenizer(tmp_path / "hf")
    prompts = make_prompt_batch(trainer.val_rows[:20], tokenizer)
    greedy = SamplingParams(greedy=True, max_new_tokens=6, stop_at_eos=False)
    ours = HFRolloutEngine(actor, tokenizer=tokenizer).generate(prompts, greedy)["response_ids"]
    theirs = HFRolloutEngine(exported, tokenizer=tokenizer).generate(prompts, greedy)["response_ids"]
    assert torch.equal(ours, theirs)
    # transformers' own generate agrees with the exported folder too
    row = prompts["prompt_ids"][:1]
    out = exported.generate(row, attention_mask=prompts["prompt_mask"][:1], max_new_tokens=6, do_sample=False,
                            eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(out[0, row.shape[1]:], ours[0])
