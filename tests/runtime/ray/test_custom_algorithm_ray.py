"""The tutorial's custom algorithm (examples/custom_algorithm/rloo_lenpen.py) on Ray: a few steps given by
``module:function``, with the same metrics as the local run (one device per pool: the local run's math),
its custom op's outputs included."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hybridflow import PPOConfig
from hybridflow.data import create_tiny_model_dir
from hybridflow.trainer import Trainer

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "custom_algorithm"


def _learned(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(("timing_s/", "perf/", "weight_sync/"))}


def _train(config: PPOConfig) -> list[dict]:
    trainer = Trainer(config, algorithm="rloo_lenpen:rloo_lenpen")
    try:
        return trainer.train()
    finally:
        if config.executor == "ray" and trainer.executor is not None:
            trainer.executor.shutdown()


def test_the_tutorial_algorithm_trains_on_ray_as_locally(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    model_dir = create_tiny_model_dir(tmp_path / "tiny", seed=0)
    settings = dict(actor_model_name=str(model_dir), max_steps=2, rollout_batch_size=4, max_response_length=3,
                    actor_lr=2e-3, val_samples=1, trackers=("jsonl",), progress_bar=False, num_threads=1,
                    calibrate=False, imports=("rloo_lenpen",), algorithm_args={"len_penalty": 0.05},
                    placement="actor+ref@1")
    local = _train(PPOConfig(output_dir=str(tmp_path / "local"), **settings))
    on_ray = _train(PPOConfig(output_dir=str(tmp_path / "ray"), executor="ray", **settings))
    assert len(on_ray) == 2 and all("length_penalty/scores/mean" in m for m in on_ray)
    for step, (want, got) in enumerate(zip(local, on_ray), start=1):
        want, got = _learned(want), _learned(got)
        assert want.keys() == got.keys(), step
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (step, key)
    sys.modules.pop("rloo_lenpen", None)
