"""Prompt datasets (jsonl, parquet, in memory) and the resumable shuffling loader."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.data import (
    PromptDataset,
    PromptLoader,
    load_prompt_dataset,
    train_val_split,
    write_prompt_dataset,
)
from hybridflow.data.tasks import arithmetic, countdown
from hybridflow.errors import DataError


def rows(n: int) -> list[dict]:
    return [{"prompt": f"{i}+1=", "ground_truth": str(i + 1), "data_source": "arithmetic"} for i in range(n)]


# -- files -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_write_then_load_round_trips(suffix, tmp_path):
    for made in (arithmetic.make_arithmetic_rows(), countdown.make_countdown_rows(6, seed=2)):
        path = write_prompt_dataset(made, tmp_path / f"d{suffix}")
        loaded = load_prompt_dataset(path)
        assert len(loaded) == len(made) and list(loaded) == made
        assert loaded.source == str(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_extra_info_is_optional_and_defaults_to_empty_dict(suffix, tmp_path):
    path = write_prompt_dataset(rows(3), tmp_path / f"d{suffix}")
    assert [r["extra_info"] for r in load_prompt_dataset(path)] == [{}, {}, {}]


def test_missing_column_in_jsonl_names_column_file_and_columns_found(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "data_source": "arithmetic", "answer": "2"}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl, row 0: missing required column 'ground_truth'; "
                                        r"columns found: \['answer', 'data_source', 'prompt'\]"):
        load_prompt_dataset(path)


def test_missing_column_in_parquet_names_column_file_and_columns_found(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "1+1=", "ground_truth": "2"}]), path)
    with pytest.raises(DataError, match=r"bad\.parquet: missing required column 'data_source'; "
                                        r"columns found: \['prompt', 'ground_truth'\]"):
        load_prompt_dataset(path)


def test_unreadable_files_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_prompt_dataset(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("prompt\n")
    with pytest.raises(DataError, match="unknown dataset format '.csv'"):
        load_prompt_dataset(tmp_path / "d.csv")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "1"}\n{not json\n')
    with pytest.raises(DataError, match=r"broken\.jsonl, line 2: not valid JSON"):
        load_prompt_dataset(tmp_path / "broken.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no rows"):
        load_prompt_dataset(tmp_path / "empty.jsonl")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="cannot read as parquet"):
        load_prompt_dataset(tmp_path / "junk.parquet")


def test_parquet_needs_one_schema_and_says_to_use_jsonl(tmp_path):
    mixed = rows(1) + [{"prompt": "x", "ground_truth": {"target": 3}, "data_source": "countdown"}]
    with pytest.raises(DataError, match="one parquet schema.*jsonl"):
        write_prompt_dataset(mixed, tmp_path / "mixed.parquet")
    assert len(load_prompt_dataset(write_prompt_dataset(mixed, tmp_path / "mixed.jsonl"))) == 2


def test_in_memory_dataset_validates_and_slices():
    ds = PromptDataset(rows(5))
    assert len(ds) == 5 and ds[1]["prompt"] == "1+1=" and len(ds[1:3]) == 2
    ds[0]["prompt"] = "changed"  # rows are handed out as copies
    assert ds[0]["prompt"] == "0+1="
    with pytest.raises(DataError, match="in-memory rows, row 1: missing required column 'prompt'"):
        PromptDataset([rows(1)[0], {"ground_truth": "1", "data_source": "x"}])


def test_train_val_split_is_seeded_disjoint_and_complete():
    items = list(range(50))
    train, val = train_val_split(items, 0.2, seed=3)
    assert len(val) == 10 and sorted(train + val) == items and not set(train) & set(val)
    assert train_val_split(items, 0.2, seed=3) == (train, val)
    assert train_val_split(items, 0.2, seed=4)[1] != val
    with pytest.raises(DataError, match="val_fraction"):
        train_val_split(items, 1.0)


# -- loader ------------------------------------------------------------------------------------------

def prompts_of(batches) -> list[list[str]]:
    return [[r["prompt"] for r in b] for b in batches]


def test_loader_epochs_cover_the_dataset_and_reshuffle():
    loader = PromptLoader(PromptDataset(rows(10)), 4, seed=1, drop_last=False)
    epoch0, epoch1 = prompts_of(loader), prompts_of(loader)
    assert [len(b) for b in epoch0] == [4, 4, 2] and loader.epoch == 1
    for epoch in (epoch0, epoch1):
        assert sorted(p for b in epoch for p in b) == sorted(r["prompt"] for r in rows(10))
    assert epoch0 != epoch1
    again = PromptLoader(PromptDataset(rows(10)), 4, seed=1, drop_last=False)
    assert prompts_of(again) == epoch0  # same seed, same order


def test_loader_drop_last_and_no_shuffle():
    loader = PromptLoader(rows(10), 4, shuffle=False)
    assert loader.batches_per_epoch == 2
    assert prompts_of(loader) == [["0+1=", "1+1=", "2+1=", "3+1="], ["4+1=", "5+1=", "6+1=", "7+1="]]
    assert prompts_of([loader.next_batch()]) == [["0+1=", "1+1=", "2+1=", "3+1="]]  # epoch 1 starts over
    assert loader.state_dict() == {"epoch": 1, "index": 4, "seed": 0, "num_rows": 10, "batch_size": 4}
    with pytest.raises(DataError, match="batch_size 11 is larger than the dataset"):
        PromptLoader(rows(10), 11)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20), st.integers(1, 7), st.integers(0, 15), st.booleans(), st.integers(0, 5))
def test_loader_resumes_exactly_where_it_stopped(n, batch_size, taken, drop_last, seed):
    if drop_last and batch_size > n:
        batch_size = n
    original = PromptLoader(rows(n), batch_size, seed=seed, drop_last=drop_last)
    for _ in range(taken):
        original.next_batch()
    state = json.loads(json.dumps(original.state_dict()))  # survives a JSON checkpoint
    resumed = PromptLoader(rows(n), batch_size, seed=seed, drop_last=drop_last)
    resumed.load_state_dict(state)
    expected = [original.next_batch() for _ in range(6)]
    assert [resumed.next_batch() for _ in range(6)] == expected


def test_loader_refuses_a_state_from_another_seed_or_dataset():
    loader = PromptLoader(rows(10), 2, seed=0)
    with pytest.raises(DataError, match="saved seed 5 differs from this loader's 0"):
        loader.load_state_dict({"epoch": 0, "index": 2, "seed": 5})
    with pytest.raises(DataError, match="saved num_rows 12 differs"):
        loader.load_state_dict({"epoch": 0, "index": 2, "num_rows": 12})
    with pytest.raises(DataError, match="lacks 'index'"):
        loader.load_state_dict({"epoch": 0})
