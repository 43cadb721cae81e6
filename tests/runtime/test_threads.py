"""runtime/threads.py: per-slot torch threads that leave busy cores alone, and the oversubscription warning."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from hybridflow.runtime import threads


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)


@pytest.mark.parametrize("share, busy, requested, expected", [
    (8, 0.0, None, 8),      # idle machine: the slot's whole share
    (4, 0.0, None, 4),      # two slots: half the cores each
    (8, 2.6, None, 5),      # 2.6 cores busy elsewhere: 8 - 2.6 rounds to 5
    (4, 7.9, None, 1),      # everything busy: still one thread
    (None, 1.0, None, 7),   # no share from the plan: all cores but the busy one
    (8, 7.9, 3, 3),         # an explicit num_threads is kept
])
def test_slot_threads(eight_cores, share, busy, requested, expected):
    assert threads.slot_threads(share, requested=requested, busy=busy) == expected


def test_warning_when_oversubscribed(eight_cores, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridflow.runtime"):
        assert not threads.warn_if_oversubscribed(2, 4, busy=0.0)
        assert not caplog.records
        assert threads.warn_if_oversubscribed(4, 2, busy=1.0)
    assert "oversubscribed" in caplog.records[0].getMessage() and "4 worker(s) x 2" in caplog.records[0].getMessage()


def test_busy_cores_sees_a_busy_neighbour_and_not_this_process():
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat: busy_cores falls back to the load average")
    burner = subprocess.Popen([sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert burner.stdout.readline() == "spinning\n"  # measured once its loop has started, however slow its start
        busy = threads.busy_cores(window_s=0.5, reuse_s=0.0)  # a fresh window, all of it after the loop started
    finally:
        burner.kill()
        burner.wait()
    assert 0.6 <= busy <= (os.cpu_count() or 1) + 0.01


def test_a_recent_window_is_reused_without_waiting_and_sees_the_neighbour(monkeypatch):
    """The window since the last call, when it is at least ``window_s`` long, is measured without a wait, and a
    burner running through it counts (this process's own work in it is taken out, as in a fresh window); a call
    right after that one returns its result."""
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat: busy_cores falls back to the load average")
    burner = subprocess.Popen([sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"],
                              stdout=subprocess.PIPE, text=True)
    waits = []
    try:
        assert burner.stdout.readline() == "spinning\n"
        threads.busy_cores(window_s=0.1, reuse_s=0.0)  # opens the next window now, with the loop running
        start = time.process_time()
        while time.process_time() - start < 0.3:  # this process's own work in the window
            sum(range(1000))
        monkeypatch.setattr(threads.time, "sleep", waits.append)
        busy = threads.busy_cores(window_s=0.2, reuse_s=60.0)
        again = threads.busy_cores(window_s=0.2, reuse_s=60.0)  # a moment later: that measurement still holds
    finally:
        burner.kill()
        burner.wait()
    assert waits == [] and again == busy
    assert 0.6 <= busy <= (os.cpu_count() or 1) + 0.01
