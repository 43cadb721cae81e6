"""``hybridflow simulate`` and ``hybridflow profile`` take a run file and see what its run derives (the run spec)."""
from __future__ import annotations

import re
from pathlib import Path

from hybridflow.cli import main

GRPO = str(Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_arith.yaml")


def test_simulate_a_run_file_uses_its_graph_models_and_batch(capsys):
    assert main(["simulate", GRPO, "rollout_batch_size=8", "n_samples=4", "--gpus", "1,8", "--brief"]) == 0
    printed = capsys.readouterr().out
    # the config's batch (8 prompts, the built-in task's 5-token prompts, max_response_length 3), not the paper's
    assert "grpo: 8 prompts x 5 + 3 tokens per iteration, 1 epoch(s) of 1 optimizer steps" in printed
    assert re.search(r"^tiny_model\s+1 ", printed, re.M) and re.search(r"^tiny_model\s+8 ", printed, re.M)
    assert main(["simulate", GRPO, "--models", "llama2-7b"]) == 1
    assert "--models (actor_model_name=...)" in capsys.readouterr().err


def test_profile_a_run_file_measures_what_its_calibration_measures(capsys):
    assert main(["profile", GRPO]) == 0
    printed = capsys.readouterr().out
    assert "tiny_model: 126,656 parameters" in printed and "1 thread(s)" in printed  # the config's num_threads: 1
    assert "fitted local-cpu+calibrated" in printed
    assert main(["profile", GRPO, "calibrate=false"]) == 1
    assert "would not calibrate" in capsys.readouterr().err
    assert main(["profile", GRPO, "--threads", "2"]) == 1
    assert "--threads (num_threads=...)" in capsys.readouterr().err
    assert main(["profile"]) == 1
    assert "give a run file" in capsys.readouterr().err
