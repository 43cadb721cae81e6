"""Placement requests as users write them (not a pass: the ``placement`` pass reads these).

A request is one of:

- ``"auto"`` — search (:func:`hybridflow.compiler.placement.search`);
- ``"colocate"``, ``"split"``, ``"standalone"`` — the fixed strategies;
- a **manual spec**: pools separated by ``;``, each ``ROLES@DEVICES`` with
  roles joined by ``+``, a role optionally with its layout in parentheses::

      actor+ref@8;critic+reward@8
      actor(dp2,tp4,pp1)+ref@8;critic+reward@8
      actor+ref@8;critic+reward@4;actor.generate@4      # rollout on its own 4 devices

  ``ROLE.generate`` names a dedicated pool for that role's rollout engine
  (disaggregated generation: its weights are broadcast there after each
  update); in Python, a list of :class:`~hybridflow.compiler.placement.PoolSpec`
  and :class:`RolloutPool`;
- a **device map**: ``actor=cuda:0,critic=cuda:1,reward=cpu`` or the dict
  ``{"actor": "cuda:0", ...}`` (one device per role; roles on one device share it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ...errors import ConfigError, PlacementError
from ...names import DEVICE_RE, IDENTIFIER
from ..layout import Layout
from ..placement import FIXED_STRATEGIES, Placement, PoolSpec

__all__ = ["RolloutPool", "ResolvedPlacement", "STRATEGIES", "ROLE_ALIASES", "parse_placement", "normalise_device"]

STRATEGIES = ("auto", *FIXED_STRATEGIES)
_ROLE = re.compile(rf"^\s*({IDENTIFIER})(\.generate)?\s*(?:\(([^)]*)\))?\s*$")

ROLE_ALIASES = {"rm": "reward", "reward_model": "reward", "reference": "ref", "policy": "actor"}
"""Role names the seed article's ``device_map`` uses for the graph's roles (``rm`` is the reward)."""


def normalise_device(device: str, role: str) -> str:
    """``"cuda"`` -> ``"cuda:0"``; anything but cpu / cuda[:N] / mps is a PlacementError."""
    text = str(device).strip().lower()
    if not DEVICE_RE.match(text):
        raise PlacementError(f"device_map[{role!r}] = {device!r} is not a device; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return "cuda:0" if text == "cuda" else text


@dataclass(frozen=True)
class RolloutPool:
    """A pool of ``devices`` devices that runs only ``role``'s rollout engine, optionally on a given layout."""

    role: str
    devices: int
    layout: Layout | None = None


@dataclass(frozen=True)
class ResolvedPlacement:
    """A decided placement: the roles' pools, and optionally a dedicated rollout pool.

    ``rollout`` is (role, device indices, generation layout). ``search_s`` is
    the time the search that found it took (0 for manual placements).
    """

    placement: Placement
    rollout: tuple[str, tuple[int, ...], Layout] | None = None
    strategy: str = "manual"
    search_s: float = 0.0


def _pool(text: str) -> PoolSpec | RolloutPool:
    roles_text, sep, count = text.rpartition("@")
    if not sep or not count.strip().isdigit() or int(count) < 1:
        raise ConfigError(f"placement pool {text!r}: write ROLES@DEVICES, e.g. 'actor+ref@8'")
    devices, roles, layouts, rollout = int(count), [], {}, None
    for part in roles_text.split("+"):
        match = _ROLE.match(part)
        if not match:
            raise ConfigError(f"placement pool {text!r}: {part!r} is not a role, ROLE(dpD,tpT,ppP) or ROLE.generate")
        name, generate, layout = match.groups()
        if generate:
            rollout = RolloutPool(name, devices, Layout.parse(layout) if layout else None)
            continue
        roles.append(name)
        if layout:
            layouts[name] = str(Layout.parse(layout))
    if rollout and roles:
        raise ConfigError(f"placement pool {text!r}: a rollout pool ({rollout.role}.generate) holds nothing else; "
                          "give the other roles their own pool")
    return rollout or PoolSpec(roles=tuple(roles), devices=devices, layouts=layouts)


def parse_placement(request: Any) -> Any:
    """Normalise a request: strategy names stay strings; spec strings become pool lists or device maps."""
    if not isinstance(request, str):
        return dict(request) if isinstance(request, Mapping) else request
    text = request.strip()
    if text in STRATEGIES:
        return text
    if "@" in text:
        return [_pool(p) for p in text.split(";") if p.strip()]
    if "=" in text:
        pairs = [p.partition("=") for p in text.split(",") if p.strip()]
        if any(not sep or not k.strip() or not v.strip() for k, sep, v in pairs):
            raise ConfigError(f"device map {text!r}: write ROLE=DEVICE pairs separated by commas, e.g. 'actor=cuda:0,reward=cpu'")
        return {k.strip(): v.strip() for k, _, v in pairs}
    raise ConfigError(f"placement {text!r}: use {', '.join(STRATEGIES)}, a pool spec like 'actor+ref@8;critic+reward@8', "
                      "or a device map like 'actor=cuda:0,critic=cuda:1'")
