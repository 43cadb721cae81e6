"""LoRA adapters on a transformers causal LM, through peft (the ``lora`` extra).

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3)
replaces a frozen linear map ``W0`` by ``h = W0 x + (alpha / r) B A x`` with
``A: (r, in)``, ``B: (out, r)``; ``B`` starts at zero, so the adapted model starts
as the base model, and only ``A`` and ``B`` train.

The adapters are injected *into* the module (``peft.inject_adapter_in_model``): it
stays the same transformers model, whose target ``nn.Linear`` layers become peft
LoRA layers wrapping them, with every base parameter frozen. Everything that
drives a transformers model (log-probs, decoding, FSDP) drives it unchanged, and
the weights that move are its adapter tensors under their own names
(``model.layers.0.self_attn.q_proj.lora_A.default.weight``):

* :func:`adapter_state` / :func:`synced_weights` — what a weight sync or a
  checkpoint holds: the adapters only;
* :func:`adapters_disabled` — the base model, from the same module (peft's
  ``disable_adapter``: each LoRA layer computes ``W0 x`` alone);
* :func:`base_state` — the base weights under the plain model's names (what a
  rollout engine that takes adapters of its own, vLLM, starts from);
* :func:`peft_adapter_files` — the adapters as a peft adapter folder
  (``adapter_config.json`` + ``adapter_model.safetensors``);
* :func:`merged_model` — a plain transformers model with the adapters merged in.

peft is imported only here, and only when LoRA is used (:func:`require_peft`).
"""
from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Iterable, Iterator, Literal, Mapping

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hybridflow.errors import ConfigError

__all__ = ["LoraSettings", "ALL_LINEAR", "require_peft", "apply_lora", "is_lora", "adapter_names", "adapter_state",
           "synced_weights", "adapters_disabled", "base_state", "adapter_config", "settings_adapter_config",
           "peft_adapter_files",
           "lora_settings_from_file", "load_adapter_state",
           "merged_model", "ADAPTER_CONFIG"]

ALL_LINEAR = "all-linear"
"""Every linear layer of the decoder blocks (peft's shorthand; the output layer ``lm_head`` is left out)."""
ADAPTER_CONFIG = "adapter_config.json"
"""peft's adapter folder: this file and ``adapter_model.safetensors``."""
_ADAPTER = "default"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


class LoraSettings(BaseModel):
    """Rank, scale and target layers of the LoRA adapters of a train engine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=1, description="r: the inner width of each adapter (A is r x in, B is out x r).")
    alpha: float = Field(16.0, gt=0.0, description="The adapter output is scaled by alpha / rank.")
    target_modules: tuple[str, ...] | Literal["all-linear"] = Field(
        ALL_LINEAR, description="Names (last path component, e.g. q_proj, v_proj) of the linear layers that get adapters; "
                                "'all-linear': every linear layer but the output layer.")

    @field_validator("target_modules", mode="before")
    @classmethod
    def _names(cls, value):
        return parse_target_modules(value)


def parse_target_modules(value) -> tuple[str, ...] | str:
    """``'all-linear'``, a list of module names, or a comma-separated string of them -> the validated form."""
    if isinstance(value, str):
        if value.strip() == ALL_LINEAR:
            return ALL_LINEAR
        value = [part for part in value.split(",")]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"lora_target_modules: give 'all-linear' or a list of module names such as [q_proj, v_proj]; "
                         f"got {value!r}")
    names = tuple(str(part).strip() for part in value)
    if not names or any(not _NAME.match(name) for name in names):
        raise ValueError(f"lora_target_modules: give 'all-linear' or module names such as [q_proj, v_proj]; got {value!r}")
    return names


def require_peft():
    """The ``peft`` package, or a ConfigError that says how to install it."""
    try:
        import peft
    except ImportError as err:
        raise ConfigError(f"LoRA (lora_rank > 0) needs the peft package, which this Python cannot import ({err}); "
                          "install it with `pip install hybridflow[lora]`, or set lora_rank: 0 to fine-tune every weight") from None
    return peft


def _peft_config(settings: LoraSettings):
    peft = require_peft()
    targets = settings.target_modules if settings.target_modules == ALL_LINEAR else list(settings.target_modules)
    return peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, target_modules=targets, lora_dropout=0.0,
                           bias="none")


def apply_lora(module: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """Inject adapters into ``module`` in place and freeze every base parameter; returns ``module``.

    ConfigError when no layer of the module matches ``target_modules``.
    """
    peft = require_peft()
    try:
        peft.inject_adapter_in_model(_peft_config(settings), module, adapter_name=_ADAPTER)
    except ValueError as err:
        raise ConfigError(f"lora_target_modules={settings.target_modules!r} does not fit {type(module).__name__} ({err}); "
                          "name its linear layers (e.g. q_proj, v_proj) or use 'all-linear'") from None
    return module


def is_lora(module: torch.nn.Module) -> bool:
    """Whether ``module`` carries injected LoRA adapters (checked without importing peft)."""
    return bool(getattr(module, "peft_config", None))


def adapter_names(module: torch.nn.Module) -> frozenset[str]:
    """State-dict names of the adapter tensors of ``module`` (empty for a module without adapters)."""
    if not is_lora(module):
        return frozenset()
    return frozenset(name for name, _ in module.named_parameters() if ".lora_" in name)


def adapter_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors of ``module`` by state-dict name, detached (no copy; read from the parameters, not
    ``state_dict``, which walks every module of the model)."""
    if not is_lora(module):
        return {}
    return {name: p.detach() for name, p in module.named_parameters() if ".lora_" in name}


def synced_weights(module: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The pairs of ``named`` a weight sync sends: all of them, or only the adapters of a LoRA ``module``."""
    names = adapter_names(module)
    for name, tensor in named:
        if not names or name in names:
            yield name, tensor


@contextlib.contextmanager
def adapters_disabled(module: torch.nn.Module):
    """Within the block ``module`` computes as its base model (each LoRA layer gives ``W0 x``); a no-op without adapters.

    What peft's ``PeftModel.disable_adapter()`` does, for adapters injected into the module itself.
    """
    if not is_lora(module):
        yield module
        return
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield module
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def _plain_name(name: str) -> str:
    return name.replace(".base_layer.", ".")


def base_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's weights under the plain model's names (``q_proj.base_layer.weight`` -> ``q_proj.weight``)."""
    names = adapter_names(module)
    return {_plain_name(n): t for n, t in module.state_dict(keep_vars=False).items() if n not in names}


def _peft_key(name: str) -> str:
    """``model.layers.0.q_proj.lora_A.default.weight`` -> ``base_model.model.model.layers.0.q_proj.lora_A.weight``
    (the keys ``PeftModel.save_pretrained`` writes)."""
    return "base_model.model." + name.replace(f".{_ADAPTER}.", ".")


def adapter_config(module: torch.nn.Module, *, base_model: str | None = None) -> dict:
    """The peft ``adapter_config.json`` content of ``module``'s adapters (target modules as the resolved names)."""
    config = module.peft_config[_ADAPTER].to_dict()
    targets = config["target_modules"]
    config["target_modules"] = sorted(targets) if isinstance(targets, (set, list, tuple)) else targets
    config.update(base_model_name_or_path=base_model, inference_mode=True)
    return json.loads(json.dumps(config, default=str))


def settings_adapter_config(settings: LoraSettings, *, base_model: str | None = None) -> dict:
    """A peft ``adapter_config.json`` content for adapters of ``settings`` (targets as configured, e.g. 'all-linear')."""
    config = _peft_config(settings).to_dict()
    targets = config["target_modules"]
    config["target_modules"] = sorted(targets) if isinstance(targets, (set, list, tuple)) else targets
    config.update(base_model_name_or_path=base_model, inference_mode=True)
    return json.loads(json.dumps(config, default=str))


def peft_adapter_files(config: Mapping, tensors: Mapping[str, torch.Tensor], folder: str | Path) -> Path:
    """Write adapter tensors (by the module's state-dict names) and their :func:`adapter_config` as a peft
    adapter folder, which ``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ADAPTER_CONFIG).write_text(json.dumps(dict(config), indent=2))
    save_file({_peft_key(n): t.detach().contiguous().cpu() for n, t in tensors.items()},
              str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    return folder


def lora_settings_from_file(path: str | Path) -> LoraSettings:
    """The :class:`LoraSettings` of a peft ``adapter_config.json`` (as :func:`peft_adapter_files` writes it)."""
    config = json.loads(Path(path).read_text())
    targets = config.get("target_modules")
    return LoraSettings(rank=config["r"], alpha=config["lora_alpha"],
                        target_modules=targets if isinstance(targets, str) else tuple(targets))


def load_adapter_state(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy adapter tensors (by ``module``'s state-dict names) into ``module``; ConfigError naming a misfit."""
    names = adapter_names(module)
    missing, unexpected = sorted(names - set(tensors)), sorted(set(tensors) - names)
    if missing or unexpected:
        raise ConfigError(f"the adapters do not fit this model (missing {missing[:3]}, unexpected {unexpected[:3]}); "
                          "were they trained with other lora_target_modules or another model?")
    own = module.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, tensor in tensors.items():
            if own[name].shape != tensor.shape:
                raise ConfigError(f"adapter {name!r} has shape {tuple(tensor.shape)}, the model's is "
                                  f"{tuple(own[name].shape)}: another lora_rank?")
            own[name].copy_(tensor)


def merged_model(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every adapter merged into its base weight (``W0 + (alpha/r) B A``), the LoRA layers
    replaced by plain linear layers: a transformers model with no peft in it. Changes ``module`` in place."""
    if not is_lora(module):
        return module
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, layer in list(module.named_modules()):
        if isinstance(layer, BaseTunerLayer):
            layer.merge()
            parent, _, child = name.rpartition(".")
            setattr(module.get_submodule(parent) if parent else module, child, layer.get_base_layer())
    del module.peft_config
    return module
