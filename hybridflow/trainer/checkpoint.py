"""Checkpoint folders: written atomically, verified on load, never unpickling arbitrary objects.

Layout of one checkpoint (``<output_dir>/checkpoints/step_00000003/``)::

    tensors/<role>/       one torch.distributed.checkpoint (DCP) folder per trained role, written by the
                          worker processes that hold its state, each its own shard, in the pool's process
                          group (:mod:`hybridflow.runtime.train_state`): keys "model/<param>" and
                          "optim/<param>/<name>"; read back at any data-parallel size (DCP reshards)
    hf/<role>/            the policy's transformers config, generation config and tokenizer (no weights),
                          so that `hybridflow export` can rebuild a model folder
    trainer_state.json    step, RNG states, data position, config and its hash, optimizer param groups,
                          LR schedules, the algorithm's run state (``algorithm_state``, e.g. a Lagrange
                          multiplier), a manifest (size and sha256 of every other file) and the sha256
                          of its own content (``state_sha256``): every file of a checkpoint is checked

The controller (the driver) writes only trainer_state.json and hf/: it never holds model or optimizer
state. A checkpoint is written into ``.tmp-step_...`` next to the others (the workers write their
shards there too, so the path must be one every node and the driver see: a local path on one host,
a shared file system across machines) and renamed into place when complete, after every shard is
written and hashed, so a crash mid-write leaves no folder that looks finished; only the newest
``keep`` are kept, and one being replaced or pruned is first renamed to a ``.tmp-`` name, so
it too is complete or absent. A run removes the ``.tmp-*`` folders it finds on start
(:func:`~hybridflow.trainer.run_lock.remove_stale_temp`, under the output folder's lock). Loading checks the manifest first, reads DCP's metadata with an
unpickler that accepts only DCP's own metadata records (:mod:`hybridflow.runtime.dcp_files`), and
reads tensors with ``torch.load(weights_only=True)`` (DCP's reader); a checkpoint that
holds anything but tensors is refused. :func:`read_checkpoint` reads tensors on this process without a
process group (``no_dist``; ``hybridflow export``); tensors given to :func:`save_checkpoint` itself
are written the same way (format 1's single ``tensors/`` folder).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..errors import CheckpointError, WriteError
from ..runtime.dcp_files import dcp_exception, file_sha256, safe_reader, save_dcp, unwrap_dcp_error

__all__ = ["CHECKPOINTS", "STATE_FILE", "LoadedCheckpoint", "save_checkpoint", "list_checkpoints", "read_checkpoint",
           "newest_checkpoint", "resolve_checkpoint"]

log = logging.getLogger("hybridflow.checkpoint")

CHECKPOINTS = "checkpoints"
"""Sub-folder of the output dir that holds the checkpoints."""
STATE_FILE = "trainer_state.json"
TENSORS = "tensors"
FORMAT_VERSION = 3
"""3: as 2, and trainer_state.json carries ``state_sha256``, the sha256 of its own content (see
:func:`state_digest`), so that the manifest's own file is covered too. 2: the trained roles' tensors in ``tensors/<role>/`` (one DCP folder each, written by the workers holding
them; optimizer state keyed by parameter name). 1: one DCP folder ``tensors/`` written by the controller
(still read, e.g. by ``hybridflow export``)."""
READABLE_VERSIONS = (1, 2, 3)
STATE_DIGEST = "state_sha256"
ShardWriter = Callable[[Path], "tuple[dict[str, Any], dict[str, dict]]"]
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A verified checkpoint: its folder, step, JSON state and tensors (those asked for)."""

    path: Path
    step: int
    state: dict[str, Any]
    tensors: dict[str, torch.Tensor]


# -- writing --------------------------------------------------------------------------------

def save_checkpoint(root: str | os.PathLike, step: int, tensors: dict[str, torch.Tensor], state: dict[str, Any], *,
                    keep: int, write_extra: Callable[[Path], None] | None = None,
                    write_shards: ShardWriter | None = None) -> Path:
    """Write ``<root>/step_<step>`` atomically (temp folder, then rename); keep the newest ``keep``.

    ``tensors`` (written here) go to DCP, ``state`` (JSON-ready) to trainer_state.json, ``write_extra(folder)``
    may add files (they enter the manifest). ``write_shards(tensors_folder)`` has the workers write their
    shards (``tensors/<role>/``, one DCP folder per role) and returns JSON to add to the state and the
    manifest entries of the files they wrote (hashed where they were written, not re-read here).
    Returns the checkpoint folder.
    """
    root = Path(root)
    name = f"step_{step:08d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as err:
        raise WriteError(f"the checkpoint of step {step} cannot be written", err) from None
    try:
        written: dict[str, dict] = {}
        if tensors:
            _dcp_save(tensors, tmp / TENSORS)
        if write_shards is not None:
            more, entries = write_shards(tmp / TENSORS)
            state = {**state, **more}
            written = {f"{TENSORS}/{rel}": entry for rel, entry in entries.items()}
        if write_extra is not None:
            write_extra(tmp)
        document = {"format_version": FORMAT_VERSION, "step": step, "saved_at": time.time(), **state,
                    "manifest": _manifest(tmp, known=written)}
        document[STATE_DIGEST] = state_digest(document)
        _write_json(tmp / STATE_FILE, document)
        final = root / name
        if final.exists():  # the same step saved again (a resumed run redoing it): move the old one aside first
            _discard(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException as err:
        problem = _write_problem(err, tmp)  # before the half-written folder is removed and frees its space
        shutil.rmtree(tmp, ignore_errors=True)
        if problem is not None:
            raise WriteError(f"the checkpoint of step {step} cannot be written (the half-written folder is removed; "
                             "earlier checkpoints are kept)", problem, tmp if problem.filename is None else None) from None
        raise
    _prune(root, keep)
    return final


_FREE_BYTES_MIN = 1 << 20
"""Below this many free bytes a failed checkpoint write is taken for a full disk."""


def _write_problem(err: BaseException, folder: Path) -> OSError | None:
    """The OS-level reason a checkpoint write failed, or None when it failed for another reason.

    An OSError is its own reason. DCP and torch's zip writer report a full disk or a file-size limit as
    their own errors (``CheckpointError``, torch's ``unexpected pos``), so for those the disk is looked at:
    too little free space is ENOSPC, a folder this process may not write is EACCES, a file-size limit
    (``ulimit -f``) is EFBIG.
    """
    import errno

    try:
        import resource
    except ImportError:  # not POSIX
        resource = None
    if isinstance(err, OSError):
        return err
    if not isinstance(err, Exception):  # KeyboardInterrupt, SystemExit: not a disk problem
        return None
    try:
        stats = os.statvfs(folder)
        if stats.f_bavail * stats.f_frsize < _FREE_BYTES_MIN:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError:
        pass
    if folder.is_dir() and not os.access(folder, os.W_OK):
        return OSError(errno.EACCES, os.strerror(errno.EACCES))
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE) if resource is not None else (None, None)
    text = str(err)
    if limit not in (None, getattr(resource, "RLIM_INFINITY", None)) and ("unexpected pos" in text or "File too large" in text):
        return OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    return None


def _discard(path: Path) -> None:
    """Rename ``path`` to a ``.tmp-`` name (atomic), then delete it: an interruption never leaves a partial step_*."""
    aside = path.with_name(f".tmp-old-{path.name}-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def _dcp_save(tensors: dict[str, torch.Tensor], folder: Path) -> None:
    bad = [k for k, v in tensors.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"only tensors go into the DCP part of a checkpoint; {bad[:3]} are not")
    save_dcp({k: v.detach() for k, v in tensors.items()}, folder, f"{folder}: writing the tensors failed")


def _write_json(path: Path, document: dict) -> None:
    with path.open("w", encoding="utf-8") as f:
        json.dump(document, f, indent=1, allow_nan=True)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _files(folder: Path) -> Iterable[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != STATE_FILE)


_sha256 = file_sha256


def _manifest(folder: Path, known: dict[str, dict] | None = None) -> dict[str, dict]:
    """Size and sha256 of every file of a checkpoint; ``known`` entries (the workers' shards) are taken as given."""
    known = known or {}
    missing = [rel for rel in known if not (folder / rel).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: the workers reported files that are not there ({missing[:3]}); is the "
                              "checkpoint folder on a path every node and the driver share?")
    return {rel: known.get(rel) or {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in _files(folder) for rel in (p.relative_to(folder).as_posix(),)}


def _prune(root: Path, keep: int) -> None:
    for _, path in list_checkpoints(root)[:-keep]:
        _discard(path)


# -- finding and reading --------------------------------------------------------------------

def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every finished checkpoint folder under ``root``, oldest first (unverified)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def read_checkpoint(path: str | os.PathLike, *, prefixes: tuple[str, ...] | None = None) -> LoadedCheckpoint:
    """Verify and load one checkpoint folder; ``prefixes`` limits the tensors read (None: all).

    Raises CheckpointError naming the folder and what is wrong: no trainer_state.json, a file
    missing or of the wrong size or hash, unreadable DCP metadata, non-tensor entries.
    """
    path = Path(path)
    state_path = path / STATE_FILE
    if not state_path.is_file():
        raise CheckpointError(f"{path} is not a checkpoint: it has no {STATE_FILE}")
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{state_path} is unreadable ({err}); the checkpoint is corrupt") from None
    if not isinstance(state, dict) or state.get("format_version") not in READABLE_VERSIONS:
        raise CheckpointError(f"{state_path}: unknown checkpoint format {state.get('format_version') if isinstance(state, dict) else state!r}")
    _verify_state(state_path, state)
    _verify_manifest(path, state.get("manifest") or {})
    tensors = _dcp_load(path / TENSORS, prefixes)
    return LoadedCheckpoint(path=path, step=int(state["step"]), state=state, tensors=tensors)


def state_digest(document: dict[str, Any]) -> str:
    """sha256 of a trainer_state document without its ``state_sha256`` entry, in a canonical JSON form (sorted
    keys, no spaces), so that it does not depend on how the file is indented."""
    import hashlib

    body = {k: v for k, v in document.items() if k != STATE_DIGEST}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _verify_state(state_path: Path, state: dict[str, Any]) -> None:
    """Format 3 and later: the state file's own digest matches its content (an edit is corruption, not a resume)."""
    if state["format_version"] < 3:
        return
    if state.get(STATE_DIGEST) != state_digest(state):
        raise CheckpointError(f"{state_path} does not match its {STATE_DIGEST} (the file was edited or damaged); "
                              "the checkpoint is corrupt")


def _verify_manifest(path: Path, manifest: dict[str, dict]) -> None:
    if not manifest:
        raise CheckpointError(f"{path / STATE_FILE} has no manifest; the checkpoint is incomplete")
    for rel, entry in manifest.items():
        file = path / rel
        if not file.is_file():
            raise CheckpointError(f"{path}: file {rel} is missing; the checkpoint is partial")
        size = file.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointError(f"{path}: file {rel} has {size} bytes, the manifest says {entry['bytes']}; it is corrupt")
        if _sha256(file) != entry["sha256"]:
            raise CheckpointError(f"{path}: file {rel} does not match its sha256 in the manifest; it is corrupt")


def newest_checkpoint(root: str | os.PathLike, *, prefixes: tuple[str, ...] | None = None) -> LoadedCheckpoint | None:
    """The newest checkpoint under ``root`` that verifies; corrupt or partial ones are skipped with a warning."""
    for step, path in reversed(list_checkpoints(root)):
        try:
            return read_checkpoint(path, prefixes=prefixes)
        except CheckpointError as err:
            message = f"skipping checkpoint {path}: {err}; trying the previous one"
            log.warning(message)
            warnings.warn(message, UserWarning, stacklevel=2)
    return None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder from a checkpoint, a checkpoints folder or a run's output dir (its newest valid one)."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    for root in (path / CHECKPOINTS, path):
        if list_checkpoints(root):
            found = newest_checkpoint(root, prefixes=())
            if found is None:
                raise CheckpointError(f"no checkpoint under {root} verifies (all are corrupt or partial)")
            return found.path
    raise CheckpointError(f"{path} is neither a checkpoint folder (with {STATE_FILE}) nor a folder holding step_* "
                          "checkpoints; give a run's output_dir or one of its checkpoints/step_* folders")


def _dcp_load(folder: Path, prefixes: tuple[str, ...] | None) -> dict[str, torch.Tensor]:
    """The tensors under ``tensors/`` whose keys start with ``prefixes``: one DCP folder (format 1), or one per
    role (format 2: key ``<role>/<key in the role's folder>``), read whole on this process."""
    if (folder / ".metadata").is_file() or not folder.is_dir():
        return _dcp_load_folder(folder, prefixes, "")
    out: dict[str, torch.Tensor] = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        out.update(_dcp_load_folder(sub, prefixes, f"{sub.name}/"))
    return out


def _dcp_load_folder(folder: Path, prefixes: tuple[str, ...] | None, key_prefix: str) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = safe_reader(folder)
    try:
        metadata = reader.read_metadata()
    except CheckpointError:
        raise
    except Exception as err:  # truncated or foreign files raise many types
        raise CheckpointError(f"{folder}: DCP metadata unreadable ({type(err).__name__}: {err})") from None
    target: dict[str, torch.Tensor] = {}
    for key, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            raise CheckpointError(f"{folder}: entry {key!r} is not a tensor; hybridflow checkpoints hold tensors only")
        if prefixes is None or (key_prefix + key).startswith(prefixes):
            target[key] = torch.empty(entry.size, dtype=entry.properties.dtype)
    if not target:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(target, storage_reader=reader, no_dist=True)
    except dcp_exception() as err:
        raise unwrap_dcp_error(err, f"{folder}: tensors unreadable") from None
    except Exception as err:
        raise CheckpointError(f"{folder}: tensors unreadable ({type(err).__name__}: {err})") from None
    return {key_prefix + key: tensor for key, tensor in target.items()}
