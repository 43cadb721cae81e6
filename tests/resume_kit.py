"""A run killed with SIGKILL mid-run and resumed, against an uninterrupted run: the prompts each step trained on.

:func:`killed_and_resumed` starts ``hybridflow run`` in a subprocess for far more steps than it will run,
SIGKILLs it as soon as a complete checkpoint is on disk (decided from the files, not a sleep), resumes it
(``resume=auto``, in this process) up to a few steps past that checkpoint and returns the run's prompt log
(``prompts.jsonl``: step -> the dataset indices of its prompts). :func:`uninterrupted` runs the same steps in
one go. A resume that loses or replays prompts (e.g. a checkpoint that saved the loader's position after the
prompts drawn ahead for a staleness-k run) gives a different log.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridflow.trainer.checkpoint import list_checkpoints
from hybridflow.trainer.prompt_log import PROMPT_LOG, read_prompt_log

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


def _val_file(folder: Path) -> Path:
    """Two validation prompts (the runs validate before and after training; the built-in task's 100 cost seconds)."""
    from hybridflow.data.tasks.arithmetic import make_arithmetic_rows

    path = folder / "val.jsonl"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in make_arithmetic_rows()[:2]))
    return path


def _arguments(out: Path, settings: dict) -> list[str]:
    """``hybridflow run``'s arguments for a short run in ``out`` with ``settings`` on top of the kit's own."""
    base = dict(output_dir=str(out), rollout_batch_size=4, max_response_length=3, val_samples=1, trackers="[jsonl]",
                progress_bar="false", num_threads=1, save_freq=2, calibrate="false", val_files=str(_val_file(out.parent)))
    return ["run", *[f"{k}={v}" for k, v in {**base, **settings}.items()]]


def _command(out: Path, settings: dict) -> list[str]:
    return [sys.executable, "-m", "hybridflow.cli", *_arguments(out, settings)]


def killed_at_first_checkpoint(out: Path, settings: dict, *, timeout: float = 600) -> int:
    """Start the run in a subprocess, SIGKILL it once a complete checkpoint is on disk; the newest checkpoint's step."""
    proc = subprocess.Popen(_command(out, {**settings, "max_steps": 10_000}), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
    deadline = time.monotonic() + timeout
    while not list_checkpoints(out / "checkpoints"):
        if proc.poll() is not None:
            pytest.fail(f"the run ended before its first checkpoint (exit {proc.returncode}): {proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no checkpoint within {timeout} s")
        time.sleep(0.05)  # polling the folder, not standing in for work
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL
    return max(step for step, _ in list_checkpoints(out / "checkpoints"))


def resumed(out: Path, settings: dict, steps: int) -> dict:
    """The prompt log of the killed run in ``out`` resumed (``resume=auto``) up to ``steps``, in this process (the
    kill was the subprocess's; here an executor=ray run joins this process's Ray connection and its parked slots)."""
    from hybridflow.cli import main

    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("hybridflow.trainer")
    logger.addHandler(handler)
    try:
        assert main(_arguments(out, {**settings, "max_steps": steps})) == 0
    finally:
        logger.removeHandler(handler)
    assert any(m.startswith(f"resumed from {out / 'checkpoints'}") for m in messages), messages
    return read_prompt_log(out / PROMPT_LOG)


def killed_and_resumed(out: Path, settings: dict, *, extra_steps: int) -> tuple[dict, int]:
    """(prompt log, steps run) of a run SIGKILLed once its first checkpoint exists, then resumed to that checkpoint's
    step + ``extra_steps``."""
    steps = killed_at_first_checkpoint(out, settings) + extra_steps
    return resumed(out, settings, steps), steps


def uninterrupted(out: Path, settings: dict, steps: int) -> dict:
    """The prompt log of the same run for ``steps`` steps in one go (in this process: nothing here is killed)."""
    from hybridflow.cli import main

    assert main(_arguments(out, {**settings, "max_steps": steps})) == 0
    return read_prompt_log(out / PROMPT_LOG)
