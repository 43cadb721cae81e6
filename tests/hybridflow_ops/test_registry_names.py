"""A taken op name is an error, except for the same function of the same module registering again
(a module imported a second time: ``importlib.reload``, or dropped from ``sys.modules`` and imported)."""
from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from hybridflow_ops.registry import OpRegistryError, get_op, register_op, unregister_op

SOURCE = textwrap.dedent('''
    from hybridflow_ops.registry import register_op

    @register_op("reloaded_scale", inputs=("scores: float32[B]",), outputs=("scores: float32[B]",))
    def scale(scores, *, factor={factor}):
        return scores * factor
''')


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("reloaded_ops_module", None)
    unregister_op("reloaded_scale")


def test_a_reimported_module_replaces_its_own_op(module_dir):
    (module_dir / "reloaded_ops_module.py").write_text(SOURCE.format(factor=2.0))
    module = importlib.import_module("reloaded_ops_module")
    assert dict(get_op("reloaded_scale").attr_defaults)["factor"] == 2.0
    (module_dir / "reloaded_ops_module.py").write_text(SOURCE.format(factor=3.0))
    importlib.reload(module)  # a notebook's reload after an edit: the new definition wins
    assert dict(get_op("reloaded_scale").attr_defaults)["factor"] == 3.0
    sys.modules.pop("reloaded_ops_module")
    importlib.import_module("reloaded_ops_module")  # dropped and imported again
    assert get_op("reloaded_scale").fn.__module__ == "reloaded_ops_module"


def test_another_function_under_a_taken_name_is_refused(module_dir):
    (module_dir / "reloaded_ops_module.py").write_text(SOURCE.format(factor=2.0))
    importlib.import_module("reloaded_ops_module")
    with pytest.raises(OpRegistryError, match=r"'reloaded_scale' is already registered \(by reloaded_ops_module\)"):
        @register_op("reloaded_scale", inputs=("scores: float32[B]",), outputs=("scores: float32[B]",))
        def scale(scores):  # same name, another module: a clash
            return scores
    with pytest.raises(OpRegistryError, match="'ppo_clip' is already registered"):
        register_op("ppo_clip", outputs=("loss: float32",), kind="loss")(lambda advantages: advantages)
