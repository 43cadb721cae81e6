"""Random edits of JSON documents for the fuzz tests (graph and plan files as users hand them over).

``edit(doc, data, extra_strings)`` changes one place of ``doc`` in place: a key deleted, a value
replaced by random JSON, a string swapped for another string of the document (or one of
``extra_strings``), or an entry duplicated.
"""
from __future__ import annotations

import json

from hypothesis import strategies as st

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def paths(value, prefix=()):
    """Every path (tuple of keys and indices) in ``value``, the root's () first."""
    yield prefix
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from paths(child, prefix + (key,))


def strings(value) -> list[str]:
    """Every string value in ``value``."""
    if isinstance(value, str):
        return [value]
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [s for child in children for s in strings(child)]


def edit(doc, data, extra_strings: tuple[str, ...] = ()) -> None:
    """One random edit of ``doc`` (module docstring), drawn from hypothesis ``data``."""
    path = data.draw(st.sampled_from([p for p in paths(doc) if p]))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key, how = path[-1], data.draw(st.sampled_from(["delete", "replace", "swap_string", "duplicate"]))
    if how == "delete":
        del parent[key]
    elif how == "replace":
        parent[key] = data.draw(JSON_VALUES)
    elif how == "swap_string":  # a plausible value from elsewhere in the document: a node name, a dtype, a dim ...
        parent[key] = data.draw(st.sampled_from(strings(doc) + list(extra_strings)))
    elif isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(parent[key])))
    else:
        parent[key] = [parent[key], parent[key]]
