"""The quickstart example stopped by SIGTERM: the step finished and checkpointed, a clear line, exit 143."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "quickstart" / "minimal_ppo.py"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_minimal_ppo_stopped_by_sigterm_exits_143_with_a_line_and_a_checkpoint(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--steps", "10000"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = tmp_path / "runs" / "minimal_ppo" / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.exists() and any(json.loads(line)["step"] >= 1 for line in metrics.read_text().splitlines()
                                        if line.endswith("}"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no training step logged (exit {proc.poll()}): {proc.communicate()[1][-2000:]}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 143, stderr[-2000:]
    assert "Traceback" not in stderr
    last = max(json.loads(line)["step"] for line in metrics.read_text().splitlines())
    assert f"minimal_ppo.py: stopped by SIGTERM after step {last} of 10000; checkpoint " in stderr
    assert (tmp_path / "runs" / "minimal_ppo" / "checkpoints" / f"step_{last:08d}").is_dir()
    assert "greedy accuracy" not in stdout  # the report of a finished run is not printed
