"""The trainer with ``executor="ray"``: the same run as the local executor, checkpoints and resumption included.

The trainer reaches the Ray workers for validation and checkpoints with plans derived from the
training plan (hybridflow.compiler.control), exactly as it reaches the local ones; with one device
per pool the two executors must give the same metrics,
and a Ray run resumed from a checkpoint must continue as the uninterrupted run does.
"""
from __future__ import annotations

import json

import pytest

from hybridflow import PPOConfig
from hybridflow.data import create_tiny_model_dir
from hybridflow.trainer import PPOTrainer
from hybridflow.trainer.metrics import JsonlTracker


def _learned(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(("timing_s/", "perf/", "weight_sync/"))}


def _config(model_dir, out, **overrides) -> PPOConfig:
    settings = dict(actor_model_name=str(model_dir), output_dir=str(out), max_steps=3, rollout_batch_size=8,
                    max_response_length=3, actor_lr=2e-3, critic_lr=1e-3, val_samples=2, eval_freq=2, batch_size=4,
                    save_freq=1, trackers=("jsonl",), progress_bar=False, num_threads=1,
                    # the model roles on one device of the test cluster (its 4 GPUs are virtual): the local run's math
                    placement="actor+critic+ref@1")
    return PPOConfig(**{**settings, **overrides})


def _train(config: PPOConfig) -> tuple[PPOTrainer, list[dict]]:
    trainer = PPOTrainer(config=config)
    try:
        return trainer, trainer.train()
    finally:
        if config.executor == "ray" and trainer.executor is not None:
            trainer.executor.shutdown()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> tuple:
    """(model folder, metrics) of the local run of :func:`_config`: the reference of two tests (the module runs on one
    xdist worker, so it is trained once)."""
    folder = tmp_path_factory.mktemp("local_reference")
    model_dir = create_tiny_model_dir(folder / "tiny", seed=0)
    _, metrics = _train(_config(model_dir, folder / "local"))
    return model_dir, metrics


@pytest.mark.e2e
def test_ray_trainer_matches_local_and_resumes(ray_cluster, local_run, tmp_path):
    model_dir, local = local_run
    ray_trainer, first = _train(_config(model_dir, tmp_path / "ray", executor="ray", max_steps=2))
    assert ray_trainer.last_checkpoint.name == "step_00000002"
    assert "timing_s/update_weights" in first[0] and "timing_s/gen" in first[0]
    resumed_trainer, rest = _train(_config(model_dir, tmp_path / "ray", executor="ray"))
    assert resumed_trainer.resumed_from.name == "step_00000002"
    assert len(first) == 2 and len(rest) == 1
    for step, (want, got) in enumerate(zip(local, first + rest), start=1):
        want, got = _learned(want), _learned(got)
        assert want.keys() == got.keys(), step
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (step, key)


class MarkAfter:
    """A tracker that creates ``marker`` once step ``step`` is logged: the next reward call kills its worker.

    Once only: a restart that runs step ``step`` again does not kill again."""

    def __init__(self, marker, step: int):
        self.marker, self.step, self.done = marker, step, False

    def log(self, metrics, step):
        if step == self.step and not self.done:
            self.marker.write_text("kill")
            self.done = True

    def close(self):
        pass


@pytest.mark.e2e
def test_max_restarts_recreates_workers_and_matches_an_uninterrupted_run(ray_cluster, tmp_path):
    from ray_testkit import kill_when_marked

    model_dir = create_tiny_model_dir(tmp_path / "tiny", seed=0)
    marker = tmp_path / "kill-now"
    # unfinished_score=None: every response goes through the reward function, so step 3's scoring meets the marker
    reference = PPOTrainer(config=_config(model_dir, tmp_path / "local", max_steps=4, save_freq=2, unfinished_score=None))
    reference.set_reward_model(kill_when_marked(str(tmp_path / "never")))
    expected = reference.train()
    # Step 2 is checkpointed; step 3 is logged, then the reward worker dies in step 4; one restart resumes from
    # step 2 and runs steps 3 and 4 again, and metrics.jsonl still holds each step once.
    metrics = tmp_path / "ray" / "metrics.jsonl"
    trainer = PPOTrainer(config=_config(model_dir, tmp_path / "ray", executor="ray", max_steps=4, save_freq=2,
                                        unfinished_score=None, max_restarts=1),
                         trackers=[JsonlTracker(metrics), MarkAfter(marker, 3)])
    trainer.set_reward_model(kill_when_marked(str(marker)))
    try:
        got = trainer.train()
    finally:
        trainer.executor.shutdown()
    assert not marker.exists() and trainer.resumed_from.name == "step_00000002"  # the kill happened, then the resume
    assert len(got) == len(expected) == 4
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1, 2, 3, 4]
    for step, (want, have) in enumerate(zip(expected, got), start=1):
        want, have = _learned(want), _learned(have)
        for key in want:
            assert have[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (step, key)


class KillAfterLog:
    """A tracker: once step ``step`` is logged, and before that step's checkpoint is written, it kills the Ray
    process of ``pool``'s slot (the trained roles'): the checkpoint write meets the dead worker. Once only."""

    def __init__(self, step: int, pool: str):
        self.step, self.pool, self.trainer, self.done = step, pool, None, False

    def log(self, metrics, step):
        if step == self.step and not self.done:
            import ray

            executor = self.trainer.executor
            (slot,) = executor.topology.pool_slots(self.pool)
            ray.kill(executor.actor(slot), no_restart=True)
            self.done = True

    def close(self):
        pass


@pytest.mark.e2e
def test_a_worker_lost_at_a_checkpoint_write_restarts_from_the_checkpoint_before(ray_cluster, local_run, tmp_path):
    model_dir, expected = local_run
    metrics = tmp_path / "ray" / "metrics.jsonl"
    killer = KillAfterLog(step=2, pool="pool0")
    trainer = PPOTrainer(config=_config(model_dir, tmp_path / "ray", executor="ray", max_restarts=1),
                         trackers=[JsonlTracker(metrics), killer])
    killer.trainer = trainer
    try:
        got = trainer.train()
    finally:
        trainer.executor.shutdown()
    # step 2's checkpoint was never written whole: the restart resumed from step 1's and ran step 2 again
    assert killer.done and trainer.resumed_from.name == "step_00000001"
    checkpoints = sorted(p.name for p in (tmp_path / "ray" / "checkpoints").iterdir())
    assert checkpoints == ["step_00000001", "step_00000002", "step_00000003"], checkpoints
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1, 2, 3]
    assert len(got) == len(expected) == 3
    for step, (want, have) in enumerate(zip(expected, got), start=1):
        want, have = _learned(want), _learned(have)
        for key in want:
            assert have[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (step, key)
