"""What a run records about itself besides metrics, for ``hybridflow diff`` and ``hybridflow explain``.

* :func:`write_run_record` — at start: ``config.json`` (the algorithm and the config's fields) and
  ``environment.json`` (:func:`environment`: python, the versions of torch, transformers, hybridflow, ray and vllm
  where importable, torch's thread count, the devices);
* :class:`ValueHashes` — with ``record_hashes``: after each step, a digest of every tensor of every node's output
  (and of the graph's inputs) as the controller holds it once the node's results are merged, one line per tensor in
  ``hashes.jsonl`` (step, node, field, digest, pool), in plan order. Two runs whose digests agree computed
  bit-identical values; the first line where they differ is where they diverged.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any, Mapping

from ..errors import WriteError

__all__ = ["ENVIRONMENT_PACKAGES", "environment", "write_run_record", "tensor_digest", "ValueHashes"]

ENVIRONMENT_PACKAGES = ("torch", "transformers", "hybridflow", "ray", "vllm", "numpy")
"""Packages whose installed version ``environment.json`` records (None: not installed)."""


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """This process's python, package versions, torch threads and devices (what makes two runs' numbers differ
    besides their configs)."""
    import torch

    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: _installed_version(name) for name in ENVIRONMENT_PACKAGES},
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.version.cuda,
        "devices": devices or ["cpu"],
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


def _write_json(path: Path, data: Any, what: str) -> None:
    try:
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as err:
        raise WriteError(f"the run's {what} cannot be written", err, path) from None


def write_run_record(output_dir: Path, algorithm: str, config) -> None:
    """``config.json`` and ``environment.json`` in ``output_dir`` (module docstring)."""
    _write_json(output_dir / "config.json", {"algorithm": algorithm, "config": config.model_dump(mode="json")}, "config")
    _write_json(output_dir / "environment.json", environment(), "environment")


def tensor_digest(tensor) -> str:
    """blake2b (16 bytes) of the tensor's dtype, shape and bytes, on the CPU; equal digests, bit-identical tensors."""
    import torch

    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    digest = hashlib.blake2b(f"{data.dtype}{tuple(data.shape)}".encode(), digest_size=16)
    if data.numel():  # bytes of any dtype (bfloat16 has no numpy form), without a copy when contiguous
        digest.update(memoryview(data.contiguous().reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


class ValueHashes:
    """Appends each step's digests to ``path`` (``hashes.jsonl``) for the nodes of ``plan``: the graph's inputs
    first, then the nodes in plan order, each tensor field in name order (module docstring). A fresh run starts the
    file anew (an earlier run's is kept as ``hashes.1.jsonl``, ...); a resumed one (``resume_step``) keeps the lines of the steps up to it and drops the others, which it
    runs again (:meth:`rewind` after a restart does the same)."""

    def __init__(self, path: Path, *, plan, resume_step: int | None = None):
        self.path = path
        self.order = [i.name for i in plan.graph.inputs] + list(dict.fromkeys(op.node for op in plan.ops if op.node))
        self.pools = {op.node: op.pool for op in plan.ops if op.node}
        if resume_step is None:
            self._set_aside()
        else:
            self.rewind(resume_step)

    def _set_aside(self) -> None:
        """A fresh run in a folder an earlier run wrote hashes in: keep them as ``hashes.<n>.jsonl`` (the first free n)."""
        if not self.path.is_file():
            return
        number = 1
        while (aside := self.path.with_name(f"{self.path.stem}.{number}{self.path.suffix}")).exists():
            number += 1
        try:
            os.replace(self.path, aside)
        except OSError as err:
            raise WriteError("the earlier run's value hashes cannot be set aside", err, self.path) from None

    def rewind(self, step: int) -> None:
        """Drop the lines of the steps after ``step``."""
        if not self.path.is_file():
            return
        try:
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines() if _step_of(line) <= step]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        except OSError as err:
            raise WriteError("the value hashes cannot be written", err, self.path) from None

    def record(self, step: int, env: Mapping[str, Any]) -> int:
        """Append the digests of step ``step``: every tensor of ``env`` (producer name -> Batch); returns the lines
        written."""
        names = [n for n in self.order if n in env] + sorted(n for n in env if n not in self.order)
        lines = []
        for name in names:
            tensors = env[name].tensors
            for field in sorted(tensors.keys()):
                lines.append(json.dumps({"step": step, "node": name, "field": field,
                                         "digest": tensor_digest(tensors[field]), "pool": self.pools.get(name)}))
        try:
            with self.path.open("a", encoding="utf-8") as out:
                out.write("".join(line + "\n" for line in lines))
        except OSError as err:
            raise WriteError(f"the value hashes of step {step} cannot be written", err, self.path) from None
        return len(lines)


def _step_of(line: str) -> float:
    """The step of a hashes.jsonl line; a cut or garbled line (an interrupted write) counts as past every step."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")
