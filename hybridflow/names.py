"""The shapes of the names a user writes, defined once: identifiers, graph names and device strings.

Patterns without anchors, to be composed into larger ones (``rf"^role ({NAME}): ..."``); the ``*_RE``
forms match a whole string.
"""
from __future__ import annotations

import re

__all__ = ["IDENTIFIER", "NAME", "DEVICE", "IDENTIFIER_RE", "NAME_RE", "DEVICE_RE"]

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
"""A Python-style identifier (ASCII): field names, attribute names, dimension symbols, role names in placements."""
NAME = r"[A-Za-z_][A-Za-z0-9_.\-]*"
"""A graph, node, role or input name: an identifier that may also hold ``.`` and ``-`` (``actor.generate``)."""
DEVICE = r"(?:cpu|mps|cuda(?::(?P<index>\d+))?)"
"""A device string: ``cpu``, ``mps``, ``cuda`` or ``cuda:N`` (group ``index``: the N)."""

IDENTIFIER_RE = re.compile(rf"^{IDENTIFIER}$")
NAME_RE = re.compile(rf"^{NAME}$")
DEVICE_RE = re.compile(rf"^{DEVICE}$")
