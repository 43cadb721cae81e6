"""Checkpoint folders: atomic writes, keep-last-k, verification, corrupt ones skipped, no arbitrary unpickling."""
from __future__ import annotations

import json
import pickle

import pytest
import torch

from hybridflow.errors import CheckpointError
from hybridflow.trainer.checkpoint import (STATE_DIGEST, STATE_FILE, _sha256, list_checkpoints, newest_checkpoint, read_checkpoint,
                                           resolve_checkpoint, save_checkpoint, state_digest)

TENSORS = {"actor/model/w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
           "actor/optim/0/step": torch.tensor(3.0), "actor/model/b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}


def _save(root, step, keep=3):
    return save_checkpoint(root, step, TENSORS, {"note": f"step {step}"}, keep=keep)


def test_round_trip_is_exact_and_prefixes_select(tmp_path):
    path = _save(tmp_path, 5)
    found = read_checkpoint(path)
    assert found.step == 5 and found.state["note"] == "step 5"
    assert set(found.tensors) == set(TENSORS)
    for key, tensor in TENSORS.items():
        assert found.tensors[key].dtype == tensor.dtype and torch.equal(found.tensors[key], tensor)
    assert set(read_checkpoint(path, prefixes=("actor/model/",)).tensors) == {"actor/model/w", "actor/model/b"}


def test_keeps_the_newest_k_and_leaves_no_temp_folder(tmp_path):
    for step in (1, 2, 3, 4, 5):
        _save(tmp_path, step, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


def test_a_temp_folder_of_a_crashed_write_is_not_a_checkpoint(tmp_path):
    _save(tmp_path, 1)
    (tmp_path / ".tmp-step_00000002-999").mkdir()
    assert newest_checkpoint(tmp_path).step == 1


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_state", "delete_data"])
def test_corrupt_newest_is_skipped_with_a_warning(tmp_path, damage):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    data = next((newest / "tensors").glob("*.distcp"))
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:100])
    elif damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "delete_state":
        (newest / STATE_FILE).unlink()
    else:
        data.unlink()
    with pytest.warns(UserWarning, match="skipping checkpoint .*step_00000002"):
        found = newest_checkpoint(tmp_path)
    assert found.step == 1
    with pytest.raises(CheckpointError):
        read_checkpoint(newest)


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_metadata_with_foreign_objects_is_refused_before_anything_runs(tmp_path, capsys):
    path = _save(tmp_path, 1)
    meta = path / "tensors" / ".metadata"
    meta.write_bytes(pickle.dumps(_Evil()))
    state = json.loads((path / STATE_FILE).read_text())  # keep the manifest consistent: only the unpickler stops it
    state["manifest"]["tensors/.metadata"] = {"bytes": meta.stat().st_size, "sha256": _sha256(meta)}
    state[STATE_DIGEST] = state_digest(state)
    (path / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="builtins.print, which is not a DCP metadata record"):
        read_checkpoint(path)
    assert "this must never run" not in capsys.readouterr().out


def test_non_tensor_entries_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="only tensors"):
        save_checkpoint(tmp_path, 1, {"x": 3}, {}, keep=1)


def test_resolve_checkpoint_from_run_folder(tmp_path):
    _save(tmp_path / "checkpoints", 1)
    newest = _save(tmp_path / "checkpoints", 2)
    assert resolve_checkpoint(tmp_path) == newest
    assert resolve_checkpoint(newest) == newest
    with pytest.raises(CheckpointError, match="neither a checkpoint folder"):
        resolve_checkpoint(tmp_path / "nothing")
