"""`hybridflow run CONFIG.yaml key=value ...`: trains, writes what the summary names, and resumes on a rerun."""
from __future__ import annotations

import json

from hybridflow.cli import main


def test_run_then_rerun_with_more_steps_resumes(tmp_path, tiny_model_dir, capsys):
    config = tmp_path / "grpo.yaml"
    config.write_text(f"algorithm: grpo\nactor_model_name: {tiny_model_dir}\nrollout_batch_size: 4\nn_samples: 2\n"
                      f"batch_size: 8\nactor_lr: 1.0e-3\nval_samples: 1\nsave_freq: 1\nprogress_bar: false\n"
                      f"trackers: [console, jsonl]\nnum_threads: 1\noutput_dir: {tmp_path / 'run'}\n")
    assert main(["run", str(config), "max_steps=2"]) == 0
    first = capsys.readouterr().out
    assert "done: 2 steps of grpo" in first and "checkpoint: " in first
    assert (tmp_path / "run" / "grpo_graph.dot").is_file() and (tmp_path / "run" / "plan.json").is_file()
    assert main(["run", str(config), "max_steps=3"]) == 0  # resume='auto': steps 1-2 are not redone
    captured = capsys.readouterr()
    assert "resumed from" in captured.err and "step_00000002" in captured.err
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]


def test_fields_lists_every_field(capsys):
    assert main(["run", "--fields"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("algorithm: ppo | grpo") and "rollout_batch_size (default 8): Prompts sampled per training step." in text


def test_fields_lists_the_sub_fields_of_settings_records(capsys):
    assert main(["run", "--fields"]) == 0
    text = capsys.readouterr().out
    for role in ("actor", "critic"):
        for sub in ("name", "warmup_steps", "warmup_ratio", "min_lr_ratio", "decay_steps"):
            assert f"\n  {role}_lr_schedule.{sub} (default " in text, (role, sub)
