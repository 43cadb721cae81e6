"""Arithmetic generator: the 100 single-digit sums, other operators, splits, the command line."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hybridflow.data import load_prompt_dataset
from hybridflow.data.tasks import arithmetic
from hybridflow.errors import ConfigError


def test_default_is_all_100_single_digit_sums():
    rows = arithmetic.make_arithmetic_rows()
    assert len(rows) == 100 and len({r["prompt"] for r in rows}) == 100
    by_prompt = {r["prompt"]: r for r in rows}
    assert by_prompt["0+0="]["ground_truth"] == "0"
    assert by_prompt["9+9="]["ground_truth"] == "18"
    assert by_prompt["3+7="]["ground_truth"] == "10"
    assert by_prompt["3+7="]["extra_info"] == {"a": 3, "b": 7, "op": "+"}
    assert all(r["data_source"] == "arithmetic" for r in rows)
    # sums 0..9 come from the 55 pairs with a + b <= 9; the other 45 have two digits
    assert sum(len(r["ground_truth"]) == 1 for r in rows) == 55
    for r in rows:
        a, b = r["extra_info"]["a"], r["extra_info"]["b"]
        assert r["prompt"] == f"{a}+{b}=" and r["ground_truth"] == str(a + b)


def test_other_operators_and_ranges():
    rows = arithmetic.make_arithmetic_rows(a_range=(0, 3), operators="-/")
    by_prompt = {r["prompt"]: r["ground_truth"] for r in rows}
    assert by_prompt["1-3="] == "-2" and by_prompt["3/3="] == "1" and by_prompt["0/2="] == "0"
    assert "3/2=" not in by_prompt and "3/0=" not in by_prompt  # only exact divisions, never by zero
    # 4x4 subtractions; exact divisions with b != 0: b=1: a=0..3 (4), b=2: a=0,2 (2), b=3: a=0,3 (2)
    assert sorted(p for p in by_prompt if "/" in p) == ["0/1=", "0/2=", "0/3=", "1/1=", "2/1=", "2/2=", "3/1=", "3/3="]
    assert len(rows) == 16 + 8
    with pytest.raises(ConfigError, match="unknown operator '%'"):
        arithmetic.make_arithmetic_rows(operators="%")
    with pytest.raises(ConfigError, match="a_range"):
        arithmetic.make_arithmetic_rows(a_range=(5, 2))


def test_write_with_a_seeded_validation_split(tmp_path):
    out, val = arithmetic.write_arithmetic_dataset(tmp_path / "t.parquet", val_out=tmp_path / "v.parquet",
                                                   val_fraction=0.2, seed=3)
    train, held = load_prompt_dataset(out), load_prompt_dataset(val)
    assert len(train) == 80 and len(held) == 20
    assert {r["prompt"] for r in train} | {r["prompt"] for r in held} == {f"{a}+{b}=" for a in range(10) for b in range(10)}
    again = arithmetic.write_arithmetic_dataset(tmp_path / "t2.jsonl", val_out=tmp_path / "v2.jsonl",
                                                val_fraction=0.2, seed=3)
    assert list(load_prompt_dataset(again[1])) == list(held)


def test_python_dash_m_entry(tmp_path):
    out = tmp_path / "arith.jsonl"
    done = subprocess.run([sys.executable, "-m", "hybridflow.data.tasks.arithmetic", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert len(load_prompt_dataset(out)) == 100
