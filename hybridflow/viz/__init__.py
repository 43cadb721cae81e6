"""Drawings of hybridflow's IRs: graphs now (DOT/SVG through graphviz); plans and traces are added alongside.

This package reads IR only; graphviz is imported here and nowhere else.
"""
