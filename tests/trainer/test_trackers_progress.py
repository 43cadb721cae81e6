"""Trackers (TensorBoard event files readable by TensorBoard's own reader, JSONL), the progress bar, the NaN guard."""
from __future__ import annotations

import io
import json
import math

import pytest

from hybridflow.errors import ConfigError, ContractError, ExecutionError
from hybridflow.runtime import contracts
from hybridflow.trainer import PPOTrainer
from hybridflow.trainer.metrics import JsonlTracker, nan_streak
from hybridflow.trainer.progress import StepProgress
from hybridflow.trainer.trackers import TensorBoardTracker, build_trackers


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_training_writes_a_tensorboard_log_that_tensorboard_reads(fast_config, tmp_path):
    config = fast_config(max_steps=2, trackers=("jsonl", "tensorboard"))
    history = PPOTrainer(config=config).train()
    scalars = _scalars(tmp_path / "run" / "tensorboard")
    for key in ("actor/pg_loss", "critic/vf_loss", "critic/score/mean", "timing_s/gen", "timing_s/step",
                "perf/throughput", "response_length/mean"):
        assert [s for s, _ in scalars[key]] == [1, 2], key
        assert scalars[key][1][1] == pytest.approx(history[1][key], rel=1e-6)
    assert [s for s, _ in scalars["val/score/greedy"]] == [0, 2]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[2]["actor/pg_loss"] == history[1]["actor/pg_loss"]


def test_resumed_tensorboard_log_drops_redone_steps(tmp_path):
    first = TensorBoardTracker(tmp_path)
    for step in (1, 2, 3):
        first.log({"x": float(step)}, step)
    first.close()
    resumed = TensorBoardTracker(tmp_path, resume_step=1)  # steps 2 and 3 are redone
    for step in (2, 3):
        resumed.log({"x": 10.0 * step}, step)
    resumed.close()
    assert _scalars(tmp_path)["x"] == [(1, 1.0), (2, 20.0), (3, 30.0)]


def test_jsonl_resume_keeps_earlier_steps_only(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"note": "no step"}\n{"step": 2, "a": 2}\n{"step": 3, "a"')  # cut mid-line by a kill
    tracker = JsonlTracker(path, resume_step=1)
    tracker.log({"a": 5.0}, 2)
    tracker.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": 1, "a": 1}, {"note": "no step"}, {"step": 2, "a": 5.0}]
    JsonlTracker(path).close()  # a fresh run starts a new file and keeps the earlier one aside
    assert path.read_text() == ""
    assert [json.loads(line)["step"] for line in (tmp_path / "m.1.jsonl").read_text().splitlines()[::2]] == [1, 2]
    path.write_text('{"step": 7}\n')
    JsonlTracker(path).close()
    assert (tmp_path / "m.2.jsonl").read_text() == '{"step": 7}\n' and path.read_text() == ""


def test_jsonl_resume_appends_without_rewriting_when_nothing_is_dropped(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    inode = path.stat().st_ino
    tracker = JsonlTracker(path, resume_step=2)
    tracker.log({}, 3)
    tracker.close()
    assert path.stat().st_ino == inode
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_jsonl_resume_killed_while_rewriting_loses_nothing(tmp_path, monkeypatch):
    # The dropped steps are cut out in a temporary file renamed over the old one: a kill before
    # the rename leaves the old file whole (the next resume drops the same steps again).
    import os

    path = tmp_path / "m.jsonl"
    before = '{"step": 1}\n{"step": 2}\n{"step": 3}\n'
    path.write_text(before)

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        JsonlTracker(path, resume_step=1)
    assert path.read_text() == before
    monkeypatch.undo()
    JsonlTracker(path, resume_step=1).close()
    assert path.read_text() == '{"step": 1}\n'


def test_missing_tracker_package_is_an_error_only_when_asked_for(fast_config, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="tracker 'wandb' needs the 'wandb' package: pip install wandb"):
        build_trackers(fast_config(trackers=("console", "wandb")), tmp_path, None)


def test_progress_bar_shows_reward_and_phase():
    stream = io.StringIO()
    bar = StepProgress(3, enabled=True, force=True, stream=stream)
    bar.phase("actor.generate")
    bar.step_done({"critic/score/mean": 0.5})
    bar.step_done({"critic/score/mean": 0.0})
    bar.close()
    text = stream.getvalue()
    assert "actor.generate" in text and "reward=0.250" in text and "2/3" in text
    assert bar.mean_reward == 0.25


def test_nan_streak_counts_resets_and_aborts_naming_step_and_metric():
    bad = {"actor/nan_skipped": 1.0, "critic/nan_skipped": 0.0, "critic/vf_loss": math.nan}
    assert nan_streak({"actor/nan_skipped": 0.0}, 1, 0, 3) == 0
    assert nan_streak(bad, 2, 0, 3) == 1
    assert nan_streak({"actor/nan_skipped": 0.0}, 3, 1, 3) == 0
    with pytest.raises(ExecutionError, match=r"step 7: .* 3 steps in a row \(actor/nan_skipped; non-finite metrics: critic/vf_loss\)"):
        nan_streak(bad, 7, 2, 3)


def test_training_with_exploding_rewards_aborts(fast_config, tmp_path, monkeypatch):
    """A reward of 3e38 is finite, but squared in the value loss it is not: every update is skipped."""
    module = tmp_path / "huge_reward.py"
    module.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 3e38\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = fast_config(max_steps=5, reward_fn="huge_reward:compute_score", unfinished_score=None, max_nan_steps=2)
    # The run-time contract checks name the first op whose output is not finite: PPO's whitening of advantages.
    with pytest.raises(ContractError, match=r"node 'whiten' \(op 'whiten'\), output 'advantages': declared finite but holds nan"):
        PPOTrainer(config=config).train()
    # Without them, the updates skip the non-finite mini-batches until max_nan_steps of them in a row.
    monkeypatch.setenv(contracts.ENV_VAR, "0")
    with pytest.raises(ExecutionError, match=r"step 2: the loss or gradient norm was not finite in 2 steps in a row \(actor/nan_skipped, critic/nan_skipped"):
        PPOTrainer(config=config.model_copy(update={"output_dir": str(tmp_path / "unchecked")})).train()
