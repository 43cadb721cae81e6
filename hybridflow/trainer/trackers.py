"""Trackers that send step metrics to TensorBoard, Weights & Biases and MLflow, and the table that builds them.

Each tracker has ``log(metrics, step)`` and ``close()``. TensorBoard writes event files
under ``<output_dir>/tensorboard``; W&B runs offline (files under ``<output_dir>/wandb``)
unless ``WANDB_MODE`` says otherwise; MLflow logs to ``<output_dir>/mlruns`` unless
``MLFLOW_TRACKING_URI`` is set. A resumed run continues the same TensorBoard log
(events after the resumed step are purged, as they are redone).
"""
from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Callable, Mapping

from ..errors import ConfigError
from .config import PPOConfig
from .metrics import ConsoleTracker, JsonlTracker, Tracker

__all__ = ["TensorBoardTracker", "WandbTracker", "MlflowTracker", "TRACKER_BUILDERS", "TRACKER_PACKAGES", "build_trackers"]

log = logging.getLogger("hybridflow.trainer")


class TensorBoardTracker:
    """Scalars to TensorBoard event files in ``log_dir`` (``torch.utils.tensorboard.SummaryWriter``)."""

    def __init__(self, log_dir: str | Path, *, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        log_dir = Path(log_dir)
        if resume_step is None and log_dir.is_dir():  # a fresh run: drop an earlier run's events
            for old in log_dir.glob("events.out.tfevents.*"):
                old.unlink()
        purge = resume_step + 1 if resume_step is not None else None
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, float(value), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """Metrics to a Weights & Biases run (offline unless ``WANDB_MODE`` is set)."""

    def __init__(self, config: PPOConfig, output_dir: Path, *, resume_step: int | None = None):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=config.project_name, name=config.experiment_name or output_dir.resolve().name,
                              dir=str(output_dir), mode=os.environ.get("WANDB_MODE", "offline"),
                              config=config.model_dump(mode="json"), reinit="finish_previous")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step, commit=True)  # one call per step: write the row now

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """Metrics to an MLflow run (a local ``mlruns`` folder unless ``MLFLOW_TRACKING_URI`` is set)."""

    def __init__(self, config: PPOConfig, output_dir: Path, *, resume_step: int | None = None):
        import mlflow

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # a local file store needs no server and no database driver (mlflow-skinny has none); recent MLflow
            # releases want an explicit opt-in for it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri((output_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(config.project_name)
        self.run = mlflow.start_run(run_name=config.experiment_name or output_dir.resolve().name)
        mlflow.log_params({k: str(v)[:250] for k, v in config.model_dump(mode="json").items()})

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        safe = {k.replace("@", "_at_"): float(v) for k, v in metrics.items()}  # MLflow forbids '@' in names
        self.mlflow.log_metrics(safe, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


TrackerBuilder = Callable[[PPOConfig, Path, "int | None"], Tracker]

TRACKER_BUILDERS: dict[str, TrackerBuilder] = {
    "console": lambda cfg, out, resume: ConsoleTracker(cfg.log_every),
    "jsonl": lambda cfg, out, resume: JsonlTracker(out / "metrics.jsonl", resume_step=resume),
    "tensorboard": lambda cfg, out, resume: TensorBoardTracker(out / "tensorboard", resume_step=resume),
    "wandb": lambda cfg, out, resume: WandbTracker(cfg, out, resume_step=resume),
    "mlflow": lambda cfg, out, resume: MlflowTracker(cfg, out, resume_step=resume),
}
"""Tracker name -> builder ``(config, output_dir, resume_step) -> tracker``."""

TRACKER_PACKAGES: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""Tracker name -> the package it needs (``pip install <package>``)."""


def build_trackers(config: PPOConfig, output_dir: Path, resume_step: int | None) -> list[Tracker]:
    """The config's trackers; a missing package is an error when the tracker was asked for, a warning by default."""
    explicit = "trackers" in config.model_fields_set
    trackers = []
    for name in dict.fromkeys(config.trackers):
        package = TRACKER_PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            message = f"tracker {name!r} needs the {package!r} package: pip install {package}"
            if explicit:
                raise ConfigError(f"trackers: {message} (or remove {name!r} from trackers)")
            log.warning("%s; skipping it", message)
            continue
        trackers.append(TRACKER_BUILDERS[name](config, output_dir, resume_step))
    return trackers
