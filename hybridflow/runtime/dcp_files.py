"""Reading and writing DCP folders safely: shared by the controller's checkpoint files and the workers' shards.

* :func:`save_dcp` writes tensors to a DCP folder, whole: a second Ctrl-C waits for the write
  (see :mod:`.write_guard`), and failures become CheckpointError;
* :func:`safe_reader` is DCP's file reader with the ``.metadata`` file read by an
  unpickler that builds only DCP's own metadata records (:class:`_MetadataUnpickler`),
  tensors being read with ``torch.load(weights_only=True)``, so a checkpoint cannot run code;
* :func:`unwrap_dcp_error` turns DCP's CheckpointException into a CheckpointError (a
  Ctrl-C stays a KeyboardInterrupt);
* :func:`folder_manifest` is the size and sha256 of every file under a folder.
"""
from __future__ import annotations

import hashlib
import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from .write_guard import whole_write

__all__ = ["save_dcp", "safe_reader", "dcp_exception", "unwrap_dcp_error", "file_sha256", "folder_manifest"]


def dcp_exception() -> type[BaseException]:
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def unwrap_dcp_error(err: BaseException, what: str) -> BaseException:
    """DCP wraps every failure (Ctrl-C included) in a CheckpointException: a KeyboardInterrupt stays one, the rest become CheckpointError."""
    failures = [failure[0] if isinstance(failure, tuple) else failure for failure in getattr(err, "failures", {}).values()]
    if any(isinstance(f, KeyboardInterrupt) for f in failures):
        return KeyboardInterrupt()
    cause = failures[0] if failures else err
    return CheckpointError(f"{what} ({type(cause).__name__}: {cause})")


def save_dcp(tensors: dict[str, torch.Tensor], folder: Path | str, failed: str, **kwargs: Any) -> None:
    """``dcp.save`` of ``tensors`` into ``folder`` (``kwargs``: ``no_dist`` or ``process_group``), never cut
    by a signal mid-file; a failure is a CheckpointError starting with ``failed``."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # one process and no group is an intended use
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            with whole_write():
                dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(folder)), **kwargs)
        except dcp_exception() as err:
            raise unwrap_dcp_error(err, failed) from None


# -- DCP reading without unpickling arbitrary objects -----------------------------------------

def _allowed_globals() -> dict[tuple[str, str], Any]:
    from torch.distributed.checkpoint import filesystem, metadata

    allowed: dict[tuple[str, str], Any] = {}
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                 "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"):
        if hasattr(metadata, name):
            allowed[(metadata.__name__, name)] = getattr(metadata, name)
    allowed[(filesystem.__name__, "_StorageInfo")] = filesystem._StorageInfo
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    allowed[("collections", "OrderedDict")] = __import__("collections").OrderedDict
    for cls in (Path, type(Path("x")), __import__("pathlib").PurePosixPath):
        allowed[(cls.__module__, cls.__name__)] = cls
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    """Reads DCP's ``.metadata``: builds only DCP's metadata records, torch sizes, dtypes, layouts and paths."""

    _allowed: dict[tuple[str, str], Any] | None = None

    def find_class(self, module: str, name: str):
        if _MetadataUnpickler._allowed is None:
            _MetadataUnpickler._allowed = _allowed_globals()
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise CheckpointError(f"checkpoint metadata refers to {module}.{name}, which is not a DCP metadata "
                                  "record; refusing to unpickle it") from None


def safe_reader(folder: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        """DCP's file reader with the metadata read by :class:`_MetadataUnpickler` (tensors are weights_only)."""

        def read_metadata(self, *args, **kwargs):
            with open(Path(self.path) / ".metadata", "rb") as f:
                metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(folder))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_manifest(folder: Path, relative_to: Path | None = None) -> dict[str, dict]:
    """``relative path -> {"bytes", "sha256"}`` of every file under ``folder`` (paths relative to ``relative_to``,
    default the folder itself), read in 1 MiB blocks."""
    base = relative_to or folder
    return {p.relative_to(base).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
            for p in sorted(folder.rglob("*")) if p.is_file()}
