"""The code blocks of the documentation pages, and how the test suite runs them.

A fenced block is marked by an HTML comment on the line before it (invisible on the site):

- ``<!-- run -->``: executed. ``python`` blocks run as a fresh ``python`` process each (so every
  block a reader copies is complete), ``bash`` blocks with ``bash -euo pipefail``; all blocks of
  a page share one working folder, in order.
- ``<!-- file: NAME -->``: written to ``NAME`` in that folder (the reader saves it as that file).
- ``<!-- output -->`` on a ``text`` block: what the block before printed. Each of its lines that
  is not ``...`` must appear inside a line of that block's output, each in the same line as the
  one before or a later one (a quoted line may be a part of a printed line; varying numbers are
  left out of the quote).
- ``<!-- norun: why -->``: shown, not executed (a command that needs a GPU, or runs for minutes).

On a page listed in ``RUNNABLE_PAGES`` every block must carry one of these marks.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "blocks", "run_page", "RUNNABLE_PAGES", "DOCS"]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUNNABLE_PAGES = ("tutorial.md", "checkpoints.md")
"""Pages whose every code block is marked, and whose marked blocks the suite runs."""

_MARK = re.compile(r"^<!--\s*(run|output|file|norun)\s*(?::\s*(.*?))?\s*-->\s*$")
_FENCE = re.compile(r"^(```+)\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, text, mark (None: unmarked), the mark's argument and its line."""

    lang: str
    code: str
    mark: str | None
    arg: str
    line: int


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown page, with the mark on the line before each."""
    lines, found, i = text.splitlines(), [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        previous = lines[i - 1].strip() if i else ""
        mark = _MARK.match(previous)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1)))
        found.append(Block(fence.group(2), "\n".join(lines[i + 1:end]) + "\n", mark.group(1) if mark else None,
                           (mark.group(2) or "") if mark else "", i + 1))
        i = end + 1
    return found


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(OMP_NUM_THREADS="1", HYBRIDFLOW_DOCS_TEST="1", PYTHONUNBUFFERED="1")
    return env


def _check_output(page: str, quoted: Block, printed: str) -> None:
    """Every quoted line (but ``...``) occurs, in order, within the printed lines."""
    got, at = printed.splitlines(), 0
    for want in (w.strip() for w in quoted.code.splitlines()):
        if not want or want == "...":
            continue
        while at < len(got) and want not in got[at]:
            at += 1
        if at == len(got):
            raise AssertionError(f"{page}:{quoted.line}: the quoted output line {want!r} was not printed (in order); "
                                 f"the block printed:\n{printed[-3000:]}")
        # the next quoted line may be a later part of the same printed line


def run_page(page: "str | Path", workdir: Path, timeout_s: float = 600) -> int:
    """Run the marked blocks of ``docs/page`` (or of the file ``page``) in ``workdir``; returns how many
    blocks ran. AssertionError naming the page and line on a failure."""
    env, printed, ran = _environment(), None, 0
    path = page if isinstance(page, Path) else DOCS / page
    page = path.name
    for block in blocks(path.read_text(encoding="utf-8")):
        where = f"{page}:{block.line}"
        if block.mark == "file":
            (workdir / block.arg).write_text(block.code, encoding="utf-8")
        elif block.mark == "output":
            assert printed is not None, f"{where}: an output block follows no run block"
            _check_output(page, block, printed)
        elif block.mark == "run":
            if block.lang == "python":
                command = [sys.executable, "-c", block.code]
            elif block.lang in ("bash", "sh", "console"):
                command = ["bash", "-euo", "pipefail", "-c", block.code]
            else:
                raise AssertionError(f"{where}: a run block must be python or bash, not {block.lang!r}")
            proc = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s)
            printed = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"{where}: the block exited with {proc.returncode}:\n{printed[-4000:]}"
            ran += 1
    return ran
