"""W&B (offline) and MLflow (local file store) trackers: a run's metrics reach each, by step.

Needs the optional packages wandb and mlflow-skinny (or mlflow).
"""
from __future__ import annotations

import pytest

from hybridflow import PPOConfig
from hybridflow.trainer.trackers import MlflowTracker, WandbTracker


def test_mlflow_tracker_logs_every_metric_by_step(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = PPOConfig(output_dir=str(tmp_path), project_name="hf-test", experiment_name="run-1")
    tracker = MlflowTracker(config, tmp_path)
    tracker.log({"actor/pg_loss": 0.5, "val/score/mean@4": 0.25}, 1)
    tracker.log({"actor/pg_loss": -0.5}, 2)
    tracker.close()
    client = mlflow.tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("hf-test").experiment_id])
    assert run.info.run_name == "run-1" and run.data.params["actor_lr"] == "1e-06"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "actor/pg_loss")] == [(1, 0.5), (2, -0.5)]
    assert run.data.metrics["val/score/mean_at_4"] == 0.25  # '@' is not allowed in MLflow names


def test_wandb_tracker_runs_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = PPOConfig(output_dir=str(tmp_path), project_name="hf-test", experiment_name="run-1")
    tracker = WandbTracker(config, tmp_path)
    assert tracker.run.offline and tracker.run.name == "run-1" and tracker.run.config["actor_lr"] == pytest.approx(1e-6)
    tracker.log({"actor/pg_loss": 0.5}, 1)
    tracker.log({"actor/pg_loss": -0.5, "critic/score/mean": 0.75}, 2)
    assert tracker.run.summary["actor/pg_loss"] == -0.5 and tracker.run.summary["critic/score/mean"] == 0.75
    tracker.close()
    (log_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    assert log_file.stat().st_size > 0
