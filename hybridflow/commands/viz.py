"""``hybridflow viz SOURCE -o OUT``: draw an algorithm's graph, or a graph JSON file.

SOURCE is a built-in algorithm's name (``ppo``, ``grpo``, ...), ``package.module:function``
(an ``@hf.algorithm`` function; ``--import MODULE`` imports a module that registers custom
ops first) or a JSON file.
A JSON file is recognised by its content through :data:`READERS`, a table of
(what it is, does this document match, how to draw it):

- a graph (``hybridflow.graph``): ``OUT.dot`` / ``OUT.svg``;
- a compiled plan (``hybridflow compile``): the placement drawing
  ``OUT.dot`` / ``OUT.svg``, the Gantt chart of the predicted schedule
  ``OUT.gantt.svg`` (with ``--trace RUN.json``, the run's measured timeline
  beside it on the same time axis) and the Chrome/Perfetto trace ``OUT.trace.json``;
- a run's Chrome trace (``traceEvents``): its Gantt chart ``OUT.gantt.svg``.

Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, GraphError, WriteError

__all__ = ["Reader", "READERS", "add_arguments", "run"]


@dataclass(frozen=True)
class Reader:
    """One kind of JSON document ``viz`` can draw."""

    what: str
    matches: Callable[[object], bool]
    draw: Callable[[object, Path, argparse.Namespace], object]
    """Draws the parsed document to ``OUT`` (no extension) with the command's options; returns an object with a ``message``."""


@dataclass(frozen=True)
class Written:
    """Files a drawing wrote, and what to tell the user."""

    paths: tuple[Path, ...]
    message: str


def _is_graph(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("format") == "hybridflow.graph"


def _draw_graph_doc(doc: object, out: Path, args: argparse.Namespace | None = None):
    """Draw the graph, then validate it as the DSL does: a broken graph is worth seeing, and is still an error.

    (Ops this process has not registered are the one exception: their module may simply not be imported.)
    """
    from ..graph.serialize import graph_from_dict
    from ..graph.validate import validate
    from ..viz.graph import draw_graph

    from ..graph.errors import UnknownOpError

    graph = graph_from_dict(doc)
    drawn = draw_graph(graph, out)
    try:
        validate(graph)
    except UnknownOpError as err:  # ops registered by a module this process never imported: draw, do not judge
        print(f"note: {err} -- drawn without checking the graph; import the module that registers its ops to check it",
              flush=True)
    except GraphError:
        print(f"{drawn.message} -- it shows the graph as it is, but the graph is invalid:", flush=True)
        raise
    return drawn


def _is_plan(doc: object) -> bool:
    return isinstance(doc, dict) and {"version", "graph", "pools", "placements", "ops"} <= set(doc)


def _is_trace(doc: object) -> bool:
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    return isinstance(events, list) and any(isinstance(e, dict) and e.get("ph") == "X" for e in events)


def _read_trace(path: str | None):
    if not path:
        return None
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--trace {path}: cannot be read ({getattr(err, 'strerror', None) or err}); give a run's "
                          "trace.json") from None
    except ValueError as err:
        raise ConfigError(f"--trace {path}: not JSON ({err}); give a run's trace.json") from None
    if not _is_trace(doc):
        raise ConfigError(f"--trace {path}: not a Chrome trace with complete events (a run's trace.json)")
    return doc


def _draw_plan_doc(doc: object, out: Path, args: argparse.Namespace | None = None) -> Written:
    from ..compiler.plan import read_plan
    from ..viz.gantt import draw_gantt
    from ..viz.graph import draw_graph
    from ..viz.plan import draw_plan
    from ..viz.trace import write_plan_trace

    plan = read_plan(json.dumps(doc))  # the graph validated, then the plan verified: drawing needs a sound plan
    trace = _read_trace(getattr(args, "trace", None))
    placement = draw_plan(plan, out)
    title = f"{plan.graph.name} on {plan.cluster}: predicted schedule" + (" and a measured run" if trace else "")
    gantt = draw_gantt(out.with_name(out.name + ".gantt.svg"), plan, trace, iteration=getattr(args, "iteration", None), title=title)
    chrome = write_plan_trace(plan, out.with_name(out.name + ".trace.json"))
    lags = plan.edge_lags()
    # a plan with staleness: its graph too, the lagged edges dashed with their lag
    graph = draw_graph(plan.graph, out.with_name(out.name + ".graph"), lags) if any(lags.values()) else None
    drawn_graph = (graph.dot, graph.svg) if graph else ()
    paths = tuple(p for p in (placement.dot, placement.svg, gantt, chrome, *drawn_graph) if p)
    message = f"wrote {', '.join(map(str, paths))} (open {chrome.name} in ui.perfetto.dev)"
    if placement.svg is None:
        message += "\n" + placement.message
    return Written(paths, message)


def _draw_trace_doc(doc: object, out: Path, args: argparse.Namespace | None = None) -> Written:
    from ..viz.gantt import draw_gantt

    gantt = draw_gantt(out.with_name(out.name + ".gantt.svg"), None, doc, iteration=getattr(args, "iteration", None),
                       title="measured run")
    return Written((gantt,), f"wrote {gantt}")


READERS: tuple[Reader, ...] = (
    Reader("graph (format 'hybridflow.graph')", _is_graph, _draw_graph_doc),
    Reader("compiled plan (hybridflow compile)", _is_plan, _draw_plan_doc),
    Reader("run trace (Chrome trace events with complete 'X' events)", _is_trace, _draw_trace_doc),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a built-in algorithm (ppo, grpo, ...), 'package.module:function' (an @hf.algorithm "
                                       "function), a graph JSON file, a plan JSON file (hybridflow compile) or a run's trace.json")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (e.g. one that registers custom ops); repeatable")
    parser.add_argument("-o", "--output", metavar="OUT", help="where to write, without extension: OUT.dot and OUT.svg, and for a plan "
                                                              "OUT.gantt.svg and OUT.trace.json (default: ./SOURCE_NAME)")
    parser.add_argument("--trace", metavar="RUN.json", help="with a plan: a run's Chrome trace to draw beside the predicted schedule")
    parser.add_argument("--iteration", type=int, metavar="N", help="which iteration of a run's trace to draw (default: the last)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override an algorithm attribute, e.g. --set n=4 (VALUE is read as JSON, else as a string); repeatable")


def assignments(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` items of ``--set`` as a dict, each value read as JSON where it is JSON, else kept as text."""
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


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise GraphError(f"cannot read {path}: {err}") from None
    except ValueError as err:
        raise GraphError(f"{path} is not JSON ({err}); viz draws a standard algorithm by name or a JSON document") from None


def _draw_file(path: Path, out: Path, args: argparse.Namespace | None = None):
    doc = _read_json(path)
    for reader in READERS:
        if reader.matches(doc):
            return reader.draw(doc, out, args)
    raise GraphError(f"{path}: not a document viz can draw; it reads: {'; '.join(r.what for r in READERS)}")


def run(args: argparse.Namespace) -> int:
    from ..algorithms.resolve import import_modules, resolve_algorithm

    import_modules(args.imports, "--import")
    source = args.source
    overrides = assignments(args.overrides)
    if args.trace and not (Path(source).is_file() and _is_plan(_read_json(Path(source)))):
        raise ConfigError(f"--trace draws a run's measured timeline beside a compiled plan's predicted one; SOURCE "
                          f"{source!r} is not a plan file (hybridflow compile writes one; a run writes plan.json)")
    try:
        if Path(source).is_file():
            if overrides:
                raise ConfigError("--set overrides an algorithm's attributes; it does not apply to a JSON file")
            rendered = _draw_file(Path(source), Path(args.output or Path(source).stem), args)
        else:
            from ..viz.graph import draw_graph

            algorithm = resolve_algorithm(source, "SOURCE")
            rendered = draw_graph(algorithm.build(**overrides), Path(args.output or algorithm.name))
    except OSError as err:
        if err.filename is not None and Path(err.filename).resolve() == Path(source).resolve():
            raise ConfigError(f"SOURCE {source}: cannot be read ({err.strerror})") from None
        raise WriteError(f"the drawing (-o {args.output or 'default'})", err) from None
    print(rendered.message)
    return 0
