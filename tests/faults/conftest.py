"""Fixtures of the fault suite: one small finished run with a checkpoint (of the suite's ``tiny_model_dir``),
and the ways to make a folder read-only or a disk full that work on this machine (see :mod:`.faultkit`)."""
from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    """A run of one step with its checkpoint (made in this process: the cases copy or mount it, never change it)."""
    from hybridflow.cli import main

    from faultkit import run_overrides

    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["run", *run_overrides(tiny_model_dir, out, max_steps=1, save_freq=1)]) == 0
    return out
