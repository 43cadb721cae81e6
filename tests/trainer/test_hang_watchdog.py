"""The hang watchdog on the local executor (issue #36 item 3): a reward function that blocks on purpose is reported
in ``RUN_DIR/hang.txt`` (the op, its pool and rank, the step, the blocking function in the stacks), then the run stops
with a HangError (``on_hang: stop``) or keeps waiting and finishes once the function is released (``on_hang: wait``).

The hang is planted in step 1's scoring (not in the validation before training): a tracker arms it when step 0's
validation is logged. Each test has a hard pytest timeout: a watchdog that never fires fails the test, not the suite.
Run with ``-s`` to see the time from the hang's start to the report.
"""
from __future__ import annotations

import threading
import time

import pytest

from hybridflow.errors import HangError, RewardError
from hybridflow.trainer import PPOTrainer
from hybridflow_ops.rewards.arithmetic import compute_score


class ArmAfter:
    """A tracker that sets ``armed`` once step ``step`` is logged."""

    def __init__(self, armed: threading.Event, step: int = 0):
        self.armed, self.step = armed, step

    def log(self, metrics, step):
        if step == self.step:
            self.armed.set()

    def close(self):
        pass


class PlantedHang:
    """The arithmetic reward, except that once ``armed`` a call blocks until ``release`` is set."""

    def __init__(self):
        self.armed, self.release = threading.Event(), threading.Event()
        self.started: float | None = None

    def reward(self):
        def planted_hang(data_source, solution_str, ground_truth, extra_info=None):
            if self.armed.is_set() and not self.release.is_set():
                self.started = self.started or time.monotonic()
                self.release.wait()
            return compute_score(data_source, solution_str, ground_truth, extra_info)

        return planted_hang


def _trainer(fast_config, hang: PlantedHang, **settings) -> PPOTrainer:
    trainer = PPOTrainer(config=fast_config(max_steps=2, **settings), trackers=[ArmAfter(hang.armed)])
    trainer.set_reward_model(hang.reward())
    return trainer


def _score_pool(trainer: PPOTrainer) -> str:
    return next(op.pool for op in trainer.plan.ops if op.name == "reward.score")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("reward_timeout_s", [None, 300.0], ids=["reward-on-main-thread", "reward-on-helper-thread"])
def test_a_planted_hang_is_reported_and_stops_the_run(fast_config, tmp_path, reward_timeout_s):
    hang = PlantedHang()
    trainer = _trainer(fast_config, hang, hang_timeout_s=5.0, on_hang="stop", reward_timeout_s=reward_timeout_s)
    try:
        with pytest.raises(HangError, match=r"no op completed for .* in flight: op 'reward\.score' on pool") as raised:
            trainer.train()
    finally:
        hang.release.set()
    report = (tmp_path / "run" / "hang.txt").read_text()
    watchdog = trainer.executor.watchdog
    print(f"\n--- hang.txt (reward_timeout_s={reward_timeout_s}) ---\n{report}\n"
          f"detected {watchdog.reported_at - hang.started:.2f} s after the hang started (hang_timeout_s=5)")
    pool = _score_pool(trainer)
    assert str(tmp_path / "run" / "hang.txt") in str(raised.value)
    assert f"pool {pool!r} rank 0" in report
    assert "in flight: op 'reward.score' (role 'reward') of iteration 0" in report
    assert "trainer step 1" in report and "running plan 'ppo'" in report
    assert "last completed: op 'reward.score_2' of plan 'validation' iteration 0" in report  # step 0's validation
    # the stack names the blocking function: the main thread's (no time limit) or the reward's helper thread's
    assert "in planted_hang\n" in report and "self.release.wait()" in report
    assert trainer.step == 1 and watchdog.reports == [report.rstrip("\n")]


@pytest.mark.timeout(180)
def test_on_hang_wait_reports_and_keeps_waiting(fast_config, tmp_path):
    hang = PlantedHang()
    trainer = _trainer(fast_config, hang, hang_timeout_s=5.0, on_hang="wait", reward_timeout_s=None)
    report_file = tmp_path / "run" / "hang.txt"

    def release_after_the_report():
        deadline = time.monotonic() + 120
        while not report_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        hang.release.set()

    releaser = threading.Thread(target=release_after_the_report, daemon=True)
    releaser.start()
    history = trainer.train()
    releaser.join()
    report = report_file.read_text()
    assert "on_hang=wait" in report and "in flight: op 'reward.score'" in report and "in planted_hang\n" in report
    assert len(history) == 2 and trainer.step == 2  # released, the run finished its steps
    assert trainer.executor.watchdog.hang is None and len(trainer.executor.watchdog.reports) == 1


@pytest.mark.timeout(180)
def test_a_shorter_reward_timeout_names_the_sample_first(fast_config, tmp_path):
    hang = PlantedHang()
    trainer = _trainer(fast_config, hang, hang_timeout_s=60.0, on_hang="stop", reward_timeout_s=1.0)
    try:
        with pytest.raises(RewardError, match="did not return within reward_timeout_s=1 s on sample \\d+"):
            trainer.train()
    finally:
        hang.release.set()
    assert not (tmp_path / "run" / "hang.txt").exists()


def test_a_healthy_run_is_not_reported_and_the_signal_handler_is_given_back(fast_config, tmp_path):
    import signal

    from hybridflow.runtime.watchdog import STOP_SIGNAL

    before = signal.getsignal(STOP_SIGNAL)
    trainer = PPOTrainer(config=fast_config(max_steps=2, hang_timeout_s=60.0))
    trainer.train()
    assert trainer.executor.watchdog is not None and trainer.executor.watchdog.reports == []
    assert not (tmp_path / "run" / "hang.txt").exists()
    assert signal.getsignal(STOP_SIGNAL) == before


def test_no_watchdog_when_hang_timeout_is_none(fast_config):
    trainer = PPOTrainer(config=fast_config(max_steps=1, hang_timeout_s=None))
    trainer.train()
    assert trainer.executor.watchdog is None
