"""Symbolic dims: canonical text, substitution, unification."""
from __future__ import annotations

from hybridflow.graph import dims as D


def test_canonical_orders_symbols_then_the_coefficient():
    assert D.canonical("8*B") == "B*8"
    assert D.canonical("B*1") == "B"
    assert D.canonical("n*B*2*2") == "B*n*4"
    assert D.canonical("4") == "4"


def test_substitute_multiplies_out():
    assert D.substitute("B*n", {"B": "B*2", "n": "4"}) == "B*8"  # 2 prompts' worth times 4 samples
    assert D.substitute("B*n", {"B": "B", "n": "1"}) == "B"
    assert D.substitute("R", {"B": "B*2"}) == "R"  # unbound symbols stay


def test_unify_binds_then_checks():
    bindings: dict[str, str] = {}
    assert D.unify("B", "B*8", bindings) is None and bindings == {"B": "B*8"}
    assert D.unify("B", "8*B", bindings) is None  # same dim, other spelling
    assert D.unify("B", "B", bindings) == "B*8"  # disagrees: returns what was expected
    assert D.unify("4", "4", bindings) is None
    assert D.unify("4", "B", bindings) == "4"


def test_malformed_parts_are_opaque_symbols_not_crashes():
    assert D.canonical("B*8x") == "8x*B"
    assert D.unify("B", "B*8x", {}) is None
