"""Symbolic dims: ``B``, ``R``, ``B*8``, ``4``.

A dim is a product of symbols and one integer coefficient. Its canonical text
lists the symbols in alphabetical order, then the coefficient when it is not
1: ``"8*B"`` and ``"B*8"`` are both written ``"B*8"``; ``"B*1"`` is ``"B"``.

Type checking a node *unifies* the dims an op declares with the dims of the
fields it is given: each bare symbol the op declares (``B``) binds to the
given dim (``B*8``) the first time it is seen and must agree every later time.
Output dims are the op's declared dims with the bindings substituted.
"""
from __future__ import annotations

import re
from typing import Mapping

from ..names import IDENTIFIER_RE

__all__ = ["canonical", "factors", "is_symbol", "substitute", "unify", "symbols"]

_INT_RE = re.compile(r"^[0-9]+$")


def is_symbol(dim: str) -> bool:
    """True for a bare symbol such as ``B`` (not ``B*8``, not ``4``)."""
    return bool(IDENTIFIER_RE.match(dim))


def _factors(dim: str) -> tuple[int, tuple[str, ...]]:
    """``"B*8*n"`` -> ``(8, ("B", "n"))``; a part that is not an integer is kept as an opaque symbol."""
    coefficient, names = 1, []
    for part in dim.replace(" ", "").split("*"):
        if _INT_RE.match(part):
            coefficient *= int(part)
        else:
            names.append(part)
    return coefficient, tuple(sorted(names))


def _join(coefficient: int, names: tuple[str, ...]) -> str:
    parts = list(names) + ([str(coefficient)] if coefficient != 1 or not names else [])
    return "*".join(parts)


def canonical(dim: str) -> str:
    """The canonical text of ``dim``: ``"8*B"`` -> ``"B*8"``."""
    return _join(*_factors(dim))


def factors(dim: str) -> tuple[int, tuple[str, ...]]:
    """A dim as its integer coefficient and sorted symbols: ``"B*8"`` -> ``(8, ("B",))``, ``"4"`` -> ``(4, ())``."""
    return _factors(dim)


def symbols(dim: str) -> tuple[str, ...]:
    """The symbols a dim mentions: ``"B*n"`` -> ``("B", "n")``."""
    return _factors(dim)[1]


def substitute(dim: str, bindings: Mapping[str, str]) -> str:
    """Replace each bound symbol of ``dim`` by its binding and multiply out.

    >>> substitute("B*n", {"B": "B*2", "n": "4"})
    'B*8'
    """
    coefficient, names = _factors(dim)
    free: list[str] = []
    for name in names:
        if name in bindings:
            sub_coefficient, sub_names = _factors(bindings[name])
            coefficient *= sub_coefficient
            free.extend(sub_names)
        else:
            free.append(name)
    return _join(coefficient, tuple(sorted(free)))


def unify(declared: str, given: str, bindings: dict[str, str]) -> str | None:
    """Bind ``declared`` against ``given``; return None on success, else the expected dim.

    A bare symbol binds to ``given`` if unbound, otherwise must equal its
    binding; any other declared dim must equal ``given`` once bound symbols
    are substituted. ``bindings`` is updated in place.
    """
    given = canonical(given)
    if is_symbol(declared) and declared not in bindings:
        bindings[declared] = given
        return None
    expected = substitute(declared, bindings)
    return None if expected == given else expected
