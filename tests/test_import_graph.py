"""The packages of hybridflow import each other without a cycle.

Read from the source with ``ast`` (nothing is imported): every ``import`` and ``from ... import`` statement, at
module level or inside a function (a deferred import is still a dependency), gives an edge from the package of
the importing module to the package of the imported one. A package is ``hybridflow.<name>`` (a subpackage such
as ``hybridflow.compiler`` or a top-level module such as ``hybridflow.batch``) or ``hybridflow_ops``. Facades are
left out: ``hybridflow/__init__.py``, and the imports inside a module's ``__getattr__`` (PEP 562), which only
re-export names for users' import paths (``from hybridflow.algorithms import GRPOTrainer``, the seed article's)
and are not used by the package's own code. The layering this keeps, lowest first:
``errors``, ``names``, ``capabilities``, ``batch``, ``hybridflow_ops`` < ``graph`` < ``algorithms``, ``compiler``, ``data``, ``viz``
< ``runtime`` < ``rewards``, ``trainer``, ``commands`` (the compiler decides, the runtime runs what it decided;
the facts about the runtime that the compiler predicts with, engine names, the shared-prompt threshold and the
weight-sync bucket size, are in ``capabilities``, which both read and which imports neither).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("hybridflow", "hybridflow_ops")


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "hybridflow_ops":
        return "hybridflow_ops"
    if parts[0] != "hybridflow" or len(parts) < 2:
        return None  # outside the project, or the facade
    return f"hybridflow.{parts[1]}"


def _imported(node: ast.AST, module: str, is_package: bool, root: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if not node.level:
            return [node.module or ""]
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
        if node.module is None:  # from . import a, b: a name is a module where a file or folder says so
            where = root.joinpath(*target.split("."))
            return [f"{target}.{alias.name}" if (where / f"{alias.name}.py").is_file() or (where / alias.name).is_dir()
                    else target for alias in node.names]
        return [target]
    return []


def import_edges(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the ``file:line`` of each import statement making the edge."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for top in TOPS:
        for file in sorted((root / top).rglob("*.py")):
            parts = file.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_package else parts)
            source = _package(module)
            if source is None:
                continue
            tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
            facade = {id(n) for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
                      for n in ast.walk(f)}
            for node in ast.walk(tree):
                if id(node) in facade:
                    continue
                for target in _imported(node, module, is_package, root):
                    dest = _package(target)
                    if dest is not None and dest != source:
                        edges[(source, dest)].append(f"{file.relative_to(root)}:{node.lineno}")
    return dict(edges)


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan), each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_two_and_a_three_package_cycle():
    edges = {("a", "b"): [], ("b", "a"): [], ("c", "d"): [], ("d", "e"): [], ("e", "c"): [], ("e", "f"): []}
    assert sorted(cycles(edges)) == [["a", "b"], ["c", "d", "e"]]
    assert cycles({("a", "b"): [], ("b", "c"): []}) == []


def test_the_import_reader_resolves_relative_and_deferred_imports(tmp_path):
    pkg = tmp_path / "hybridflow"
    (pkg / "compiler").mkdir(parents=True)
    (pkg / "runtime").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "compiler" / "__init__.py").write_text("")
    (pkg / "compiler" / "x.py").write_text("def f():\n    from ..runtime.y import g\n")
    (pkg / "runtime" / "__init__.py").write_text("from ..compiler import x\n\n\ndef __getattr__(name):\n    from .. import trainer\n")
    (tmp_path / "hybridflow_ops").mkdir()
    edges = import_edges(tmp_path)
    assert edges == {("hybridflow.compiler", "hybridflow.runtime"): ["hybridflow/compiler/x.py:2"],
                     ("hybridflow.runtime", "hybridflow.compiler"): ["hybridflow/runtime/__init__.py:1"]}
    assert cycles(edges) == [["hybridflow.compiler", "hybridflow.runtime"]]


def test_no_import_cycle_between_packages():
    edges = import_edges()
    packages = sorted({p for edge in edges for p in edge})
    print("package imports (importer -> imported):")
    for package in packages:
        print(f"  {package} -> {', '.join(sorted(b for a, b in edges if a == package)) or '-'}")
    assert {"hybridflow.compiler", "hybridflow.runtime", "hybridflow.trainer"} <= set(packages)  # the reader read them
    found = cycles(edges)
    where = {tuple(c): [f"{a} -> {b} at {', '.join(edges[(a, b)][:3])}" for (a, b) in edges if a in c and b in c]
             for c in found}
    assert not found, f"import cycles between packages: {where}"


def test_every_source_folder_is_a_package_the_wheel_includes():
    """pyproject's ``packages.find`` takes only folders with an ``__init__.py``: a folder of modules without one
    works from a checkout (editable install) and is missing from a built wheel."""
    folders = {f.parent for top in TOPS for f in (ROOT / top).rglob("*.py") if "__pycache__" not in f.parts}
    missing = sorted(str(d.relative_to(ROOT)) for d in folders if not (d / "__init__.py").is_file())
    assert not missing, f"folders without __init__.py (left out of the wheel): {missing}"
