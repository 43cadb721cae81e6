"""Prompt datasets: rows of ``prompt``, ``ground_truth``, ``data_source``, ``extra_info``.

A row is a plain dict. ``prompt`` is the text given to the model (or a list of
chat messages ``[{"role": "user", "content": ...}]``), ``ground_truth`` is what
the reward function compares against (a string, or any JSON value such as
countdown's ``{"target": 24, "numbers": [...]}``), ``data_source`` names the
task so that a reward function can dispatch on it, and ``extra_info`` is an
optional dict passed through to the reward function. Other columns are kept.

Files are jsonl (one JSON object per line) or parquet (read with pyarrow).
:class:`PromptLoader` walks a dataset in batches of rows, reshuffled each
epoch from a seed, and can save and restore its position for resumption.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError

__all__ = [
    "REQUIRED_COLUMNS",
    "PromptDataset",
    "load_prompt_dataset",
    "write_prompt_dataset",
    "train_val_split",
    "PromptLoader",
]

#: columns every prompt row must have; ``extra_info`` is optional and defaults to ``{}``
REQUIRED_COLUMNS: tuple[str, ...] = ("prompt", "ground_truth", "data_source")
_SUFFIXES = (".jsonl", ".parquet")


def _normalise_row(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: a row must be a JSON object / mapping, got {type(row).__name__}.")
    for column in REQUIRED_COLUMNS:
        if column not in row:
            raise DataError(
                f"{where}: missing required column {column!r}; columns found: {sorted(row)}. "
                f"A prompt dataset needs {list(REQUIRED_COLUMNS)} (and optionally 'extra_info')."
            )
    prompt = row["prompt"]
    if not isinstance(prompt, str) and not (isinstance(prompt, (list, tuple))
                                            and all(isinstance(m, Mapping) for m in prompt)):
        raise DataError(f"{where}: column 'prompt' must be a string or a list of chat messages "
                        f"[{{'role': ..., 'content': ...}}], got {type(prompt).__name__} {prompt!r:.60}.")
    out = dict(row)
    if out.get("extra_info") is None:
        out["extra_info"] = {}
    return out


class PromptDataset(Sequence):
    """An in-memory prompt dataset: a validated, read-only sequence of row dicts.

    Args:
        rows: mappings with at least the :data:`REQUIRED_COLUMNS`.
        source: where the rows came from, used in error messages.
    """

    def __init__(self, rows: Iterable[Mapping[str, Any]], *, source: str = "in-memory rows"):
        self.source = source
        self._rows = tuple(_normalise_row(r, f"{source}, row {i}") for i, r in enumerate(rows))

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return PromptDataset(self._rows[index], source=self.source)
        return dict(self._rows[index])

    def __repr__(self) -> str:
        return f"PromptDataset({len(self)} rows from {self.source})"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise DataError(f"{path}, line {line}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                        "save the file as UTF-8.") from None
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {lineno}: not valid JSON ({e.msg}).") from e
    return rows


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: cannot read as parquet ({e}).") from e
    for column in REQUIRED_COLUMNS:
        if column not in table.column_names:
            raise DataError(
                f"{path}: missing required column {column!r}; columns found: {table.column_names}. "
                f"A prompt dataset needs {list(REQUIRED_COLUMNS)} (and optionally 'extra_info')."
            )
    return table.to_pylist()


def load_prompt_dataset(path: str | Path, *, empty_prompts: str = "error") -> PromptDataset:
    """Read a ``.jsonl`` or ``.parquet`` prompt file into a :class:`PromptDataset`.

    Raises :class:`DataError` naming the file when it is missing, unreadable,
    empty, of another format, or lacks a required column (the message lists the
    columns it does have). Rows with an empty prompt are a DataError naming them
    (``empty_prompts="error"``) or are left out with a warning counting them (``"skip"``).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prompt dataset {str(path)!r} does not exist (or is not a file).")
    if path.suffix not in _SUFFIXES:
        raise DataError(f"{path}: unknown dataset format {path.suffix!r}; use one of {list(_SUFFIXES)}.")
    rows = _read_jsonl(path) if path.suffix == ".jsonl" else _read_parquet(path)
    if not rows:
        raise DataError(f"{path}: the dataset has no rows.")
    rows = _without_empty_prompts(rows, path, empty_prompts)
    return PromptDataset(rows, source=str(path))


def _is_empty_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, (list, tuple)):
        return not any(isinstance(m, Mapping) and str(m.get("content") or "").strip() for m in prompt)
    return False  # another type: _normalise_row names it


def _without_empty_prompts(rows: list[dict[str, Any]], path: Path, policy: str) -> list[dict[str, Any]]:
    """``rows`` less those whose prompt is empty (``policy`` "skip", with a warning), or DataError (``"error"``)."""
    if policy not in ("error", "skip"):
        raise DataError(f"empty_prompts must be 'error' or 'skip', got {policy!r}")
    empty = [i for i, row in enumerate(rows, start=1) if isinstance(row, Mapping) and _is_empty_prompt(row.get("prompt"))]
    if not empty:
        return rows
    listed = ", ".join(map(str, empty[:10])) + (" ..." if len(empty) > 10 else "")
    if policy == "error":
        raise DataError(f"{path}: {len(empty)} of {len(rows)} rows have an empty prompt (row {listed}); fix them, or "
                        "set empty_prompts=skip to leave them out")
    skipped = set(empty)
    kept = [row for i, row in enumerate(rows, start=1) if i not in skipped]
    if not kept:
        raise DataError(f"{path}: every one of its {len(rows)} rows has an empty prompt")
    logging.getLogger("hybridflow.data").warning("%s: skipped %d of %d rows with an empty prompt (row %s; "
                                                 "empty_prompts=skip)", path, len(empty), len(rows), listed)
    return kept


def write_prompt_dataset(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write prompt rows to ``path`` as jsonl or parquet (by suffix); returns the path.

    Rows are validated first. In parquet, a column of dicts becomes a struct
    column, so every row's ``ground_truth`` must have the same JSON shape; an
    ``extra_info`` column that is empty in every row is left out (parquet
    cannot store a struct with no fields) and reads back as ``{}``.
    """
    path = Path(path)
    if path.suffix not in _SUFFIXES:
        raise DataError(f"{path}: unknown dataset format {path.suffix!r}; use one of {list(_SUFFIXES)}.")
    dataset = PromptDataset(rows, source=f"rows for {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as f:
            for row in dataset:
                f.write(json.dumps(row) + "\n")
        return path
    _write_parquet(list(dataset), path)
    return path


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if all(not row["extra_info"] for row in rows):
        rows = [{k: v for k, v in row.items() if k != "extra_info"} for row in rows]
    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise DataError(
            f"{path}: these rows do not fit one parquet schema ({e}); "
            "give every row the same value types, or write .jsonl instead."
        ) from e
    pq.write_table(table, path)


def train_val_split(rows: Sequence[Any], val_fraction: float, *, seed: int = 0) -> tuple[list[Any], list[Any]]:
    """Split ``rows`` into (train, val), ``round(val_fraction * len(rows))`` rows to val.

    Which rows go to val is drawn from ``seed``; both parts keep the input order.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"train_val_split: val_fraction must be in [0, 1), got {val_fraction}.")
    n_val = round(val_fraction * len(rows))
    val_idx = set(np.random.default_rng(seed).permutation(len(rows))[:n_val].tolist())
    train = [r for i, r in enumerate(rows) if i not in val_idx]
    val = [r for i, r in enumerate(rows) if i in val_idx]
    return train, val


class PromptLoader:
    """Batches of rows from a dataset, over and over, reshuffled every epoch.

    The order of epoch ``e`` is a permutation drawn from ``(seed, e)``, so it
    does not depend on how many batches were taken before; the position is
    ``(epoch, index)`` with ``index`` the number of rows of that epoch already
    handed out. :meth:`state_dict` / :meth:`load_state_dict` save and restore it.

    Args:
        dataset: the rows (any sequence of row dicts, e.g. a :class:`PromptDataset`).
        batch_size: rows per batch.
        shuffle: reshuffle every epoch; otherwise the dataset order is used.
        seed: seed of the shuffles.
        drop_last: skip an epoch's final batch when it would be smaller than
            ``batch_size`` (the default, so every step sees the same batch size).
    """

    def __init__(self, dataset: Sequence[Mapping[str, Any]], batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = True):
        if batch_size <= 0:
            raise DataError(f"PromptLoader: batch_size must be positive, got {batch_size}.")
        if len(dataset) == 0 or (drop_last and batch_size > len(dataset)):
            raise DataError(
                f"PromptLoader: batch_size {batch_size} is larger than the dataset ({len(dataset)} rows) "
                "with drop_last=True, so no batch could ever be made; lower batch_size or set drop_last=False."
            )
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch, self.index = 0, 0
        self.last_indices: list[int] = []
        """The dataset indices of the rows the last :meth:`next_batch` returned (the prompt ids a run logs)."""

    @property
    def batches_per_epoch(self) -> int:
        n, b = len(self.dataset), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def _epoch_end(self) -> int:
        """Rows of an epoch that are handed out (the dropped tail excluded)."""
        n = len(self.dataset)
        return n - n % self.batch_size if self.drop_last else n

    def _order(self, epoch: int) -> np.ndarray:
        n = len(self.dataset)
        return np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)

    def next_batch(self) -> list[dict[str, Any]]:
        """The next batch of rows, moving on to a new epoch when this one is used up."""
        if self.index >= self._epoch_end():
            self.epoch, self.index = self.epoch + 1, 0
        order = self._order(self.epoch)
        stop = min(self.index + self.batch_size, self._epoch_end())
        self.last_indices = [int(i) for i in order[self.index:stop]]
        rows = [dict(self.dataset[i]) for i in self.last_indices]
        self.index = stop
        return rows

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        """The remaining batches of the current epoch (a whole epoch when at its start)."""
        if self.index >= self._epoch_end():
            self.epoch, self.index = self.epoch + 1, 0
        while self.index < self._epoch_end():
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        """The position, as JSON-ready ints: epoch, index, seed, num_rows, batch_size."""
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed,
                "num_rows": len(self.dataset), "batch_size": self.batch_size}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from a position saved by :meth:`state_dict`.

        Raises :class:`DataError` when the saved seed or dataset size differ
        from this loader's (the resumed run would see a different order).
        """
        for key in ("epoch", "index"):
            if key not in state:
                raise DataError(f"PromptLoader.load_state_dict: the state lacks {key!r}; got keys {sorted(state)}.")
        for key, mine in (("seed", self.seed), ("num_rows", len(self.dataset))):
            if key in state and state[key] != mine:
                raise DataError(
                    f"PromptLoader.load_state_dict: saved {key} {state[key]} differs from this loader's {mine}; "
                    "resuming would replay a different order. Use the same dataset and seed as the saved run."
                )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
