"""The ``python`` tool: run a model's program in a subprocess with limits, and report what stopped it.

Each call runs ``python -I -S`` in a fresh private folder (its working directory, ``HOME`` and
``TMPDIR``, deleted afterwards) with:

===============  ==============================================================================
limit            how
===============  ==============================================================================
``cpu``          ``RLIMIT_CPU`` (SIGXCPU at the soft limit, SIGKILL one second later)
``wall``         the controller waits ``wall_s`` and then kills the process group
``memory``       ``RLIMIT_AS`` (an allocation past it is a ``MemoryError``)
``processes``    ``RLIMIT_NPROC``: as root the program first drops to the unprivileged uid 65534
                 (root ignores the limit), as another user the limit is its current count plus
                 ``max_processes``; a fork past it fails (``BlockingIOError``)
``output``       stdout and stderr go to files under ``RLIMIT_FSIZE``: writing past
                 ``max_output_bytes`` kills the program (SIGXFSZ); the model reads at most
                 ``max_output_chars`` of it
``network``      a new network namespace (``unshare -n``, where permitted) and an audit hook
                 that refuses every socket
``filesystem``   the audit hook refuses opening or listing anything outside the private folder
                 (reading the interpreter's own library files excepted) and any write outside it
===============  ==============================================================================

The audit hook (PEP 578) is installed before the program's first line and cannot be removed
from Python. The program can import the modules imported before privileges are dropped
(``math``, ``re``, ``json``, ``itertools``, ... see ``PRELOADED``) and built-in ones.

Nothing a program does raises in the caller: :func:`run_python` returns a
:class:`~hybridflow.agents.tools.ToolResult` whose ``limit`` names what stopped it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from pydantic import BaseModel, ConfigDict, Field

from .tools import ToolResult, register_tool

__all__ = ["SandboxLimits", "run_python", "python_tool", "PRELOADED"]

NOBODY = 65534
PRELOADED = ("math", "re", "json", "itertools", "functools", "collections", "random", "string", "fractions",
             "decimal", "statistics", "heapq", "bisect", "operator", "time", "socket",
             "encodings.idna")
MAX_CODE_CHARS = 20_000


class SandboxLimits(BaseModel):
    """The limits of one sandboxed run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu_s: int = Field(2, ge=1, description="CPU seconds (RLIMIT_CPU).")
    wall_s: float = Field(5.0, gt=0, description="Wall-clock seconds before the process group is killed.")
    memory_mb: int = Field(256, ge=32, description="Address space in MiB (RLIMIT_AS).")
    max_processes: int = Field(8, ge=1, description="Processes the program may run at once (RLIMIT_NPROC).")
    max_output_bytes: int = Field(1 << 20, ge=1024, description="Bytes written to any file, stdout and stderr included (RLIMIT_FSIZE).")
    max_output_chars: int = Field(1000, ge=16, description="Characters of output the model reads; the rest is cut.")


_BOOTSTRAP = r"""
import sys, os, resource as R, json
cfg = json.loads(sys.argv[1])
code = sys.stdin.read()
for name in cfg["preload"]:
    __import__(name)
R.setrlimit(R.RLIMIT_CORE, (0, 0))
R.setrlimit(R.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
R.setrlimit(R.RLIMIT_AS, (cfg["memory"], cfg["memory"]))
R.setrlimit(R.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
if os.getuid() == 0:
    R.setrlimit(R.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    os.setgroups([]); os.setgid(cfg["uid"]); os.setuid(cfg["uid"])
else:
    mine = sum(1 for p in os.listdir("/proc") if p.isdigit() and os.stat("/proc/" + p).st_uid == os.getuid())
    R.setrlimit(R.RLIMIT_NPROC, (mine + cfg["nproc"], mine + cfg["nproc"]))
home = os.path.realpath(cfg["home"])
library = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
def inside(path, roots):
    real = os.path.realpath(os.fsdecode(path))
    return real == home or any(real.startswith(r) for r in roots)
def policy(event, args):
    if event.startswith("socket."):
        raise PermissionError("hf-sandbox: network access is blocked")
    if event.startswith("ctypes."):
        raise PermissionError("hf-sandbox: ctypes is blocked")
    if event == "open":
        path, mode = args[0], args[1]
        if isinstance(path, int) or path is None:
            return
        writes = isinstance(mode, str) and any(c in mode for c in "wax+")
        if not inside(path, (home + os.sep,) + (() if writes else library)):
            raise PermissionError(f"hf-sandbox: access outside the sandbox folder is blocked: {os.fsdecode(path)}")
    elif event in ("os.listdir", "os.scandir", "os.chdir", "os.remove", "os.rename", "os.rmdir", "os.mkdir"):
        path = args[0] if args else "."
        if path is not None and not isinstance(path, int) and not inside(path or ".", (home + os.sep,)):
            raise PermissionError(f"hf-sandbox: access outside the sandbox folder is blocked: {os.fsdecode(path)}")
sys.addaudithook(policy)
del R, json, cfg
exec(compile(code, "<program>", "exec"), {"__name__": "__main__"})
"""


def _command(limits: SandboxLimits, home: str) -> list[str]:
    config = json.dumps({"preload": PRELOADED, "cpu_s": limits.cpu_s, "memory": limits.memory_mb << 20,
                         "fsize": limits.max_output_bytes, "nproc": limits.max_processes, "uid": NOBODY, "home": home})
    command = [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, config]
    unshare = shutil.which("unshare")
    if os.geteuid() == 0 and unshare:
        command = [unshare, "--net", "--"] + command
    return command


def _limit_from(returncode: int | None, stderr: str, timed_out: bool) -> str | None:
    """Which limit stopped the program (None: it ended on its own, possibly with an error)."""
    if timed_out:
        return "wall"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu"
    if returncode == -signal.SIGXFSZ or "File too large" in stderr:
        return "output"
    if "MemoryError" in stderr:
        return "memory"
    if "BlockingIOError" in stderr or "Resource temporarily unavailable" in stderr:
        return "processes"
    if "hf-sandbox: network" in stderr:
        return "network"
    if "hf-sandbox: access outside" in stderr:
        return "filesystem"
    return None


def _read(path: str, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(limit * 4 + 4)
    text = data.decode("utf-8", errors="replace")
    cut = len(text) > limit or os.path.getsize(path) > len(data)
    return text[:limit], cut


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> ToolResult:
    """Run ``code`` in the sandbox (module docstring); the result's ``limit`` says what stopped it, if anything."""
    start = time.perf_counter()
    if len(code) > MAX_CODE_CHARS:
        return ToolResult(f"error: program longer than {MAX_CODE_CHARS} characters", "too long")
    home = tempfile.mkdtemp(prefix="hf-sandbox-")
    logs = tempfile.mkdtemp(prefix="hf-sandbox-out-")
    try:
        if os.geteuid() == 0:
            os.chown(home, NOBODY, NOBODY)
        out_path, err_path = os.path.join(logs, "stdout"), os.path.join(logs, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1",
                   "PYTHONIOENCODING": "utf-8"}
            proc = subprocess.Popen(_command(limits, home), cwd=home, env=env, stdin=subprocess.PIPE, stdout=out,
                                    stderr=err, close_fds=True, process_group=0)
            timed_out = False
            try:
                proc.stdin.write(code.encode("utf-8", errors="replace"))
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                proc.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc.pid)  # the program, and whatever it forked
            proc.wait()
        stdout, cut = _read(out_path, limits.max_output_chars)
        stderr, _ = _read(err_path, 4000)
        limit = _limit_from(proc.returncode, stderr, timed_out)
        if limit == "output" or (cut and proc.returncode == 0):
            limit = limit or "output"
        elapsed = time.perf_counter() - start
        if proc.returncode == 0 and not timed_out and not cut:
            return ToolResult(stdout, None, None, elapsed)
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        reason = {"wall": f"wall time limit ({limits.wall_s:g} s) exceeded",
                  "cpu": f"CPU time limit ({limits.cpu_s} s) exceeded",
                  "output": f"output limit exceeded (shown: first {limits.max_output_chars} characters)",
                  "memory": f"memory limit ({limits.memory_mb} MiB) exceeded",
                  "processes": f"process limit ({limits.max_processes}) reached"}.get(limit or "", last or f"exit status {proc.returncode}")
        shown = (stdout + ("\n" if stdout else "") if limit == "output" or stdout else "") + f"error: {reason}"
        return ToolResult(shown[-(limits.max_output_chars + 80):], reason, limit, elapsed)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)


@register_tool("python")
def python_tool(arguments: str) -> ToolResult:
    """The registered ``python`` tool: :func:`run_python` with the default :class:`SandboxLimits`."""
    return run_python(arguments)
