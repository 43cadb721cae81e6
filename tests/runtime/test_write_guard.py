"""A second Ctrl-C that lands inside a checkpoint write waits for the write, then stops the run.

The DCP case is the one CI saw: the signal landed in DCP's ``NoCloseWriter.write`` (called by
torch.save's zip writer), the KeyboardInterrupt closed the file, and the C++ writer's clean-up
then aborted the process with SIGABRT. The script below sends the second SIGINT from a trace
hook at the k-th such call; without the guard the write breaks (for k=2 the zip writer turns the
interrupt into "unexpected pos 46 vs 0", a CheckpointError, exit status 1).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from hybridflow.runtime import write_guard
from hybridflow.trainer.interrupt import StopRequest

_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch
    from hybridflow.runtime.dcp_files import save_dcp
    from hybridflow.trainer.interrupt import StopRequest

    at = int(sys.argv[2])
    calls = []

    def tracer(frame, event, arg):  # the second SIGINT, inside the at-th write torch.save's zip writer calls
        code = frame.f_code
        if event == "call" and code.co_name == "write" and code.co_filename.endswith("filesystem.py"):
            calls.append(code.co_qualname)
            if len(calls) == at:
                os.kill(os.getpid(), signal.SIGINT)
        return None

    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and not stop.forced
        sys.settrace(tracer)
        try:
            save_dcp({"w": torch.arange(50_000.0), "b": torch.ones(3)}, sys.argv[1], "writing failed")
        except KeyboardInterrupt:
            sys.settrace(None)
            print("stopped after", len(calls), "writes, forced", stop.forced, flush=True)
            sys.exit(130)
    print("not stopped", calls)
""")


@pytest.mark.parametrize("at", [1, 2, 5])
def test_a_second_sigint_inside_a_dcp_write_stops_after_it_and_the_folder_is_whole(tmp_path, at):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "tensors"
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(folder), str(at)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 130, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "forced True" in proc.stdout
    writes = int(proc.stdout.split("stopped after ")[1].split()[0])
    assert writes > at  # the write went on past the signal
    assert "stopping once the file being written is complete" in proc.stderr
    loaded = {"w": torch.zeros(50_000), "b": torch.zeros(3)}
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(str(folder)), no_dist=True)
    assert torch.equal(loaded["w"], torch.arange(50_000.0)) and torch.equal(loaded["b"], torch.ones(3))


def test_the_held_stop_is_raised_once_the_outermost_write_returns():
    done = []
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt, match="stopping at once"):
            with write_guard.whole_write():
                with write_guard.whole_write():
                    os.kill(os.getpid(), signal.SIGINT)  # handled here: held, not raised
                    done.append("inner")
                done.append("outer")  # the inner block returning does not raise it yet
        assert stop.forced and done == ["inner", "outer"]
        with write_guard.whole_write():  # nothing is left held for the next write
            done.append("next")
    assert done[-1] == "next"


def test_outside_a_write_a_second_sigint_is_raised_at_once():
    with StopRequest():
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs at the next bytecode, well inside this loop
                pass
            pytest.fail("the second SIGINT was not raised")
    assert not write_guard.defer(KeyboardInterrupt())  # no write under way: nothing kept
