"""``hybridflow viz SOURCE -o OUT``: draw an algorithm's graph, or a graph JSON file.

SOURCE is a standard algorithm's name (``ppo``, ``grpo``, ...) or a JSON file.
A JSON file is recognised by its content through :data:`READERS`, a table of
(what it is, does this document match, how to draw it); graphs are read now,
and compiled plans and run traces are added to the same table.

Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, GraphError

__all__ = ["Reader", "READERS", "add_arguments", "run"]


@dataclass(frozen=True)
class Reader:
    """One kind of JSON document ``viz`` can draw."""

    what: str
    matches: Callable[[object], bool]
    draw: Callable[[object, Path], object]
    """Draws the parsed document to ``OUT`` (no extension); returns a ``viz.render.Rendered``."""


def _is_graph(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("format") == "hybridflow.graph"


def _draw_graph_doc(doc: object, out: Path):
    """Read (not validate) the graph: a drawing needs no registered ops, and a broken graph is worth seeing."""
    from ..graph.serialize import graph_from_dict
    from .graph import draw_graph

    return draw_graph(graph_from_dict(doc), out)


READERS: tuple[Reader, ...] = (
    Reader("graph (format 'hybridflow.graph')", _is_graph, _draw_graph_doc),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a standard algorithm (ppo, grpo, rloo, reinforce_pp, remax, safe_rlhf) or a graph JSON file")
    parser.add_argument("-o", "--output", metavar="OUT", help="where to write, without extension: OUT.dot and OUT.svg (default: ./SOURCE_NAME)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override an algorithm attribute, e.g. --set n=4 (VALUE is read as JSON, else as a string); repeatable")


def _overrides(items: list[str]) -> dict[str, object]:
    found: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: write KEY=VALUE, e.g. --set n=4")
        try:
            found[key.strip()] = json.loads(text)
        except ValueError:
            found[key.strip()] = text
    return found


def _draw_file(path: Path, out: Path):
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise GraphError(f"cannot read {path}: {err}") from None
    except ValueError as err:
        raise GraphError(f"{path} is not JSON ({err}); viz draws a standard algorithm by name or a JSON document") from None
    for reader in READERS:
        if reader.matches(doc):
            return reader.draw(doc, out)
    raise GraphError(f"{path}: not a document viz can draw; it reads: {'; '.join(r.what for r in READERS)}")


def run(args: argparse.Namespace) -> int:
    from ..algorithms import ALGORITHMS

    source = args.source
    overrides = _overrides(args.overrides)
    if source in ALGORITHMS:
        from .graph import draw_graph

        rendered = draw_graph(ALGORITHMS[source].build(**overrides), Path(args.output or source))
    elif Path(source).is_file():
        if overrides:
            raise ConfigError("--set overrides an algorithm's attributes; it does not apply to a JSON file")
        rendered = _draw_file(Path(source), Path(args.output or Path(source).stem))
    else:
        raise GraphError(f"{source!r} is neither a standard algorithm ({', '.join(ALGORITHMS)}) nor an existing file")
    print(rendered.message)
    return 0
