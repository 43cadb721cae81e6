"""Which prompts each training step trained on: ``output_dir/prompts.jsonl``.

One JSON line per step, ``{"step": s, "prompts": [dataset indices]}``: the rows of the prompt loader the step's
rollout answers, in batch order (:attr:`hybridflow.data.PromptLoader.last_indices`). A resumed run rewinds
the file to the checkpoint's step before it appends, so the file lists each step once, as the run that
finished it trained it — what a check that a resume loses and replays nothing compares with an
uninterrupted run's file (:func:`read_prompt_log`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ..errors import WriteError

__all__ = ["PROMPT_LOG", "PromptLog", "read_prompt_log"]

PROMPT_LOG = "prompts.jsonl"


def read_prompt_log(path: Path) -> dict[int, list[int]]:
    """step -> the prompts' dataset indices, from a prompt log (the last record of a step wins; {} without one)."""
    steps: dict[int, list[int]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                steps[int(record["step"])] = [int(i) for i in record["prompts"]]
    return steps


class PromptLog:
    """Appends each step's prompt ids to ``folder/prompts.jsonl``; ``resume_step`` drops the steps after it."""

    def __init__(self, folder: Path, resume_step: int | None = None):
        self.path = Path(folder) / PROMPT_LOG
        self.rewind(resume_step or 0) if resume_step is not None else self._write([])

    def rewind(self, step: int) -> None:
        """Keep the records of steps up to ``step`` (they are run again after a restart from its checkpoint)."""
        kept = sorted(read_prompt_log(self.path).items())
        self._write([json.dumps({"step": s, "prompts": ids}) for s, ids in kept if s <= step])

    def record(self, step: int, indices: Sequence[int]) -> None:
        try:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": step, "prompts": list(indices)}) + "\n")
        except OSError as err:
            raise WriteError("the prompt log cannot be written", err, self.path) from None

    def _write(self, lines: list[str]) -> None:
        try:
            self.path.write_text("".join(line + "\n" for line in lines))
        except OSError as err:
            raise WriteError("the prompt log cannot be written", err, self.path) from None
