"""The command line of a generated documentation page (tools/gen_*_docs.py): write it, or --check it.

``python tools/gen_X_docs.py`` writes the page; ``--check`` exits 1 when the committed page
differs from what the generator renders now, so a test (and CI) catches a stale page.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

__all__ = ["page_command"]


def page_command(render: Callable[[], str], default: Path, script: str, description: str,
                 argv: list[str] | None = None) -> int:
    """Run the write-or-check command of the page ``render()`` makes (written to ``default`` unless --output)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if {default.name} differs from the generated page")
    parser.add_argument("--output", type=Path, default=default, help=f"where to write (default: {default})")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != page:
            print(f"{args.output} is stale; run tools/{script}", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(page)
    return 0
