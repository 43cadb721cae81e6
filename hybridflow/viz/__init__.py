"""Drawings of hybridflow's IRs: graphs and plan placements (DOT/SVG through graphviz), schedule Gantt charts (hand-written SVG), Chrome/Perfetto traces.

- :mod:`.graph` — an algorithm graph; :mod:`.plan` — a plan's placement (pools, roles, layouts, weight syncs);
- :mod:`.gantt` — a plan's predicted schedule, a run's trace, or both on one time axis;
- :mod:`.trace` — a plan's predicted schedule as a Chrome trace; :mod:`.command` — ``hybridflow viz``.

This package reads IR only; graphviz is imported here and nowhere else.
"""
