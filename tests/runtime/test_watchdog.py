"""The hang watchdog at the executor (:mod:`hybridflow.runtime.watchdog`): a compute op that blocks on the
controller is named as the controller's op, with the blocking function in the controller's stack; with
``on_hang="wait"`` a stall is reported once, and a new stall after an op completes is reported again.

The trainer-level tests (a planted hang in a reward function, hang.txt) are tests/trainer/test_hang_watchdog.py and
tests/runtime/ray/test_hang_watchdog_ray.py.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import pytest
import torch

import hybridflow as hf
from hybridflow.errors import HangError
from hybridflow.runtime.local import LocalExecutor
from hybridflow.runtime.watchdog import Watchdog
from test_local_executor import _prompts, _specs, local_plan_for

pytestmark = pytest.mark.filterwarnings("ignore:node 'hang_probe_baseline'")  # the probe's value is never read

GATES: list[threading.Event] = []
"""The events the probe op waits on, one per call (an empty list: it does not wait)."""


class Baseline(NamedTuple):
    baseline: torch.Tensor


def blocked_in_a_compute_op(gate: threading.Event) -> None:
    gate.wait()


@hf.register_op("hang_probe_baseline", inputs=("scores: float32[B]",), outputs=("baseline: float32[B]",), replace=True)
def hang_probe_baseline(scores):
    """The batch's mean score per response, (b,) -> (b,), after waiting on the next of :data:`GATES`."""
    if GATES:
        blocked_in_a_compute_op(GATES.pop(0))
    return Baseline(scores.mean().expand_as(scores).clone())


@hf.algorithm
def hang_probe(prompts, actor, reward):
    rollout = actor.generate(prompts, n=2)
    scores = reward.score(rollout)
    hf.compute("hang_probe_baseline", rollout, scores)


def _executor(watchdog: Watchdog) -> LocalExecutor:
    graph = hang_probe.build()
    executor = LocalExecutor(local_plan_for(graph), _specs(graph))
    executor.watchdog = watchdog
    return executor


@pytest.mark.timeout(120)
def test_a_compute_op_that_blocks_on_the_controller_is_named(tmp_path):
    gate = threading.Event()
    GATES[:] = [gate]
    executor = _executor(Watchdog(3.0, "stop", report_path=tmp_path / "hang.txt"))
    try:
        with pytest.raises(HangError, match="in flight: op 'hang_probe_baseline' on the controller"):
            executor.run_iteration({"prompts": _prompts(2)})
    finally:
        gate.set()
    report = (tmp_path / "hang.txt").read_text()
    assert "controller: running op 'hang_probe_baseline' (role 'controller') of iteration 0" in report
    assert "controller: last completed op" not in report  # the only controller op is the one that blocks
    assert "last completed: op 'reward.score' of plan 'hang_probe' iteration 0" in report
    main = report.split("thread MainThread", 1)[1].split("\n  thread ", 1)[0]
    assert "in blocked_in_a_compute_op\n" in main and "in hang_probe_baseline\n" in main


@pytest.mark.timeout(120)
def test_on_hang_wait_reports_each_stall_once(tmp_path):
    watchdog = Watchdog(2.0, "wait", report_path=tmp_path / "hang.txt")
    executor = _executor(watchdog)
    gates = [threading.Event(), threading.Event()]

    def release_after_each_report():
        for count, gate in enumerate(gates, start=1):
            while len(watchdog.reports) < count:
                threading.Event().wait(0.05)
            threading.Event().wait(2.5)  # the stall goes on past another timeout (5 ticks of 0.5 s): not reported again
            gate.set()

    GATES[:] = list(gates)
    releaser = threading.Thread(target=release_after_each_report, daemon=True)
    releaser.start()
    executor.run_iteration({"prompts": _prompts(2)})  # a stall, released
    executor.run_iteration({"prompts": _prompts(2)})  # a new stall, released
    releaser.join()
    assert len(watchdog.reports) == 2 and watchdog.hang is None
    assert all("running op 'hang_probe_baseline'" in r for r in watchdog.reports)
    assert "of iteration 1" in watchdog.reports[1]
