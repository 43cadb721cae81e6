"""Real faults for the fault suite: a read-only folder, a full disk, a signal, each to a real process.

* **Read-only folder.** A non-root user gets ``chmod 0o555``. Root ignores file modes, so for root the
  command runs in its own mount namespace (``unshare -m``) where the folder is bind-mounted read-only;
  where that is not allowed either, the case is skipped (never passed without the fault).
* **Full disk.** ``RLIMIT_FSIZE`` (``ulimit -f``) on the child: a write past the limit fails with EFBIG
  exactly where a full disk fails with ENOSPC (Python ignores SIGXFSZ, so the write returns the error).
  No privilege is needed. (The same cases were checked by hand on a full tmpfs, ENOSPC: same messages.)
* **Signals.** The child gets SIGINT restored to its default (a shell's background job inherits it
  ignored, and Python installs its Ctrl-C handler only over the default).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "run_overrides", "child_env", "start", "finish", "readonly_prefix", "restore_modes",
           "metric_steps", "assert_named_error"]


def run_overrides(model: str, out: Path, **settings) -> list[str]:
    base = dict(actor_model_name=model, output_dir=str(out), max_steps=2, rollout_batch_size=8, max_response_length=3,
                val_samples=2, trackers="[jsonl]", progress_bar="false", num_threads=1)
    return [f"{k}={v}" for k, v in {**base, **settings}.items()]


def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


def _child_setup(file_size_limit: int | None):
    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    return setup


def start(args: list[str], *, prefix: list[str] = (), cwd: Path = REPO, file_size_limit: int | None = None,
          script: Path | None = None) -> subprocess.Popen:
    """``python -m hybridflow.cli ARGS`` (or ``python SCRIPT ARGS``), after ``prefix`` (e.g. a read-only mount),
    as its own process."""
    program = [str(script)] if script is not None else ["-m", "hybridflow.cli"]
    return subprocess.Popen([*prefix, sys.executable, *program, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(), cwd=cwd,
                            preexec_fn=_child_setup(file_size_limit))


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    """Wait for the process (killed past ``timeout``: a hang is a failure, not a wait); (status, stdout, stderr)."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the process did not stop within {timeout} s: {stderr[-2000:]}") from None
    return proc.returncode, stdout, stderr


def assert_named_error(status: int, stderr: str, command: str, *phrases: str) -> str:
    """Exit status 1, no traceback, and the last line block is ``hybridflow COMMAND: error: ...`` with ``phrases``
    (``COMMAND: error: ...`` for a script, whose ``command`` ends in ``.py``)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    assert status == 1, (status, stderr[-3000:])
    start_at = stderr.rfind(f"{command}: error: " if command.endswith(".py") else f"hybridflow {command}: error: ")
    assert start_at >= 0, stderr[-3000:]
    message = stderr[start_at:]
    for phrase in phrases:
        assert phrase in message, (phrase, message)
    return message


def _can_run(prefix: list[str]) -> bool:
    try:
        return subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


_MOUNT_NS: list[str] | None = None


def _mount_namespace() -> list[str] | None:
    """``unshare`` arguments giving a private mount namespace this user may mount in, or None where none is allowed."""
    global _MOUNT_NS
    if _MOUNT_NS is None:
        if shutil.which("unshare") is None:
            _MOUNT_NS = []
        else:
            options = (["unshare", "-m"], ["unshare", "-rm"]) if os.geteuid() == 0 else (["unshare", "-rm"],)
            _MOUNT_NS = next((o for o in options if _can_run([*o, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"])), [])
    return _MOUNT_NS or None


def readonly_prefix(folder: Path) -> tuple[list[str], str]:
    """(command prefix, how) that runs a command with ``folder`` read-only; ``([], "")`` when no way works here.

    Non-root: ``chmod 0o555`` on its folders (:func:`restore_modes` gives write back). Root: a
    read-only bind mount in a private mount namespace.
    """
    if os.geteuid() != 0:
        for path in [folder, *folder.rglob("*")]:
            if path.is_dir():
                path.chmod(0o555)
        return [], "chmod 0o555"
    unshare = _mount_namespace()
    if unshare is None:
        return [], ""
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return [*unshare, "sh", "-c", script, str(folder)], "read-only bind mount (root ignores chmod)"


def restore_modes(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)


def metric_steps(path: Path) -> list[int]:
    """The steps in a metrics.jsonl; every line must be a whole JSON record ending in a newline."""
    text = path.read_text(encoding="utf-8")
    assert not text or text.endswith("\n"), f"{path} ends in a half-written line: {text[-200:]!r}"
    return [json.loads(line)["step"] for line in text.splitlines()]
