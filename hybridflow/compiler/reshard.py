"""Weight-sync math: moving the actor's weights from its training layout to its generation layout.

Same pool — the 3D-HybridEngine (HybridFlow, Sheng et al. EuroSys 2025, §5).
The actor trains on ``(p, t, d)`` (pipeline, tensor, data) and generates on
``(pg, tg, dg)`` over the *same* devices. Each generation rank needs one
generation shard, ``M/(tg·pg)`` bytes. The training weights form a grid of
pieces: ``p`` layer stages x ``C`` column pieces, where ``C = t`` when the dp
replicas hold copies (Megatron, the paper's setting) and ``C = t·d`` when ZeRO-3 /
FSDP also shards each tensor-parallel piece over the d replicas (rank ``(r, i, j)``
then holds column piece ``j·d + r``). With ``pg | p`` and ``tg | C`` every
generation shard ``(a, b)`` is a union of ``d_m = (p/pg)·(C/tg)`` training
pieces; for the paper's case ``d_m = t·p / (tg·pg)``.

The construction (§5, figure 8): inside each copy of the weights, the ranks
whose pieces make up generation shard ``(a, b)`` form one **micro-DP group**
(size ``d_m``); they all-gather within it, after which each holds shard ``(a, b)``
— its own piece is part of it, so nothing is held twice. Generation replica
``k`` of a copy is the ``k``-th rank (by rank order) of every micro-DP group of
that copy, so it holds every ``(a, b)`` exactly once: ``dg = copies · d_m``.

Per rank (table 2, "HybridFlow"): it receives ``M/(tg·pg) − M/(p·C)`` bytes,
which for ``C = t`` is ``(t·p − tg·pg)/(tg·pg·t·p) · M``; peak memory ``M/(tg·pg)``;
redundancy 0. :func:`table2` also gives the paper's comparison rows.

Which formula holds depends on the training engine
(:func:`transition_figures`): the ``megatron`` engine replicates weights over
dp, ``C = t``, which is the paper's formula; the ``fsdp`` engine (ZeRO-3)
shards them over dp as well, ``C = t·d``, so each rank receives
``M/(tg·pg) − M/(t·p·d)`` — the paper's value plus ``(d − 1)/(t·p·d)·M``,
equal to it only when ``d = 1``.

Across pools — the trainer gathers its weights bucket by bucket and rank 0
broadcasts each bucket along a chain of the rollout ranks (OpenRLHF-style
``broadcast`` weight update): every rollout rank receives ``M`` and keeps its
slice; see :func:`cross_pool_sync`.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..capabilities import WEIGHT_SYNC_BUCKET_BYTES
from ..errors import PlanError
from .cluster import ClusterSpec
from .comm import all_gather_volume, broadcast_time
from .engine import shards_weights_over_dp
from .layout import Layout

__all__ = [
    "HybridEngineGroups", "ReshardFigures", "BroadcastSync",
    "hybrid_engine_groups", "hybrid_engine_figures", "transition_figures", "table2", "cross_pool_sync", "train_coords",
]


@dataclass(frozen=True)
class HybridEngineGroups:
    """The rank groups of one hybrid-engine transition.

    ``micro_dp_groups[g]``: the ranks that all-gather together; they end up
    holding generation shard ``shard_of_group[g] = (pg_rank, tg_rank)``.
    ``gen_groups[k]``: the ``tg·pg`` ranks of generation replica ``k``, ordered
    pg-major, tg-minor (so ``gen_groups[k][a·tg + b]`` holds shard ``(a, b)``).
    """

    train: Layout
    gen: Layout
    sharded_over_dp: bool
    micro_dp_groups: tuple[tuple[int, ...], ...]
    shard_of_group: tuple[tuple[int, int], ...]
    gen_groups: tuple[tuple[int, ...], ...]

    @property
    def micro_dp_size(self) -> int:
        """d_m: ranks per micro-DP group."""
        return len(self.micro_dp_groups[0])

    def gen_coords(self, rank: int) -> tuple[int, int, int]:
        """(generation replica, pg rank, tg rank) of training rank ``rank``."""
        for k, members in enumerate(self.gen_groups):
            if rank in members:
                a, b = divmod(members.index(rank), self.gen.tp)
                return k, a, b
        raise PlanError(f"rank {rank} is not in the {self.train.size}-rank pool")

    def micro_dp_group_of(self, rank: int) -> int:
        """Index of the micro-DP group ``rank`` belongs to."""
        return next(g for g, members in enumerate(self.micro_dp_groups) if rank in members)


def train_coords(rank: int, train: Layout) -> tuple[int, int, int]:
    """(dp replica r, pp stage i, tp rank j) of ``rank`` = r·(p·t) + i·t + j."""
    r, rest = divmod(rank, train.tp * train.pp)
    i, j = divmod(rest, train.tp)
    return r, i, j


def _column_pieces(train: Layout, sharded_over_dp: bool) -> int:
    return train.tp * train.dp if sharded_over_dp else train.tp


def _check_compatible(train: Layout, gen: Layout, sharded_over_dp: bool) -> None:
    columns = _column_pieces(train, sharded_over_dp)
    if gen.size != train.size:
        raise PlanError(f"generation layout {gen} uses {gen.size} devices but training layout {train} uses {train.size}; the hybrid engine reshards within one pool")
    if train.pp % gen.pp or columns % gen.tp:
        need = f"tg | {columns} ({'t·d' if sharded_over_dp else 't'})"
        raise PlanError(f"generation layout {gen} cannot be formed from training layout {train} without redundant copies: need pg | {train.pp} and {need}; pick such a generation layout")


def hybrid_engine_groups(train: Layout, gen: Layout, sharded_over_dp: bool = True) -> HybridEngineGroups:
    """Micro-DP groups and generation replicas for ``train -> gen`` (construction in the module docstring)."""
    _check_compatible(train, gen, sharded_over_dp)
    columns = _column_pieces(train, sharded_over_dp)
    stages_per_block, columns_per_block = train.pp // gen.pp, columns // gen.tp
    groups: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for rank in range(train.size):
        r, i, j = train_coords(rank, train)
        copy, column = (0, j * train.dp + r) if sharded_over_dp else (r, j)
        groups[(copy, i // stages_per_block, column // columns_per_block)].append(rank)
    keys = sorted(groups)
    d_m = stages_per_block * columns_per_block
    replicas: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for copy, a, b in keys:
        for k, rank in enumerate(groups[(copy, a, b)]):
            replicas[copy * d_m + k].append((a, b, rank))
    gen_groups = tuple(tuple(rank for _, _, rank in sorted(replicas[k])) for k in sorted(replicas))
    return HybridEngineGroups(
        train=train, gen=gen, sharded_over_dp=sharded_over_dp,
        micro_dp_groups=tuple(tuple(groups[k]) for k in keys),
        shard_of_group=tuple((a, b) for _, a, b in keys), gen_groups=gen_groups)


@dataclass(frozen=True)
class ReshardFigures:
    """Per-rank bytes of one training -> generation transition."""

    comm_volume_bytes: float
    """Bytes each rank receives."""
    peak_memory_bytes: float
    """Largest weight footprint on a rank during the transition."""
    redundant_bytes: float
    """Weights a rank holds twice (a training shard kept beside a generation shard that does not contain it)."""


def hybrid_engine_figures(model_bytes: float, train: Layout, gen: Layout, sharded_over_dp: bool = True) -> ReshardFigures:
    """HybridFlow's transition: receive M/(tg·pg) − M/(p·C), peak M/(tg·pg), no redundancy."""
    _check_compatible(train, gen, sharded_over_dp)
    piece = model_bytes / (train.pp * _column_pieces(train, sharded_over_dp))
    shard = model_bytes / gen.model_parallel
    return ReshardFigures(comm_volume_bytes=shard - piece, peak_memory_bytes=shard, redundant_bytes=0.0)


def transition_figures(model_bytes: float, train: Layout, gen: Layout, engine: str) -> ReshardFigures:
    """The hybrid-engine transition of a model trained by ``engine``.

    ``megatron``: HybridFlow's table 2, ``M/(tg·pg) − M/(t·p)`` per rank.
    ``fsdp``: ``M/(tg·pg) − M/(t·p·d)`` (pieces are also split over dp).
    """
    return hybrid_engine_figures(model_bytes, train, gen, sharded_over_dp=shards_weights_over_dp(engine))


def table2(model_bytes: float, train: Layout, gen: Layout) -> dict[str, ReshardFigures]:
    """The columns of HybridFlow's table 2 (Sheng et al. 2025, §5), training on ``(p, t, d)``, generating on ``(pg, tg, dg)``.

    Weights are replicated over d, as in the paper; each row is
    (bytes received per rank, peak weight bytes, redundant weight bytes).

    - ``openrlhf``: generation on separate devices; each rollout rank
      receives the whole model: ``M``, ``M``, ``M``.
    - ``ds-chat``: the whole training pool all-gathers the model:
      ``(t·p·d − 1)/(t·p·d)·M``, ``M``, ``M/(t·p·d)``.
    - ``hybridflow-v``: each training model-parallel group all-gathers it:
      ``(t·p − 1)/(t·p)·M``, ``M``, ``M/(t·p)``.
    - ``hybridflow``: micro-DP all-gather,
      ``(t·p − tg·pg)/(tg·pg·t·p)·M``, ``M/(tg·pg)``, ``0``.
    """
    n, mp, gp = train.size, train.model_parallel, gen.model_parallel
    m = model_bytes
    return {
        "openrlhf": ReshardFigures(m, m, m),
        "ds-chat": ReshardFigures((n - 1) / n * m, m, m / n),
        "hybridflow-v": ReshardFigures((mp - 1) / mp * m, m, m / mp),
        "hybridflow": ReshardFigures((mp - gp) / (gp * mp) * m, m / gp, 0.0),
    }


@dataclass(frozen=True)
class BroadcastSync:
    """A bucketed weight broadcast from a training pool to a separate rollout pool."""

    buckets: int
    gather_volume_per_trainer_rank: float
    """Bytes each trainer rank receives while assembling full buckets (ring all-gather of every bucket)."""
    volume_per_receiver: float
    """Bytes each rollout rank receives: the whole model M."""
    bytes_sent_by_source: float
    """Bytes trainer rank 0 sends: M (a chain forwards the rest)."""
    time_s: float


def cross_pool_sync(model_bytes: float, trainer: Layout, rollout: Layout, cluster: ClusterSpec,
                    bucket_bytes: float = WEIGHT_SYNC_BUCKET_BYTES, same_node: bool = False) -> BroadcastSync:
    """Volume and time of sending ``model_bytes`` from ``trainer`` to the ``rollout`` pool.

    Step 1, per bucket: the trainer ranks all-gather it (each receives
    (n−1)/n of it, n = trainer size; the weights are sharded over all n ranks).
    Step 2: trainer rank 0 broadcasts the bucket along a chain of the
    ``rollout.size`` ranks. The two steps pipeline over buckets, so the time
    is the slower of the two plus one bucket of the other:
    ``max(T_gather, T_bcast) + min(T_gather, T_bcast)/k``.
    """
    buckets = max(1, -(-int(model_bytes) // int(bucket_bytes)))
    gather = all_gather_volume(model_bytes, trainer.size)
    gather_bw = cluster.link_bandwidth(trainer.size)
    t_gather = gather / gather_bw + buckets * cluster.collective_latency_s * (trainer.size > 1)
    link = cluster.link_bandwidth(1 if same_node else cluster.devices_per_node + 1)
    t_bcast = broadcast_time(model_bytes, rollout.size, model_bytes / buckets, link, cluster.collective_latency_s)
    time = max(t_gather, t_bcast) + min(t_gather, t_bcast) / buckets
    return BroadcastSync(buckets=buckets, gather_volume_per_trainer_rank=gather, volume_per_receiver=model_bytes,
                         bytes_sent_by_source=model_bytes, time_s=time)
