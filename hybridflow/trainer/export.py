"""``hybridflow export CKPT --to DIR``: a checkpoint's policy as a transformers model folder.

The folder holds the weights (safetensors), config, generation config and tokenizer, and
loads with ``AutoModelForCausalLM.from_pretrained(DIR)``. CKPT is a checkpoint folder, a
run's ``checkpoints`` folder or its output dir (the newest checkpoint that verifies).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["export_checkpoint", "add_arguments", "run"]


def export_checkpoint(checkpoint: str | os.PathLike, to: str | os.PathLike, *, role: str | None = None) -> Path:
    """Write the weights of ``role`` (default: the policy, usually ``actor``) in ``checkpoint`` as a model folder."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from ..data import load_tokenizer
    from ..errors import CheckpointError
    from ..errors import OutputDirError
    from .checkpoint import read_checkpoint, resolve_checkpoint

    if Path(to).exists() and not Path(to).is_dir():
        raise OutputDirError(f"--to {str(to)!r} is an existing file; give a folder to write the model into "
                             "(a new one, or one to add the model files to)")
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
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf))
    model.to(next(iter(weights.values())).dtype)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"{path}: the saved weights of {role!r} do not fit its saved config ({err})") from None
    if (hf / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(hf)
    out = Path(to)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    load_tokenizer(hf).save_pretrained(out)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder (checkpoints/step_N), or a run's output dir for its newest")
    parser.add_argument("--to", required=True, help="folder to write the transformers model into")
    parser.add_argument("--role", default=None, help="policy role to export (default: actor)")


def run(args: argparse.Namespace) -> int:
    out = export_checkpoint(args.checkpoint, args.to, role=args.role)
    print(f"exported to {out}; load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0
