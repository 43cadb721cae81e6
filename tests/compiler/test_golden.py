"""Golden text dumps of the PPO plan before and after each compiler pass.

``tests/compiler/golden/CASE/`` holds ``00-graph.txt`` (the pipeline's input)
and ``NN-PASS.txt`` (the plan after pass NN). The test compares them exactly;
after an intended change, regenerate with

    HYBRIDFLOW_UPDATE_GOLDEN=1 .venv/bin/pytest tests/compiler/test_golden.py

and review the diff.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler.compile import compile

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("HYBRIDFLOW_UPDATE_GOLDEN", "") not in ("", "0")

CASES = {
    # four 7B roles colocated on 16 A100s: hybrid-engine weight sync, all resident
    "ppo-7b-colocate-16": dict(models={"actor": "llama2-7b"}, placement="colocate"),
    # four 34B roles colocated on 16 A100s: they do not fit together, so offload brackets
    "ppo-34b-colocate-16": dict(models={"actor": "llama2-34b"}, placement="colocate"),
    # a rollout pool of its own, one step off-policy: cross-pool broadcast, overlapped generation
    "ppo-7b-rollout-stale1-16": dict(models={"actor": "llama2-7b"}, placement="actor+ref@8;critic+reward@4;actor.generate@4",
                                     staleness=1, allow_uncorrected_staleness=True),
}


class _Collect:
    """A pass hook that keeps the text form after every pass."""

    def __init__(self) -> None:
        self.dumps: list[tuple[str, str]] = []

    def before(self, name, plan) -> None:
        pass

    def after(self, name, plan) -> None:
        self.dumps.append((f"{len(self.dumps) + 1:02d}-{name}.txt", plan.to_text()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_pass_dumps_match_the_golden_files(case):
    graph = ALGORITHMS["ppo"].build()
    hook = _Collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the stale case warns about the missing IS correction
        compile(graph, "a100-80g:2", debug=True, hooks=(hook,), **CASES[case])
    files = [("00-graph.txt", graph.to_text())] + hook.dumps
    folder = GOLDEN / case
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.txt"):
            stale.unlink()
        for name, text in files:
            (folder / name).write_text(text)
    assert sorted(p.name for p in folder.glob("*.txt")) == [name for name, _ in files]
    for name, text in files:
        assert text == (folder / name).read_text(), f"{case}/{name} differs; regenerate with HYBRIDFLOW_UPDATE_GOLDEN=1 if intended"
