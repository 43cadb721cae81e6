"""The Python sandbox: each fault ends as an error result naming the limit that stopped it, with real subprocesses.

Limits are small (1 s of CPU, 3 s of wall time) so the whole file runs in a few seconds; which limit
stopped a program is what the sandbox decided, read from its result. ``tools/sandbox_faults.py`` prints
the same cases with their times.
"""
from __future__ import annotations

import os
import socket
import threading

import pytest

from hybridflow.agents.sandbox import SandboxLimits, run_python

LIMITS = SandboxLimits(cpu_s=1, wall_s=3.0, memory_mb=128, max_processes=4, max_output_bytes=65536,
                       max_output_chars=200)


def test_a_program_runs_and_prints():
    result = run_python("import math\nprint(math.factorial(5))", LIMITS)
    assert (result.output, result.error, result.limit) == ("120\n", None, None)


def test_it_writes_in_its_own_folder_and_the_folder_is_gone_after():
    result = run_python("import os\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read(), os.getcwd())", LIMITS)
    assert result.error is None and result.output.startswith("hi ")
    assert not os.path.exists(result.output.split()[1])


def test_an_infinite_loop_hits_the_cpu_limit():
    result = run_python("while True:\n    pass", LIMITS.model_copy(update={"wall_s": 30.0}))
    assert result.limit == "cpu" and result.output.startswith("error:")


def test_a_blocked_program_hits_the_wall_limit():
    result = run_python("import time\ntime.sleep(60)", LIMITS)
    assert result.limit == "wall" and "wall time" in result.output


def test_a_fork_bomb_hits_the_process_limit():
    result = run_python("import os\nwhile True:\n    os.fork()", LIMITS)
    assert result.limit == "processes", result


def test_huge_output_is_cut():
    result = run_python("while True:\n    print('x' * 1000)", LIMITS)
    assert result.limit == "output"
    assert result.output.startswith("x" * 200) and len(result.output) < 400


def test_a_huge_allocation_hits_the_memory_limit():
    result = run_python("blob = bytearray(1 << 30)", LIMITS)
    assert result.limit == "memory"


@pytest.mark.parametrize("program", [
    "print(open('/etc/hostname').read())",
    "print(open('../../etc/hostname').read())",
    "import os\nprint(os.listdir('/'))",
    "open('/tmp/hf-sandbox-escape', 'w').write('x')",
])
def test_files_outside_its_folder_are_refused(program):
    result = run_python(program, LIMITS)
    assert result.limit == "filesystem", result
    assert not os.path.exists("/tmp/hf-sandbox-escape")


def test_sockets_are_refused():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        result = run_python(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}))\nprint('in')",
                            LIMITS)
    finally:
        thread.join()
        server.close()
    assert result.limit == "network" and not accepted
