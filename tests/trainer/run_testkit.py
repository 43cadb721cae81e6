"""Helpers of the trainer tests that stop and resume runs."""
from __future__ import annotations


class StopAt:
    """A tracker that interrupts the run when asked to log ``step`` (as a kill during that step would)."""

    def __init__(self, step: int):
        self.step = step

    def log(self, metrics, step):
        if step == self.step:
            raise KeyboardInterrupt

    def close(self):
        pass


def learned(metrics: dict) -> dict:
    """A step's metrics without its timings: what a resumed run must reproduce."""
    return {k: v for k, v in metrics.items() if not k.startswith(("timing_s/", "perf/"))}
