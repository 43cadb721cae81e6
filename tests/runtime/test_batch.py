"""Batch: alignment of tensors and columns under split / concat / repeat / pad / select / union."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.errors import BatchError
from hybridflow.runtime import Batch


def make_batch(n: int, width: int = 3, seed: int = 0) -> Batch:
    """Rows carry their own id in every field, so misalignment is visible."""
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "row": torch.arange(n),
        "x": torch.randn(n, width, generator=g),
        "mask": (torch.rand(n, width, generator=g) > 0.5).float(),
    }
    columns = {"tag": [f"row{i}" for i in range(n)], "gt": [{"target": i, "numbers": [i, i + 1]} for i in range(n)]}
    return Batch(tensors, columns, {"step": 3}, batch_size=n)


def assert_aligned(batch: Batch) -> None:
    for j, r in enumerate(batch["row"].tolist()):
        assert batch["tag"][j] == f"row{r}"
        assert batch["gt"][j] == {"target": r, "numbers": [r, r + 1]}


@st.composite
def batches(draw, min_size: int = 0):
    return make_batch(draw(st.integers(min_size, 12)), draw(st.integers(1, 4)), draw(st.integers(0, 2**16)))


# -- construction and reading --------------------------------------------------------------------------

def test_lengths_must_agree_and_the_error_names_fields_and_sizes():
    with pytest.raises(BatchError, match=r"'x': 3.*'prompt': 2"):
        Batch({"x": torch.zeros(3)}, {"prompt": ["a", "b"]})
    with pytest.raises(BatchError, match=r"'a': 2, 'b': 4"):
        Batch({"a": torch.zeros(2, 5), "b": torch.zeros(4)})


def test_bad_fields_are_rejected_with_their_names():
    with pytest.raises(BatchError, match="'s'.*scalar"):
        Batch({"s": torch.tensor(1.0)})
    with pytest.raises(BatchError, match="'c'.*tensor"):
        Batch(columns={"c": torch.zeros(2)})
    with pytest.raises(BatchError, match=r"\['p'\].*both"):
        Batch({"p": torch.zeros(2)}, {"p": [1, 2]})
    with pytest.raises(BatchError, match="'t'.*list"):
        Batch(columns={"t": "abc"})


def test_getitem_fields_rows_and_errors():
    b = make_batch(4)
    assert torch.equal(b["row"], torch.arange(4))
    assert list(b["tag"]) == ["row0", "row1", "row2", "row3"]
    assert b[2]["tag"].tolist() == ["row2"] and b[-1]["row"].tolist() == [3]  # int keeps the dim
    assert b[1:3]["row"].tolist() == [1, 2]
    picked = b[torch.tensor([3, 0, 3])]
    assert picked["row"].tolist() == [3, 0, 3] and picked["tag"].tolist() == ["row3", "row0", "row3"]
    masked = b[torch.tensor([True, False, True, False])]
    assert masked["tag"].tolist() == ["row0", "row2"]
    assert b[[-1]]["tag"].tolist() == ["row3"] and b[np.int64(1)]["tag"].tolist() == ["row1"]
    with pytest.raises(TypeError, match="not iterable"):
        list(b)
    with pytest.raises(BatchError, match="no field 'nope'.*'row'.*'tag'"):
        b["nope"]
    with pytest.raises(BatchError, match="out of range"):
        b[torch.tensor([4])]
    with pytest.raises(BatchError, match="out of range"):
        b[4]
    with pytest.raises(BatchError, match="mask has length 2"):
        b[torch.tensor([True, False])]


def test_columns_keep_lists_and_dicts_as_single_values():
    b = Batch(columns={"gt": [[1, 2], [3, 4]], "d": [{"a": 1}, {}]})
    assert len(b) == 2 and b["gt"][0] == [1, 2] and b["d"][1] == {}


def test_empty_batch_and_batch_size_without_fields():
    assert len(Batch()) == 0
    assert len(Batch(batch_size=5)) == 5
    assert len(Batch(batch_size=5)[1:3]) == 2


def test_select_drop_with_fields_with_meta():
    b = make_batch(3)
    s = b.select("row", "tag")
    assert s.keys() == ["row", "tag"] and s.meta == {"step": 3}
    with pytest.raises(BatchError, match="no field 'zz'"):
        b.select("row", "zz")
    assert "x" not in b.drop("x") and "x" in b  # the original is untouched
    w = b.with_fields(scores=torch.ones(3), note=["a", "b", "c"], x=torch.zeros(3, 1))
    assert w["scores"].tolist() == [1.0, 1.0, 1.0] and w["note"][2] == "c" and w["x"].shape == (3, 1)
    assert b["x"].shape == (3, 3)
    with pytest.raises(BatchError, match="'scores': 2"):
        b.with_fields(scores=torch.ones(2))
    assert b.with_meta(temperature=0.7).meta == {"step": 3, "temperature": 0.7} and b.meta == {"step": 3}


# -- split / chunk / concat ---------------------------------------------------------------------------

def test_split_by_size_and_by_sizes():
    b = make_batch(7)
    assert [len(p) for p in b.split(3)] == [3, 3, 1]
    assert [p["row"].tolist() for p in b.split([2, 0, 5])] == [[0, 1], [], [2, 3, 4, 5, 6]]
    with pytest.raises(BatchError, match=r"\[2, 2\].*add up to the batch size 7"):
        b.split([2, 2])
    with pytest.raises(BatchError, match="positive"):
        b.split(0)


def test_chunk_sizes_differ_by_at_most_one():
    assert [len(p) for p in make_batch(7).chunk(3)] == [3, 2, 2]
    assert [len(p) for p in make_batch(2).chunk(4)] == [1, 1, 0, 0]


def test_concat_rejects_mismatches_naming_the_field():
    a, b = make_batch(2), make_batch(3, width=5)
    with pytest.raises(BatchError, match=r"'x'.*\[3, 5\].*batch 1.*\[2, 3\]"):
        Batch.concat([a, b])
    with pytest.raises(BatchError, match="batch 1 has tensors"):
        Batch.concat([a, a.drop("x")])
    with pytest.raises(BatchError, match="meta 'step' differs"):
        Batch.concat([a, a.with_meta(step=4)])
    with pytest.raises(BatchError, match="empty list"):
        Batch.concat([])


@settings(max_examples=40, deadline=None)
@given(batches(), st.integers(1, 13))
def test_concat_of_split_is_identity(b, size):
    parts = b.split(size)
    assert all(len(p) <= size for p in parts)
    assert Batch.concat(parts) == b


@settings(max_examples=40, deadline=None)
@given(batches(), st.integers(1, 6))
def test_concat_of_chunk_is_identity(b, n):
    assert Batch.concat(b.chunk(n)) == b


# -- repeat_interleave --------------------------------------------------------------------------------

def test_repeat_interleave_hand_case():
    b = Batch({"p": torch.tensor([[5, 6], [7, 8]])}, {"prompt": ["1+1=", "2+2="]})
    r = b.repeat_interleave(3)
    # each row three times in place: [a, a, a, b, b, b]; group_index says which prompt
    assert r["p"].tolist() == [[5, 6]] * 3 + [[7, 8]] * 3
    assert r["prompt"].tolist() == ["1+1="] * 3 + ["2+2="] * 3
    assert r["group_index"].tolist() == [0, 0, 0, 1, 1, 1] and r["group_index"].dtype == torch.int64


def test_repeat_interleave_keeps_an_existing_group_index():
    b = Batch({"group_index": torch.tensor([4, 4, 9])})
    assert b.repeat_interleave(2)["group_index"].tolist() == [4, 4, 4, 4, 9, 9]
    with pytest.raises(BatchError, match="n >= 1"):
        b.repeat_interleave(0)


@settings(max_examples=40, deadline=None)
@given(batches(), st.integers(1, 5))
def test_repeat_interleave_keeps_columns_aligned_with_tensors(b, n):
    r = b.repeat_interleave(n)
    assert len(r) == n * len(b)
    assert_aligned(r)
    assert r["row"].tolist() == [i // n for i in range(n * len(b))]
    assert torch.equal(r["group_index"], r["row"])  # row ids are 0..B-1 here, so they are the groups
    assert torch.equal(r["x"], b["x"].repeat_interleave(n, dim=0))


# -- pad / unpad -------------------------------------------------------------------------------------

def test_pad_to_divisor_hand_case():
    b = make_batch(5)
    padded, pad = b.pad_to_divisor(4)
    # 5 rows -> 8: three copies of the last row (row 4)
    assert pad == 3 and padded["row"].tolist() == [0, 1, 2, 3, 4, 4, 4, 4]
    assert padded["tag"].tolist()[-3:] == ["row4"] * 3
    assert b.pad_to_divisor(5) == (b, 0) and b.pad_to_divisor(1)[1] == 0
    assert make_batch(0).pad_to_divisor(2) == (make_batch(0), 0)
    with pytest.raises(BatchError, match="divisor >= 1"):
        b.pad_to_divisor(0)
    with pytest.raises(BatchError, match="pad_count 6"):
        b.unpad(6)


@settings(max_examples=40, deadline=None)
@given(batches(min_size=1), st.integers(1, 8))
def test_unpad_of_pad_is_identity(b, d):
    padded, pad = b.pad_to_divisor(d)
    assert len(padded) % d == 0 and 0 <= pad < d
    assert_aligned(padded)
    assert padded.unpad(pad) == b


# -- union, device, pickling, equality ---------------------------------------------------------------

def test_union_merges_fields_and_rejects_conflicts():
    b = make_batch(3)
    other = b.select("tag").with_fields(scores=torch.tensor([1.0, 0.0, 1.0])).with_meta(temperature=1.0)
    u = b.union(other)
    assert u["scores"].tolist() == [1.0, 0.0, 1.0] and "x" in u and u.meta == {"step": 3, "temperature": 1.0}
    with pytest.raises(BatchError, match="field 'tag' differs"):
        b.union(b.select("tag")[torch.tensor([2, 1, 0])])
    with pytest.raises(BatchError, match="different lengths: 3 and 2"):
        b.union(b[:2])
    with pytest.raises(BatchError, match="meta 'step' differs"):
        b.union(b.select("row").with_meta(step=9))


def test_to_device_and_pickle_round_trip():
    b = make_batch(4)
    assert b.to("cpu") == b and b.to(torch.device("cpu"))["x"].device.type == "cpu"
    assert pickle.loads(pickle.dumps(b)) == b


def test_equality_is_exact():
    b = make_batch(3)
    assert b == make_batch(3)
    assert b != make_batch(3, seed=1)
    assert b != b.with_fields(row=b["row"].to(torch.int32))  # same values, other dtype
    assert b != b.with_meta(step=4)
    assert b != b.with_fields(tag=np.array(["row0", "row1", "rowX"], dtype=object))
