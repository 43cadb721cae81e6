"""What the runtime may ask of an engine: the rollout and train protocols.

Role workers, weight sync, checkpoints and the Ray stand-ins call engines only
through these methods (DESIGN.md, "Engines behind protocols"); no code outside
an engine's own module reads its concrete attributes (``.model``, generator
tables, vLLM handles). A new backend is one class satisfying the protocol plus
one entry in :data:`~.registry.ROLLOUT_ENGINES`.

Rollout batch contract (every rollout engine, see :mod:`.rollout_hf`):
``generate(batch, sampling)`` takes left-padded ``prompt_ids`` / ``prompt_mask``
``(b, P)`` and returns the batch repeated ``n`` times (``repeat_interleave``
order) with ``response_ids`` int64 ``(b·n, R)`` right-padded to
``R = max_new_tokens``, ``response_mask`` float32 ``(b·n, R)`` (1 up to and
including the first EOS or pad), ``rollout_log_probs`` float32 ``(b·n, R)``
(``log_softmax(logits / T)`` at the sampled token, before top-k/top-p
truncation, 0 at padding), ``group_index`` int64 ``(b·n,)``, ``policy_version``
int64 ``(b·n, R)`` (the engine's :attr:`~RolloutEngine.policy_version` when each
token was decoded, -1 at padding; a weight sync sets it to the trained policy's step count,
:mod:`hybridflow.runtime.policy_version`) and, with a tokenizer, the ``responses`` text column.
Partial rollouts (``segment_tokens``, ``resume``) are described in :mod:`.segments`.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import torch

from ...batch import Batch
from .sampling import SamplingParams

__all__ = ["RolloutEngine", "TrainEngineProtocol", "NamedTensors"]

NamedTensors = Iterable[tuple[str, torch.Tensor]]
"""``(name, full tensor)`` pairs in the *training* model's naming (``model.layers.0.self_attn.q_proj.weight``)."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates responses and takes new weights; see the module docstring for the batch contract."""

    sampling: SamplingParams
    """Default sampling of :meth:`generate` (a node's overrides are applied on top of it)."""

    policy_version: int
    """Weight syncs applied to the engine (the worker adds one per completed sync); stamped on every token."""

    def generate(self, batch: Batch, sampling: SamplingParams | None = None, *, segment_tokens: int | None = None,
                 resume: bool = False) -> Batch:
        """Responses for every prompt of ``batch`` (``sampling.n`` each), in the batch contract.

        ``segment_tokens``: decode at most that many positions and return the partial state; ``resume``: continue
        such a partial rollout (:mod:`.segments`). An engine without partial rollouts raises ExecutionError."""
        ...

    def update_weights(self, named_tensors: NamedTensors) -> int:
        """Load ``(name, tensor)`` pairs (the whole model, or one bucket of it); returns the tensors taken.

        Buckets of one sync arrive as consecutive calls; an engine that can only swap whole models
        (vLLM) holds them until every tensor of :meth:`weight_shapes` has arrived. An unknown name or
        a wrong shape is an ExecutionError naming it.
        """
        ...

    def weight_shapes(self) -> Mapping[str, tuple[int, ...]]:
        """Name -> shape of every tensor :meth:`update_weights` expects (the training model's state dict)."""
        ...

    def shares_weights_with(self, train: Any) -> bool:
        """Whether this engine samples from the very tensors ``train`` optimises (then a weight sync copies nothing)."""
        ...

    def rng_state(self) -> dict[str, Any]:
        """The sampling randomness as JSON-ready data, such that :meth:`set_rng_state` continues it exactly.

        The state is keyed by sampling seed (one stream per seed), so that states of several engines can be
        given to one: the ranks of a data-parallel rollout sample with a seed each."""
        ...

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Continue from what :meth:`rng_state` returned: the streams of the seeds it names (others are kept)."""
        ...

    def sleep(self) -> None:
        """Release the device memory held between generations (weights, KV cache) where the backend can; else nothing."""
        ...

    def wake(self) -> None:
        """Undo :meth:`sleep` before the next generation or weight update."""
        ...


@runtime_checkable
class TrainEngineProtocol(Protocol):
    """A trainable (or frozen, for the reference) model: log-probs, values, updates and its state."""

    def compute_log_probs(self, batch: Batch, *, temperature: float | None = None) -> torch.Tensor:
        """``(b, R)`` float32 ``log_softmax(logits / T)`` of the response tokens (0 at padding)."""
        ...

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """``(b, R)`` float32 value predictions of a critic."""
        ...

    def update(self, batch: Batch, loss_terms: Sequence[Any]) -> dict[str, float]:
        """One update (epochs x mini-batches x micro-batches) from registered loss terms; returns metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """``{"model", "optimizer", "scheduler", "shuffle_rng"}``; sharded engines gather full tensors."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's full tensors one at a time, for weight sync (gathered from shards lazily)."""
        ...

    def move_states(self, items: Sequence[str], device: torch.device) -> None:
        """Move ``params`` and/or ``optimizer`` states to ``device`` (offload / onload ops)."""
        ...
