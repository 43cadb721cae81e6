"""The hang watchdog on Ray (issue #36 item 3): a reward function that blocks on purpose in a worker is reported in
``RUN_DIR/hang.txt`` with the op, its pool and rank, the step and the worker's Python stack (asked of the busy actor
in its own concurrency group), and the run stops with a HangError; the executor's shutdown ends the blocked worker.

Run with ``-s`` to see the report and the time from the hang's start to it.
"""
from __future__ import annotations

import time

import pytest

from hybridflow import PPOConfig
from hybridflow.data import create_tiny_model_dir
from hybridflow.errors import HangError
from hybridflow.trainer import PPOTrainer


class MarkAfter:
    """A tracker that creates ``marker`` once step ``step`` is logged (arming the planted hang)."""

    def __init__(self, marker, step: int):
        self.marker, self.step, self.at = marker, step, None

    def log(self, metrics, step):
        if step == self.step:
            self.marker.write_text("hang")
            self.at = time.monotonic()

    def close(self):
        pass


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_planted_hang_in_a_ray_worker_is_reported_and_stops_the_run(ray_cluster, tmp_path):
    from ray_testkit import hang_when_marked

    model_dir = create_tiny_model_dir(tmp_path / "tiny", seed=0)
    out, marker = tmp_path / "run", tmp_path / "hang-marker"
    config = PPOConfig(actor_model_name=str(model_dir), output_dir=str(out), max_steps=2, rollout_batch_size=8,
                       max_response_length=3, val_samples=2, trackers=("jsonl",), progress_bar=False, num_threads=1,
                       executor="ray", placement="actor+critic+ref@1", reward_timeout_s=None, hang_timeout_s=6.0,
                       on_hang="stop")
    armer = MarkAfter(marker, step=0)
    trainer = PPOTrainer(config=config, trackers=[armer])
    trainer.set_reward_model(hang_when_marked(str(marker)))
    try:
        with pytest.raises(HangError, match=r"in flight: op 'reward\.score' on pool"):
            trainer.train()
    finally:
        if trainer.executor is not None:
            trainer.executor.shutdown()
    report = (out / "hang.txt").read_text()
    watchdog = trainer.executor.watchdog
    print(f"\n--- hang.txt (Ray) ---\n{report}\ndetected {watchdog.reported_at - armer.at:.2f} s after the hang was "
          "armed (the end of step 0's validation; hang_timeout_s=6)")
    pool = next(op.pool for op in trainer.plan.ops if op.name == "reward.score")
    block = report.split(f"pool {pool!r} rank 0", 1)[1].split("\npool ", 1)[0]
    assert "in flight: op 'reward.score' (role 'reward') of iteration 0" in block
    assert "RayExecutor running plan 'ppo', trainer step 1" in report
    # the worker's own stack, from its process, names the blocking function and the op's method
    assert "worker stacks:" in block and "in planted_hang\n" in block and "in score\n" in block
    assert "threading.Event().wait()" in block
    # the controller waits in the run loop (not in the op)
    assert "in _drive\n" in report.split("controller stacks (this process):", 1)[1]
