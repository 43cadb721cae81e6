"""Write a DOT source as ``OUT.dot`` and, when Graphviz's ``dot`` program exists, ``OUT.svg``.

Shared by every drawing that goes through graphviz.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import GraphError

__all__ = ["Rendered", "INSTALL_HINT", "write_dot_and_svg"]

INSTALL_HINT = (
    "Graphviz's 'dot' program is not installed, so only {dot} was written. Install it "
    "(apt-get install graphviz | brew install graphviz | conda install graphviz) and run this again, "
    "or render the file yourself: dot -Tsvg {dot} -o {svg}"
)


@dataclass(frozen=True)
class Rendered:
    """What a drawing wrote: the DOT file always, the SVG when ``dot`` was found, and a message for the user."""

    dot: Path
    svg: Path | None
    message: str


def write_dot_and_svg(source: str, out: str | Path) -> Rendered:
    """Write ``out.dot``; render ``out.svg`` with ``dot`` if it is on PATH (``out`` is given without extension)."""
    import graphviz

    base = Path(out)
    if base.suffix in (".dot", ".svg", ".gv"):
        base = base.with_suffix("")
    base.parent.mkdir(parents=True, exist_ok=True)
    dot_path, svg_path = base.with_name(base.name + ".dot"), base.with_name(base.name + ".svg")
    dot_path.write_text(source)
    if shutil.which("dot") is None:
        return Rendered(dot_path, None, INSTALL_HINT.format(dot=dot_path, svg=svg_path))
    try:
        svg_path.write_bytes(graphviz.Source(source).pipe(format="svg"))
    except graphviz.ExecutableNotFound:
        return Rendered(dot_path, None, INSTALL_HINT.format(dot=dot_path, svg=svg_path))
    except graphviz.CalledProcessError as err:
        raise GraphError(f"graphviz could not render {dot_path}: {err}") from None
    return Rendered(dot_path, svg_path, f"wrote {dot_path} and {svg_path}")
