"""placement.options.pareto against its definition, checked pair by pair."""
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.compiler.placement.options import pareto

vectors = st.lists(st.tuples(*[st.integers(0, 4).map(float)] * 3), max_size=40)


def _dominated(v, w) -> bool:
    return all(a <= b for a, b in zip(w, v))  # w <= v everywhere


@settings(max_examples=300, deadline=None)
@given(vectors)
def test_pareto_keeps_exactly_the_undominated_vectors_once(items):
    kept = pareto(items, key=lambda v: v)
    # nothing kept is dominated by a different vector, and equal vectors are kept once
    assert len(set(kept)) == len(kept)
    assert not any(_dominated(v, w) and w != v for v in kept for w in items)
    # everything left out is dominated by something kept (or equals it)
    assert all(any(_dominated(v, w) for w in kept) for v in items)
    # fastest (smallest sum) first
    assert [sum(v) for v in kept] == sorted(sum(v) for v in kept)
