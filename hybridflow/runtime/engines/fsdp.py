"""The train engine on FSDP2: data parallelism with sharded parameters, gradients and optimizer state.

:class:`FSDPTrainEngine` is a :class:`~.train.TrainEngine` whose module is
sharded over a one-dimensional :class:`~torch.distributed.device_mesh.DeviceMesh`
of ``dp`` ranks with ``torch.distributed.fsdp.fully_shard``: each decoder layer is
one FSDP unit, and a small root wrapper holds the rest (embeddings, final norm,
lm_head or value head). Every forward the engine runs goes through that root, so
the parameters it reads outside a layer's own ``forward`` (the fused log-prob
path reads ``lm_head.weight`` directly) are gathered too.

Each rank holds ``1/dp`` of the batch. The loss ops are called with the global
token and sequence counts (``count_reduce`` sums them over the mesh), so a
rank's loss is its share of the global loss and the gradients must be **summed**
over ranks, not averaged: the engine sets FSDP's gradient divide factor to 1
with sum-only reductions (gloo has no pre-multiplied sum). With the same
global batch, one optimizer step on ``dp`` ranks equals one step on one
process up to float rounding (``tests/runtime/engines/test_fsdp.py``).

Mini-batches: ``TrainEngineConfig.mini_batch_size`` is per rank here (the Ray
executor divides the global one by ``dp``); every rank must run the same number
of mini- and micro-batches: equal-sized slices give the same mini-batches, and the ranks agree
on the micro-batch count (the largest; see :mod:`.micro_batches`), which token budgets and
skipped zero-advantage rows can make differ. The gradient
norm (hence its non-finite skip) is global, but a non-finite *loss* is seen by
the rank that computed it only: that rank skips its backward and the others
wait in theirs until the collective timeout raises (an error, not a hang).

State dicts go through ``torch.distributed.checkpoint.state_dict``: full
(unsharded) tensors on rank 0 (``cpu_offload``; other ranks get empty dicts)
when saving, full tensors on every rank when loading. The optimizer state uses
the plain optimizer's integer parameter indices, so a checkpoint written with
dp=1 loads with dp=2 and back.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from .lora import synced_weights
from .optim import TrainEngineConfig
from .train import CountReduce, LossTerm, TrainEngine

__all__ = ["FSDPTrainEngine", "shard_module", "full_tensor"]


class _Root(torch.nn.Module):
    """The root FSDP unit: calls ``fn(*args)`` inside its forward, so FSDP gathers the root's parameters."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn, *args, **kwargs):
        out = fn(*args, **kwargs)
        # FSDP hooks the outputs for its backward; fresh tensors rather than views keep that hook safe.
        return {name: value.clone() for name, value in out.items()}


def _layer_lists(module: torch.nn.Module) -> list[torch.nn.ModuleList]:
    """The ``layers`` ModuleLists of a transformers decoder (Llama/Qwen2: ``model.layers``)."""
    return [m for name, m in module.named_modules() if isinstance(m, torch.nn.ModuleList) and name.split(".")[-1] in ("layers", "h")]


def shard_module(module: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """Shard ``module`` in place over ``mesh``: one FSDP unit per decoder layer, the rest in a root wrapper.

    Returns the root (call ``root(fn, *args)`` to run ``fn`` with all parameters gathered as needed).
    Gradients are summed over the mesh (divide factor 1, sum-only reductions).
    """
    for layers in _layer_lists(module):
        for layer in layers:
            fully_shard(layer, mesh=mesh)
    root = fully_shard(_Root(module), mesh=mesh)
    for unit in root.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    return root


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly sharded) parameter or buffer; a collective for DTensors."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDPTrainEngine(TrainEngine):
    """A :class:`TrainEngine` whose module is sharded over ``mesh`` (see the module docstring).

    Args:
        module: the full model, identical on every rank (it is sharded in place).
        config: as for TrainEngine; ``mini_batch_size`` counts this rank's samples.
        mesh: a 1-D device mesh of the data-parallel ranks.
        metric_prefix / device: as for TrainEngine.
    """

    flat_gradients = False
    """FSDP puts each step's reduced gradient shards on the parameters itself: they are dropped after each step."""

    def __init__(self, module: torch.nn.Module, config: TrainEngineConfig | None = None, *, mesh: DeviceMesh,
                 metric_prefix: str = "actor", device: str | torch.device | None = None):
        if mesh.ndim != 1:
            raise ValueError(f"FSDPTrainEngine needs a 1-D data-parallel mesh, got {mesh.ndim} dims")
        self.mesh = mesh
        self.group = mesh.get_group()
        module = module.to(device) if device is not None else module
        self.root = shard_module(module, mesh)
        super().__init__(module, config, metric_prefix=metric_prefix, device=device)

    @property
    def dp_rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def dp_size(self) -> int:
        return dist.get_world_size(self.group)

    # -- forwards go through the root unit ---------------------------------------------------
    def _lm_outputs(self, t: Mapping[str, torch.Tensor], *, with_entropy: bool, temperature: float) -> dict:
        return self.root(super()._lm_outputs, t, with_entropy=with_entropy, temperature=temperature)

    def _value_outputs(self, t: Mapping[str, torch.Tensor]) -> dict:
        return self.root(super()._value_outputs, t)

    # -- update: global counts summed over the ranks -------------------------------------------
    def sum_over_ranks(self, counts: torch.Tensor) -> torch.Tensor:
        """All-reduce (sum) of a small tensor over the data-parallel group (the ``count_reduce`` hook)."""
        counts = counts.clone()
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=self.group)
        return counts

    def _agree_micro_batch_count(self, count: int) -> int:
        """The largest micro-batch count of the ranks (an all-reduce): FSDP's collectives need every rank to run
        as many forwards and backwards (a rank with fewer splits its micro-batches or runs stand-ins)."""
        agreed = torch.tensor([count], dtype=torch.long, device=self.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self.group)
        return int(agreed.item())

    def update(self, batch, loss_terms: Sequence[LossTerm | Sequence], *,
               count_reduce: CountReduce | None = None) -> dict[str, float]:
        """As :meth:`TrainEngine.update`, with the mini-batch counts summed over the data-parallel ranks."""
        return super().update(batch, loss_terms, count_reduce=count_reduce or self.sum_over_ranks)

    # -- state -----------------------------------------------------------------------------------
    def param_names(self) -> list[str]:
        """The parameters' names in the optimizer's order (the keys of its state)."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        return [names[id(p)] for g in self.optimizer.param_groups for p in g["params"]]

    def state_dict(self) -> dict[str, Any]:
        """Full model and optimizer state on rank 0 (empty tensors dicts elsewhere); a collective."""
        model = get_model_state_dict(self.module, options=_FULL)
        optim = get_optimizer_state_dict(self.module, self.optimizer, options=_FULL)
        index = {name: i for i, name in enumerate(self.param_names())}
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
                  for g in optim.get("param_groups", ())]
        state = {index[name]: entry for name, entry in optim.get("state", {}).items()}
        return {"model": model, "optimizer": {"state": state, "param_groups": groups},
                "scheduler": self.scheduler.state_dict(), "shuffle_rng": self.shuffle_generator.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load full tensors (the same on every rank); each rank keeps its shard. A collective."""
        set_model_state_dict(self.module, dict(state["model"]), options=StateDictOptions(full_state_dict=True))
        names = self.param_names()
        saved = state["optimizer"]
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[i] for i in g["params"]]}
                  for g in saved["param_groups"]]
        optim = {"state": {names[int(i)]: entry for i, entry in saved["state"].items()}, "param_groups": groups}
        set_optimizer_state_dict(self.module, self.optimizer, optim, options=StateDictOptions(full_state_dict=True))
        self.scheduler.load_state_dict(state["scheduler"])
        if "shuffle_rng" in state:
            self.shuffle_generator.set_state(state["shuffle_rng"])

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` of every parameter and buffer (a LoRA module: of its adapters), gathered one at a
        time (a collective per tensor)."""
        for name, tensor in synced_weights(self.module, self.module.state_dict(keep_vars=False).items()):
            yield name, full_tensor(tensor).detach()
