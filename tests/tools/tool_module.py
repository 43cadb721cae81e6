"""Load a script of tools/ (not a package) as a module, registered under ``name`` so its dataclasses work; and the
helpers the smoke tests of tools/ share (a test module that imports :func:`tool_process` gets it as an autouse fixture)."""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"


def load_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def tool(path: str):
    """tools/``path`` loaded as a module (once per test process)."""
    return load_file(TOOLS / path, "smoke_" + path.replace("/", "_").removesuffix(".py"))


@pytest.fixture(autouse=True)
def tool_process(monkeypatch):
    """Tools run from the repository root (they name examples/configs/... relative to it), set torch's thread
    count and start processes that import hybridflow: give the threads back after each, and have the
    processes import this checkout with one thread each."""
    threads = torch.get_num_threads()
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


def run(path: str, argv: list[str], capsys) -> tuple[object, str]:
    """``main(argv)`` of tools/``path``: its return value and what it printed."""
    result = tool(path).main(argv)
    return result, capsys.readouterr().out


def exits(path: str, argv: list[str], capsys) -> tuple[object, str, str]:
    """``main(argv)`` of a tool that ends by SystemExit: its code (or message), stdout and stderr."""
    with pytest.raises(SystemExit) as stop:
        tool(path).main(argv)
    captured = capsys.readouterr()
    return stop.value.code, captured.out, captured.err
