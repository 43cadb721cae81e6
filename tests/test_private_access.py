"""No module of hybridflow uses another module's private names.

Read from the source with ``ast`` (nothing is imported). A *private name* is one with a leading underscore that
is not a dunder. A module *defines* a private name when it binds it: a function, class or variable of that name
(at any depth), an attribute assigned on ``self`` or ``cls``, a ``__slots__`` entry, or
``object.__setattr__(self, "_name", ...)``. Two uses are checked, in ``hybridflow`` and ``hybridflow_ops``:

* ``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()``, and ``_name`` is defined by another of our
  modules but not by this one (a module may use its own private names on other objects of its own classes);
* ``from <one of our modules> import _name`` from another module.

Only our own modules' names count: ``torch._C`` or ``config._attn_implementation`` (transformers) are no
attribute of ours, so they are not reported. The one exception, :data:`STANDARD_API`, is namedtuple's public
API, whose names start with an underscore and collide with private names of ours.

Run as a script to print the uses (``python tests/test_private_access.py [PATH ...]``; default: the two packages).
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("hybridflow", "hybridflow_ops")
STANDARD_API = frozenset({"_fields", "_replace", "_asdict", "_make", "_field_defaults"})
"""namedtuple's public methods and attributes (``result._fields``, ``packed._replace(...)``)."""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name not in STANDARD_API


def _module_name(file: Path, root: Path) -> str:
    parts = file.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _bound(target: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and _private(node.id):
            names.add(node.id)
        elif (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
              and node.value.id in ("self", "cls")):
            names.add(node.attr)
    return names


def defined_names(tree: ast.AST) -> set[str]:
    """The private names a module defines (module docstring)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= _bound(target)
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)):
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                          and _private(c.value)}
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            names.add(node.args[1].value)
    return names


def _imported_module(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def private_uses(root: Path = ROOT, scan: tuple[Path, ...] | None = None) -> list[str]:
    """``file:line: what`` for every use of another module's private name in the files under ``scan``."""
    files = {f: ast.parse(f.read_text(), str(f)) for top in TOPS for f in sorted((root / top).rglob("*.py"))}
    defined = {f: defined_names(tree) for f, tree in files.items()}
    owners: dict[str, set[Path]] = defaultdict(set)
    for file, names in defined.items():
        for name in names:
            owners[name].add(file)
    uses = []
    for base in scan or tuple(root / top for top in TOPS):
        for file in sorted(base.rglob("*.py")) if base.is_dir() else [base]:
            tree = files.get(file) or ast.parse(file.read_text(), str(file))
            mine = defined.get(file, set())
            module = _module_name(file, root)
            where = file.relative_to(root)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in mine:
                    value = node.value
                    if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                        continue
                    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                        continue
                    if owners.get(node.attr, set()) - {file}:
                        uses.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
                elif isinstance(node, ast.ImportFrom):
                    source = _imported_module(node, module, file.name == "__init__.py")
                    if source.split(".")[0] in TOPS and source != module:
                        uses.extend(f"{where}:{node.lineno}: from {source} import {alias.name}"
                                    for alias in node.names if _private(alias.name))
    return uses


def test_no_module_uses_another_module_s_private_names():
    uses = private_uses()
    assert not uses, ("private names of another module are used; make them public (and documented) or pass what is "
                      "needed:\n" + "\n".join(uses))


def test_the_checker_finds_each_kind_of_use(tmp_path):
    package = tmp_path / "hybridflow"
    package.mkdir()
    (tmp_path / "hybridflow_ops").mkdir()
    (package / "__init__.py").write_text("")
    (package / "engine.py").write_text("class Engine:\n    def __init__(self):\n        self._shuffle = 1\n\n"
                                       "    def _drive(self):\n        return self._shuffle\n\n\n_TABLE = {}\n")
    (package / "user.py").write_text("import torch\nfrom .engine import _TABLE\n\n\ndef use(engine):\n"
                                     "    engine._drive()\n    torch._C\n    return engine._shuffle\n")
    (package / "same.py").write_text("class Pair:\n    def __init__(self):\n        self._shuffle = 0\n\n"
                                     "    def __eq__(self, other):\n        return self._shuffle == other._shuffle\n")
    assert sorted(private_uses(tmp_path)) == ["hybridflow/user.py:2: from hybridflow.engine import _TABLE",
                                              "hybridflow/user.py:6: engine._drive",
                                              "hybridflow/user.py:8: engine._shuffle"]


if __name__ == "__main__":
    found = private_uses(ROOT, tuple(Path(p).resolve() for p in sys.argv[1:]) or None)
    print("\n".join(found))
    print(f"{len(found)} use(s) of another module's private names")
