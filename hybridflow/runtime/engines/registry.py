"""Rollout engines by name: ``hf`` (transformers, :mod:`.rollout_hf`) and ``vllm`` (:mod:`.rollout_vllm`).

A policy role's rollout engine is chosen in the config (``rollout_engine``),
recorded in the plan's role placement (``RolePlacement.rollout_engine``) and
built here from a :class:`RolloutBuild`. Each engine has an options model
(``rollout_engine_options`` in the config), validated when the config is
read, so a misspelt option is a ConfigError naming it, not a surprise at
the first generation. A new engine is a builder, an options model and one
entry in :data:`ROLLOUT_ENGINES`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...errors import ConfigError
from .protocols import RolloutEngine
from .sampling import SamplingParams

__all__ = ["RolloutBuild", "RolloutEngineEntry", "ROLLOUT_ENGINES", "HFOptions", "VLLMOptions", "build_rollout",
           "rollout_options"]


class HFOptions(BaseModel):
    """Options of the ``hf`` rollout engine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batch_size: int | None = Field(None, ge=1, description="Responses decoded at once (whole prompt groups); None: all.")
    keep_products: bool = Field(True, description="The lean decode keeps its layers' matrix-product outputs for the update that follows with the same weights (a model that shares its weights with the train engine), whose forward then takes them instead of computing its own: ~10% of a GRPO step on the ~8M bench model, for up to 1 GiB of memory (decode_tape). The update's numbers then differ from a recomputed forward's in the last bits.")


class VLLMOptions(BaseModel):
    """Options of the ``vllm`` rollout engine (passed to ``vllm.LLM``; see docs/rollout_engines.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("float32", description="Weights and compute dtype of vLLM; float32 makes its log-probs match the fp32 train engine (CPU runs).")
    max_model_len: int | None = Field(None, ge=1, description="Longest prompt + response vLLM reserves for; None: the model's max_position_embeddings.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one vLLM engine spans (CPU: 1).")
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0, description="CUDA: the fraction of the GPU vLLM may take (weights + KV cache); the train engine shares the rest.")
    kv_cache_gib: int = Field(1, ge=1, description="CPU: KV cache size in whole GiB (sets VLLM_CPU_KVCACHE_SPACE, which vLLM reads as an integer).")
    max_num_seqs: int = Field(256, ge=1, description="Sequences vLLM schedules at once.")
    enforce_eager: bool = Field(True, description="No CUDA graphs / torch.compile (start-up in seconds rather than minutes; tiny models gain nothing from them).")
    sleep_mode: bool = Field(False, description="CUDA: enable vLLM's sleep mode so sleep() frees weights and KV cache between generations (the hybrid engine); refused by vLLM on CPU.")
    weight_transfer: Literal["direct", "shm"] = Field("direct", description="How new weights reach vLLM: 'direct' hands the tensors to the in-process worker's reload_weights (no copy through files; on CUDA the train engine's device tensors); 'shm' writes safetensors to /dev/shm and reloads from the path (what a multi-process vLLM needs).")


@dataclass(frozen=True)
class RolloutBuild:
    """What a rollout engine is built from.

    ``model``: the policy's module (the train engine's, when the role trains here);
    ``source``: the role's model path / hub name, or the module itself; ``share``: the
    engine may sample from ``model`` in place (the hybrid engine on one device).
    """

    role: str
    model: torch.nn.Module
    source: Any
    tokenizer: Any
    sampling: SamplingParams
    device: str
    share: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)


def _build_hf(build: RolloutBuild) -> RolloutEngine:
    from .rollout_hf import HFRolloutEngine

    opts = HFOptions(**build.options)
    model = build.model if build.share else copy.deepcopy(build.model)
    return HFRolloutEngine(model, tokenizer=build.tokenizer, sampling=build.sampling, device=build.device,
                           micro_batch_size=opts.micro_batch_size, keep_products=opts.keep_products)


def _build_vllm(build: RolloutBuild) -> RolloutEngine:
    from .rollout_vllm import VLLMRolloutEngine

    return VLLMRolloutEngine.from_module(build.model, tokenizer=build.tokenizer, sampling=build.sampling,
                                         device=build.device, options=VLLMOptions(**build.options))


@dataclass(frozen=True)
class RolloutEngineEntry:
    """A registered rollout engine: its builder and its options model."""

    build: Callable[[RolloutBuild], RolloutEngine]
    options: type[BaseModel]


ROLLOUT_ENGINES: dict[str, RolloutEngineEntry] = {
    "hf": RolloutEngineEntry(_build_hf, HFOptions),
    "vllm": RolloutEngineEntry(_build_vllm, VLLMOptions),
}


def _entry(name: str) -> RolloutEngineEntry:
    entry = ROLLOUT_ENGINES.get(name)
    if entry is None:
        raise ConfigError(f"unknown rollout engine {name!r}; registered: {', '.join(ROLLOUT_ENGINES)}")
    return entry


def rollout_options(name: str, options: Mapping[str, Any]) -> BaseModel:
    """``options`` validated by engine ``name``'s options model: ConfigError naming the bad key otherwise."""
    entry = _entry(name)
    try:
        return entry.options(**dict(options))
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        known = ", ".join(entry.options.model_fields)
        raise ConfigError(f"rollout_engine_options for {name!r}: {problems} (its options: {known})") from None


def build_rollout(name: str, build: RolloutBuild) -> RolloutEngine:
    """The rollout engine ``name`` built from ``build`` (ConfigError for an unknown name or option)."""
    rollout_options(name, build.options)
    return _entry(name).build(build)
