"""A finished run's folder as ``hybridflow explain`` and ``hybridflow diff`` read it.

A run writes (see :mod:`.run_record` and :mod:`.run_report`):

* ``plan.json`` — the plan it ran (:class:`~hybridflow.compiler.plan.ExecutionPlan`);
* ``trace.json`` — its spans as a Chrome trace: per-op spans on the pools' and the controller's tracks, per-slot
  spans on the slots' tracks, validation's spans marked ``"beside"``;
* ``metrics.jsonl`` — one record per step (``timing_s/step`` among them);
* ``config.json`` — the algorithm and the config it ran, ``environment.json`` — the packages, threads and devices
  of the process that ran it, ``hashes.jsonl`` — with ``record_hashes``, a digest of every node output's tensors
  per step.

Each reader raises :class:`~hybridflow.errors.RunFolderError` naming the file and what to do when it is missing or
unreadable.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RunFolderError
from ..runtime.spans import Span

__all__ = ["RunConfigRecord", "HashRecord", "run_path", "read_run_plan", "read_run_spans", "iteration_spans",
           "read_run_config", "read_environment", "read_hashes", "read_step_times"]


@dataclass(frozen=True)
class RunConfigRecord:
    """``config.json``: the algorithm (its name, or the spec it was resolved from) and the config's fields."""

    algorithm: str
    config: dict[str, Any]


@dataclass(frozen=True)
class HashRecord:
    """One line of ``hashes.jsonl``: the digest of one tensor field of one node's output at one step."""

    step: int
    node: str
    field: str
    digest: str
    pool: str | None

    @property
    def edge(self) -> str:
        """``node.field``: the graph edge the tensor travels on."""
        return f"{self.node}.{self.field}"


def run_path(run_dir: str | Path, name: str, what: str, hint: str) -> Path:
    """``run_dir/name``; RunFolderError naming it (``what`` it holds, ``hint``: how to get one) when it is missing."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise RunFolderError(f"{folder}: no such run folder; give the output_dir of a run (it holds plan.json, "
                             "trace.json, metrics.jsonl)")
    path = folder / name
    if not path.is_file():
        raise RunFolderError(f"{path}: missing ({what}); {hint}")
    return path


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise RunFolderError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    except ValueError as err:
        raise RunFolderError(f"{path}: not JSON ({err}); was the run interrupted while writing it?") from None


def read_run_plan(run_dir: str | Path):
    """The plan the run ran (its ``plan.json``)."""
    from ..compiler.plan import read_plan
    from ..errors import HybridflowError

    path = run_path(run_dir, "plan.json", "the plan the run ran", "every run writes one when it starts")
    try:
        return read_plan(path.read_text(encoding="utf-8"))
    except HybridflowError as err:
        raise RunFolderError(f"{path}: not a plan this hybridflow reads ({err}); if the graph uses custom ops, pass "
                             "--import MODULE to register them") from None


def read_run_spans(run_dir: str | Path) -> list[Span]:
    """Every span of the run's ``trace.json`` but validation's (marked ``beside``), on the recorder's clock (seconds)."""
    path = run_path(run_dir, "trace.json", "the run's spans", "a run writes it when it ends (hybridflow run, quickstart, "
                    "or write_artifacts(trainer) after Trainer.train())")
    doc = _json(path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise RunFolderError(f"{path}: not a Chrome trace (no traceEvents list)")
    spans = []
    for event in events:
        args = event.get("args") if isinstance(event, dict) else None
        if event.get("ph") != "X" or not isinstance(args, dict) or args.get("beside") or "op" not in args:
            continue
        start = float(event["ts"]) / 1e6
        spans.append(Span(op=args["op"], node=args.get("node"), kind=str(args.get("kind", "")), role=str(args.get("role", "")),
                          device=str(args.get("device", "")), start=start, end=start + float(event.get("dur", 0.0)) / 1e6,
                          iteration=int(args.get("iteration", 0)), sent=args.get("sent"), done=args.get("done"),
                          call=args.get("call")))
    return spans


def iteration_spans(plan, spans: list[Span]) -> list[Span]:
    """The per-op spans of the plan's ops (one per op run: on the op's pool's track, or the controller's), not the
    per-slot ones; the first iteration (the warm-up) left out when there are later ones, as ``timing.txt`` does."""
    from ..graph import CONTROLLER

    tracks = {op.name: op.pool or CONTROLLER for op in plan.ops}
    mine = [s for s in spans if tracks.get(s.op) == s.device]
    later = [s for s in mine if s.iteration >= 1]
    return later or mine


def read_run_config(run_dir: str | Path) -> RunConfigRecord:
    """The run's algorithm and config: its ``config.json``, else (a run from before it was written) the config a
    checkpoint of it saved."""
    folder = Path(run_dir)
    path = folder / "config.json"
    if path.is_file():
        doc = _json(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
            raise RunFolderError(f"{path}: not a run's config record (no 'config' mapping)")
        return RunConfigRecord(str(doc.get("algorithm", "")), doc["config"])
    states = sorted(folder.glob("checkpoints/*/trainer_state.json"))
    if states:
        doc = _json(states[-1])
        if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
            return RunConfigRecord(str(doc.get("algorithm", "")), doc["config"])
    run_path(folder, "plan.json", "the plan the run ran", "every run writes one when it starts")  # a run folder at all?
    raise RunFolderError(f"{path}: missing (the config the run ran), and the run saved no checkpoint holding it; "
                         "runs write config.json when they start: run it again to get one")


def read_environment(run_dir: str | Path) -> dict[str, Any]:
    """The run's ``environment.json`` ({} for a run from before it was written)."""
    path = Path(run_dir) / "environment.json"
    return _json(path) if path.is_file() else {}


def read_hashes(run_dir: str | Path) -> list[HashRecord]:
    """The run's ``hashes.jsonl`` in file order (steps ascending, each step's nodes in plan order)."""
    path = run_path(run_dir, "hashes.jsonl", "the value hashes", "run with record_hashes=true to write them")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            records.append(HashRecord(int(row["step"]), str(row["node"]), str(row["field"]), str(row["digest"]),
                                      row.get("pool")))
        except (ValueError, KeyError, TypeError):
            raise RunFolderError(f"{path}:{number}: not a hash record (step, node, field, digest, pool); was the run "
                                 "interrupted while writing it?") from None
    return records


def read_step_times(run_dir: str | Path) -> list[tuple[int, float]]:
    """(step, ``timing_s/step``) of the run's ``metrics.jsonl`` ([] without one): the trainer's wall time per step."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    times = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "timing_s/step" in row and isinstance(row.get("step"), int):
            times[row["step"]] = float(row["timing_s/step"])
    return sorted(times.items())
