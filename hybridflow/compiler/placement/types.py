"""Placement records: device pools, which roles share one, and each role's parallel layout."""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import PlacementError
from ..engine import DEFAULT_ENGINE
from ..layout import Layout

__all__ = ["Pool", "RolePlacement", "Placement"]


@dataclass(frozen=True)
class Pool:
    """A set of devices that one group of colocated roles shares.

    ``devices`` are global indices (device ``i`` is local device
    ``i % devices_per_node`` of node ``i // devices_per_node``); ``device_type``
    is ``"cuda"`` or ``"cpu"``.
    """

    devices: tuple[int, ...]
    device_type: str = "cuda"

    @property
    def size(self) -> int:
        return len(self.devices)

    def device_strings(self, devices_per_node: int | None = None) -> tuple[str, ...]:
        """``("cuda:0", "cuda:1")``, or ``("cpu",)``; with ``devices_per_node``, ``"node1/cuda:3"`` across nodes."""
        if self.device_type == "cpu":
            return ("cpu",) * self.size
        if devices_per_node is None:
            return tuple(f"{self.device_type}:{i}" for i in self.devices)
        return tuple(f"node{i // devices_per_node}/{self.device_type}:{i % devices_per_node}" for i in self.devices)

    def __str__(self) -> str:
        if self.device_type == "cpu":
            return "cpu"
        first, last = self.devices[0], self.devices[-1]
        if self.devices == tuple(range(first, last + 1)):
            return f"{self.device_type}[{first}:{last + 1}]" if self.size > 1 else f"{self.device_type}:{first}"
        return f"{self.device_type}{list(self.devices)}"


@dataclass(frozen=True)
class RolePlacement:
    """Where one role runs: its pool (index into ``Placement.pools``), training/inference layout and, for the generating role, its generation layout.

    ``engine``: the training engine that holds the role's states (``fsdp`` or
    ``megatron``; :mod:`hybridflow.compiler.engine`).
    """

    role: str
    pool: int
    layout: Layout
    gen_layout: Layout | None = None
    engine: str = DEFAULT_ENGINE

    def __str__(self) -> str:
        gen = f", generate {self.gen_layout}" if self.gen_layout else ""
        engine = f" [{self.engine}]" if self.engine != DEFAULT_ENGINE else ""
        return f"{self.role}: {self.layout}{engine}{gen}"


@dataclass(frozen=True)
class Placement:
    """Roles on pools. Roles sharing a pool are colocated and take turns; disjoint pools run concurrently.

    ``offload[k]`` says whether pool ``k``'s roles move their states to host
    memory between uses because they do not fit together.
    """

    pools: tuple[Pool, ...]
    roles: tuple[RolePlacement, ...]
    offload: tuple[bool, ...] = ()
    strategy: str = "manual"

    def __post_init__(self) -> None:
        if not self.offload:
            object.__setattr__(self, "offload", (False,) * len(self.pools))
        if len(self.offload) != len(self.pools):
            raise PlacementError(f"placement: {len(self.offload)} offload flags for {len(self.pools)} pools")
        for rp in self.roles:
            if not 0 <= rp.pool < len(self.pools):
                raise PlacementError(f"role {rp.role!r} is on pool {rp.pool}, but there are {len(self.pools)} pools")

    def of(self, role: str) -> RolePlacement:
        """The placement of ``role``."""
        for rp in self.roles:
            if rp.role == role:
                return rp
        raise PlacementError(f"role {role!r} is not placed; placed roles: {', '.join(r.role for r in self.roles)}")

    @property
    def groups(self) -> tuple[tuple[str, ...], ...]:
        """Role names per pool, in pool order."""
        return tuple(tuple(rp.role for rp in self.roles if rp.pool == k) for k in range(len(self.pools)))

    def describe(self) -> str:
        """Readable lines, one per pool: ``pool 0 cuda[0:8] (8): actor dp2·tp4·pp1, generate dp4·tp2·pp1; ref ...``."""
        lines = [f"placement ({self.strategy})"]
        for k, pool in enumerate(self.pools):
            roles = "; ".join(str(rp) for rp in self.roles if rp.pool == k)
            flag = " [offload]" if self.offload[k] else ""
            lines.append(f"  pool {k} {pool} ({pool.size}){flag}: {roles}")
        return "\n".join(lines)
