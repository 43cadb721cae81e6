"""Placement: roles -> device pools and parallel layouts, by hand or by search.

- :mod:`.types`: ``Pool``, ``RolePlacement``, ``Placement``.
- :mod:`.evaluate`: the simulated iteration of a placement (the score).
- :mod:`.options`: per-role and per-group candidates, pruned by dominance.
- :mod:`.search`: automatic search, fixed strategies (colocate, split, standalone).
- :mod:`.manual`: user pools and ``device_map`` dicts.
"""
from .evaluate import GroupCost, PlacementCost, evaluate
from .manual import PoolSpec, manual_placement, placement_from_device_map
from .search import FIXED_STRATEGIES, ScoredPlacement, SearchResult, allowed_sizes, place, place_fixed, search
from .types import Placement, Pool, RolePlacement

__all__ = [
    "Pool", "RolePlacement", "Placement", "GroupCost", "PlacementCost", "evaluate",
    "PoolSpec", "manual_placement", "placement_from_device_map",
    "FIXED_STRATEGIES", "ScoredPlacement", "SearchResult", "allowed_sizes", "place", "place_fixed", "search",
]
