"""``hybridflow export CKPT --to DIR``: a checkpoint's policy as a transformers model folder.

The folder holds the weights (safetensors), config, generation config and tokenizer, and
loads with ``AutoModelForCausalLM.from_pretrained(DIR)``. CKPT is a checkpoint folder, a
run's ``checkpoints`` folder or its output dir (the newest checkpoint that verifies).

A LoRA policy's checkpoint holds its adapters only, and ``hf/<role>/adapter_config.json``
names the base model: the export loads that base model (or ``--base-model``), puts the
adapters on it and merges them into its weights (``W0 + (alpha/r) B A``), so the folder is a
plain transformers model with no peft in it.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["export_checkpoint", "model_from_export", "add_arguments", "run"]


def export_checkpoint(checkpoint: str | os.PathLike, to: str | os.PathLike, *, role: str | None = None,
                      base_model: str | None = None, overwrite: bool = False) -> Path:
    """Write the weights of ``role`` (default: the policy, usually ``actor``) in ``checkpoint`` as a model folder;
    LoRA adapters merged into their base model (``base_model``: overrides the one the checkpoint names).

    A folder ``to`` that already holds files is refused (OutputDirError) unless ``overwrite``; a folder that
    cannot be written (read-only, full) is a WriteError naming the file."""
    from transformers import AutoConfig, GenerationConfig

    from ..data import load_tokenizer
    from ..errors import CheckpointError, OutputDirError, WriteError
    from ..runtime.engines.lora import ADAPTER_CONFIG
    from .checkpoint import read_checkpoint, resolve_checkpoint

    if Path(to).exists() and not Path(to).is_dir():
        raise OutputDirError(f"--to {str(to)!r} is an existing file; give a folder to write the model into")
    if not overwrite and Path(to).is_dir() and any(Path(to).iterdir()):
        held = sorted(p.name for p in Path(to).iterdir())
        raise OutputDirError(f"--to {str(to)!r} is not empty (it holds {', '.join(held[:5])}"
                             f"{', ...' if len(held) > 5 else ''}); give a new or empty folder, or --overwrite to "
                             "write the model files over what is there")
    path = resolve_checkpoint(checkpoint)
    policies = sorted(p.name for p in (path / "hf").iterdir()) if (path / "hf").is_dir() else []
    if not policies:
        raise CheckpointError(f"{path} has no hf/<role> folder with a model config; it cannot be exported")
    role = role or ("actor" if "actor" in policies else policies[0])
    if role not in policies:
        raise CheckpointError(f"{path} holds no policy {role!r}; it holds {', '.join(policies)}")
    prefix = f"{role}/model/"
    found = read_checkpoint(path, prefixes=(prefix,))
    weights = {k[len(prefix):]: v for k, v in found.tensors.items()}
    hf = path / "hf" / role
    if (hf / ADAPTER_CONFIG).is_file():
        model = _merged(hf, weights, base_model, f"{path}: role {role!r}")
    else:
        model = _with_weights(AutoConfig.from_pretrained(hf), weights, f"{path}: the saved weights of {role!r}")
    if (hf / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(hf)
    out = Path(to)
    try:
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        load_tokenizer(hf).save_pretrained(out)
    except OSError as err:
        raise WriteError(f"export of {path} to {str(out)!r}", err) from None
    return out


def _with_weights(config, weights: dict, what: str):
    """A transformers causal LM of ``config`` holding ``weights`` (in their dtype); CheckpointError when they do not fit."""
    from transformers import AutoModelForCausalLM

    from ..errors import CheckpointError

    model = AutoModelForCausalLM.from_config(config)
    model.to(next(iter(weights.values())).dtype)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"{what} do not fit its saved config ({err})") from None
    return model


def model_from_export(exported: dict, *, what: str):
    """The transformers model an ``export`` op returned (``Worker.export``: config, generation config, full
    weights with any LoRA adapters merged), in eval mode."""
    from ..errors import ExecutionError

    if exported.get("config") is None:
        raise ExecutionError(f"{what}: its train module is not a transformers model (no config); it cannot be exported")
    model = _with_weights(exported["config"], exported["model"], f"{what}: the trained weights")
    if exported.get("generation_config") is not None:
        model.generation_config = exported["generation_config"]
    return model.eval()


def _merged(hf: Path, adapters: dict, base_model: str | None, what: str):
    """The base model named in ``hf/adapter_config.json`` (or ``base_model``) with ``adapters`` merged in."""
    import json

    from ..data import load_causal_lm
    from ..errors import CheckpointError, ConfigError, ModelLoadError
    from ..runtime.engines.lora import (ADAPTER_CONFIG, apply_lora, load_adapter_state, lora_settings_from_file,
                                        merged_model)

    base = base_model or json.loads((hf / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    try:
        model = load_causal_lm(base)
    except (ModelLoadError, OSError, ValueError) as err:
        raise CheckpointError(f"{what} holds LoRA adapters whose base model {base!r} cannot be loaded ({err}); "
                              "give it with --base-model PATH") from None
    model.to(next(iter(adapters.values())).dtype)
    try:
        apply_lora(model, lora_settings_from_file(hf / ADAPTER_CONFIG))
        load_adapter_state(model, adapters)
    except ConfigError as err:
        raise CheckpointError(f"{what}: the adapters do not fit the base model {base!r} ({err})") from None
    return merged_model(model)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder (checkpoints/step_N), or a run's output dir for its newest")
    parser.add_argument("--to", required=True, help="folder to write the transformers model into")
    parser.add_argument("--role", default=None, help="policy role to export (default: actor)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a --to folder that already holds files (the model's files replace theirs)")
    parser.add_argument("--base-model", default=None, help="LoRA checkpoints: the base model to merge the adapters into "
                                                           "(default: the one the checkpoint names)")


def run(args: argparse.Namespace) -> int:
    out = export_checkpoint(args.checkpoint, args.to, role=args.role, base_model=args.base_model,
                            overwrite=args.overwrite)
    print(f"exported to {out}; load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0
