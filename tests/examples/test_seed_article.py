"""examples/seed_article.py: the seed article's snippets, with verl read as hybridflow, run unchanged."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "seed_article.py"
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # steady on a busy 2-core machine


def test_seed_article_runs_unchanged(tmp_path):
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == __import__("hybridflow").__version__
    names = eval(lines[1])  # the printed dir(hybridflow)  # noqa: S307 - our own subprocess's output
    assert {"Trainer", "RolloutManager", "PPOConfig"} <= set(names)
    assert "has no trained score head" in done.stderr  # the stand-in reward model is a causal LM
    rows = [json.loads(line) for line in (tmp_path / "runs" / "hybridflow" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "actor/pg_loss" in rows[1]  # the GRPO run, the last one


def test_the_snippets_are_the_articles():
    """The lines between the markers are the article's code; only the model names and max_steps differ."""
    text = EXAMPLE.read_text(encoding="utf-8")
    for line in ("from hybridflow import PPOConfig", "trainer = PPOTrainer(config=config)", "trainer.train()",
                 "from hybridflow.algorithms import GRPOTrainer", "trainer = GRPOTrainer(config=config)",
                 '"actor_lora": "cuda:1",', "from hybridflow.utils import RemoteRewardModel",
                 'api_url="http://localhost:8000/v1/rank",', 'model_name="rm-bloomz"',
                 "trainer.set_reward_model(rm_client)", "print(dir(hybridflow))", "batch_size=4,", "rollout_batch_size=8"):
        assert line in text, line


def test_minimal_ppo_example_runs(tmp_path):
    script = EXAMPLE.parent / "quickstart" / "minimal_ppo.py"
    done = subprocess.run([sys.executable, str(script), "--steps", "2"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "greedy accuracy" in done.stdout and "answers: [" in done.stdout
    assert (tmp_path / "runs" / "minimal_ppo" / "checkpoints" / "step_00000002").is_dir()
