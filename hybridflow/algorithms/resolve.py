"""Whatever names an algorithm -> the one thing the trainer and the commands use.

Everywhere a built-in algorithm goes (``Trainer(config, algorithm=...)``, a trainer
subclass's ``algorithm`` attribute, ``algorithm:`` in a run file, ``hybridflow viz`` /
``compile`` / ``simulate``), any of these is accepted, in this order:

====================================  ===================================================
``@hf.algorithm`` function            itself
a :class:`~hybridflow.graph.Graph`    a :class:`FixedGraph` (no attributes to set)
a plain Python function               traced as ``hf.algorithm(fn)``
``"grpo"``                            the built-in of that name (:data:`ALGORITHMS`)
``"package.module:function"``         that module's function (any of the above)
``"path/graph.json"``                 the graph in that file (``Graph.to_json()``), validated
====================================  ===================================================

:func:`import_modules` imports the modules of ``--import`` / ``imports:`` first, so that
custom ops are registered before a graph that uses them is validated.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import ConfigError, UnknownAlgorithmError
from ..graph import Algorithm, Graph, Role

__all__ = ["FixedGraph", "AlgorithmLike", "resolve_algorithm", "import_module", "import_modules", "algorithm_choices"]


class FixedGraph:
    """A graph used where an :class:`Algorithm` goes: it has no attributes to set, and no run state.

    ``source`` says where it came from (a file path, or ``"Graph object"``), for messages.
    """

    def __init__(self, graph: Graph, source: str):
        self.graph, self.source, self.name = graph, source, graph.name
        self.roles: dict[str, Role] = {r.name: r for r in graph.roles}
        self.defaults: dict[str, object] = {}
        self.state: tuple = ()

    def build(self, **overrides: object) -> Graph:
        if overrides:
            raise ConfigError(f"algorithm {self.name!r} is a fixed graph ({self.source}); its attributes cannot be set "
                              f"(got {', '.join(sorted(overrides))}): build the graph again from its @hf.algorithm "
                              "function with those values, or pass the function instead")
        return self.graph

    def __repr__(self) -> str:
        return f"<graph {self.name} from {self.source}>"


AlgorithmLike = "Algorithm | FixedGraph"


def algorithm_choices() -> str:
    from . import ALGORITHMS

    return f"choose one of {', '.join(ALGORITHMS)} (built-in), 'package.module:function' or a graph JSON file"


def resolve_algorithm(spec: object, where: str = "algorithm") -> "Algorithm | FixedGraph":
    """The algorithm ``spec`` names (see the module docstring); ConfigError or GraphError saying what is accepted."""
    if isinstance(spec, (Algorithm, FixedGraph)):
        return spec
    if isinstance(spec, Graph):
        return FixedGraph(spec, "Graph object")
    if isinstance(spec, str):
        return _from_text(spec.strip(), where)
    if callable(spec):
        return Algorithm(spec)
    raise ConfigError(f"{where}: {spec!r} is not an algorithm; {algorithm_choices()}, an @hf.algorithm "
                      "function or a Graph")


def _from_text(text: str, where: str) -> "Algorithm | FixedGraph":
    from . import ALGORITHMS

    if text in ALGORITHMS:
        return ALGORITHMS[text]
    if text.endswith(".json") or Path(text).is_file():
        return _from_file(Path(text), where)
    if ":" in text:
        module_name, _, attr = text.partition(":")
        module = import_module(module_name, f"{where} {text!r}")
        try:
            found = getattr(module, attr)
        except AttributeError:
            names = sorted(n for n, v in vars(module).items() if isinstance(v, Algorithm))
            raise ConfigError(f"{where} {text!r}: module {module_name!r} has no {attr!r}"
                              + (f"; its algorithms are {', '.join(names)}" if names else "")) from None
        return resolve_algorithm(found, f"{where} {text!r}")
    raise UnknownAlgorithmError(f"{where}: unknown algorithm {text!r}; {algorithm_choices()}")


def _from_file(path: Path, where: str) -> FixedGraph:
    from ..graph.serialize import graph_from_json
    from ..graph.validate import validate

    if not path.is_file():
        raise ConfigError(f"{where}: graph file {str(path)!r} does not exist")
    graph = graph_from_json(path.read_text(encoding="utf-8"))
    validate(graph)  # a hand-edited file is held to what a traced algorithm is
    return FixedGraph(graph, str(path))


def import_module(name: str, where: str):
    """Import ``name`` as ``python -m`` would: the working directory is on the path (the console script's is not)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ConfigError(f"{where}: cannot import module {name!r} ({err}); give an importable module name "
                          "(a file mymod.py in the working directory is 'mymod', a package module 'pkg.mod')") from None
    except SyntaxError as err:
        raise ConfigError(f"{where}: module {name!r} has a syntax error at {err.filename}, line {err.lineno}: "
                          f"{err.msg}") from None
    except Exception as err:  # the module's own code raised while it was imported
        raise ConfigError(f"{where}: importing module {name!r} raised {type(err).__name__}: {err} "
                          f"(at {_raised_at(err)}); fix the module") from None


def _raised_at(err: BaseException) -> str:
    """``file, line N`` of the innermost frame of ``err``'s traceback (where the module's code raised)."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    return f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else "an unknown place"


def import_modules(names: Iterable[str], where: str = "imports") -> None:
    """Import each module (e.g. one that registers custom ops with ``@hf.register_op``); ConfigError naming a failure."""
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{where}: {name!r} is not a module name")
        import_module(name.strip(), where)


def check_algorithm_args(algorithm: "Algorithm | FixedGraph", args: Mapping[str, object], where: str = "algorithm_args") -> None:
    """Every key of ``args`` is an attribute of ``algorithm`` and every value of its default's kind (a float for a
    float, ...): ConfigError listing its attributes, or naming the kind wanted, otherwise."""
    unknown = sorted(set(args) - set(algorithm.defaults))
    if unknown:
        have = ", ".join(algorithm.defaults) or "(none: a fixed graph)"
        raise ConfigError(f"{where}: algorithm {algorithm.name!r} has no attribute {', '.join(unknown)}; its attributes are {have}")
    for name, value in args.items():
        default = algorithm.defaults[name]
        if not _same_kind(value, default):
            raise ConfigError(f"{where}.{name}: algorithm {algorithm.name!r} takes a {type(default).__name__} for "
                              f"{name!r} (default {default!r}), got {type(value).__name__} {value!r}")


def _same_kind(value: object, default: object) -> bool:
    """Whether ``value`` can stand where the algorithm's ``default`` is: same JSON kind (an int for a float too)."""
    if default is None or value is None:
        return True  # an attribute without a default value, or one set back to none: the op judges it
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float)) and (isinstance(default, float) or isinstance(value, int))
    return isinstance(value, type(default))
