"""Per-test CPU time for measuring the suite (``HYBRIDFLOW_TEST_CPU_LOG=PREFIX``): one JSON line per test in
``PREFIX.<worker>.jsonl`` (``gw0``, ``gw1``, or ``main`` without xdist), with the test's wall seconds, the CPU seconds
of the test process (``cpu``) and of its whole process tree (``tree``: the process, every live descendant and the
children each has reaped, from /proc; Ray workers are counted once their raylet has reaped them, so a Ray test's
``tree`` is approximate). On a machine that other work loads, wall seconds say little and CPU seconds still add up:
sum them per xdist worker to find the suite's critical path. Without the variable nothing is measured."""
from __future__ import annotations

import json
import os
import time

import pytest

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants, each with its reaped children (0 where /proc is absent)."""
    children, own = {}, {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry))
        own[int(entry)] = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += own.get(pid, 0)
        todo += children.get(pid, [])
    return total / _TICK


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    prefix = os.environ.get("HYBRIDFLOW_TEST_CPU_LOG")
    if not prefix:
        return (yield)
    start, tree, cpu = time.time(), tree_cpu(os.getpid()), time.process_time()
    try:
        return (yield)
    finally:
        line = dict(id=item.nodeid, worker=os.environ.get("PYTEST_XDIST_WORKER", "main"), start=start,
                    wall=time.time() - start, cpu=time.process_time() - cpu, tree=tree_cpu(os.getpid()) - tree)
        with open(f"{prefix}.{line['worker']}.jsonl", "a") as log:
            log.write(json.dumps(line) + "\n")


def summary(prefix: str, slowest: int = 10) -> str:
    """Per worker: tests, wall and CPU seconds (the larger of ``cpu`` and ``tree`` per test), then the slowest tests."""
    import glob

    rows = [json.loads(line) for path in sorted(glob.glob(f"{prefix}.*.jsonl")) for line in open(path)]
    out = []
    for worker in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == worker]
        out.append(f"{worker}: {len(mine)} tests, {sum(r['wall'] for r in mine):.0f} s wall, "
                   f"{sum(max(r['cpu'], r['tree']) for r in mine):.0f} s CPU")
    out.append(f"slowest {slowest} by CPU (s CPU, s wall, test):")
    for r in sorted(rows, key=lambda r: -max(r["cpu"], r["tree"]))[:slowest]:
        out.append(f"  {max(r['cpu'], r['tree']):7.1f} {r['wall']:7.1f}  {r['id']}")
    return "\n".join(out)


if __name__ == "__main__":  # python tests/cpu_log.py PREFIX
    import sys

    print(summary(sys.argv[1]))
