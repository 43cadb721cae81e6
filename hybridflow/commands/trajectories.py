"""``hybridflow trajectories FILE``: print logged multi-turn trajectories readably.

FILE is a run's ``trajectories.jsonl`` (or its output folder). ``--step`` keeps one step's
records (``-1``: the last step logged), ``--index`` one record of those, ``--json`` prints the
raw records instead.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import DataError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="trajectories.jsonl, or the run's output folder")
    parser.add_argument("--step", type=int, default=None, help="only this step's records (-1: the last step)")
    parser.add_argument("--index", type=int, default=None, help="only the record at this position (after --step)")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")


def _records(path: Path) -> list[dict]:
    from ..trainer.trajectory_log import TRAJECTORY_FILE

    if path.is_dir():
        path = path / TRAJECTORY_FILE
    if not path.is_file():
        raise DataError(f"no trajectory log at {str(path)!r}; a run with a multi-turn rollout writes "
                        f"{TRAJECTORY_FILE} in its output folder")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{number}: not a JSON record ({err})") from None
    return records


def run(args: argparse.Namespace) -> int:
    from ..trainer.trajectory_log import format_trajectory

    records = _records(Path(args.file))
    if args.step is not None and records:
        step = max(r["step"] for r in records) if args.step == -1 else args.step
        records = [r for r in records if r["step"] == step]
    if args.index is not None:
        if not -len(records) <= args.index < len(records):
            raise DataError(f"--index {args.index}: there are {len(records)} records")
        records = [records[args.index]]
    for record in records:
        print(json.dumps(record) if args.json else format_trajectory(record) + "\n")
    return 0
