"""Countdown generator: every target is reachable, checked by an independent brute force."""
from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.data.tasks import countdown


def brute_force(numbers: list[int]) -> set[Fraction]:
    """Values of all expressions using every number once: repeatedly replace an ordered pair by a op b.

    (The generator instead splits the numbers into two groups; the two searches share no code.)
    """
    found: set[Fraction] = set()

    def walk(values: list[Fraction]) -> None:
        if len(values) == 1:
            found.add(values[0])
            return
        for i, a in enumerate(values):
            for j, b in enumerate(values):
                if i == j:
                    continue
                rest = [v for k, v in enumerate(values) if k not in (i, j)]
                for c in (a + b, a - b, a * b) + ((a / b,) if b != 0 else ()):
                    walk(rest + [c])

    walk([Fraction(n) for n in numbers])
    return found


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expr: str) -> Fraction:
    """Exact value of an expression of integers, + - * / and parentheses."""
    def ev(node):
        if isinstance(node, ast.BinOp):
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        return Fraction(node.value)
    return ev(ast.parse(expr, mode="eval").body)


def test_small_cases_by_hand():
    # 2 and 3 with all of + - * / : 5, -1, 1, 6, 2/3, 3/2
    assert countdown.reachable_values([2, 3]) == {Fraction(v) for v in (5, -1, 1, 6)} | {Fraction(2, 3), Fraction(3, 2)}
    assert countdown.solve([1, 1], 100) is None
    assert evaluate(countdown.solve([3, 3, 8, 8], 24)) == 24  # 8/(3-8/3): needs fractions on the way


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=2, max_size=4))
def test_reachable_values_equal_the_brute_force(numbers):
    assert countdown.reachable_values(numbers) == brute_force(numbers)


def test_generated_targets_are_reachable_and_solutions_are_valid():
    rows = countdown.make_countdown_rows(40, num_numbers=3, seed=5)
    assert len(rows) == 40
    for row in rows:
        gt = row["ground_truth"]
        assert row["data_source"] == "countdown" and set(gt) == {"target", "numbers"}
        assert 1 <= gt["target"] <= 100 and all(1 <= n <= 20 for n in gt["numbers"]) and len(gt["numbers"]) == 3
        assert Fraction(gt["target"]) in brute_force(gt["numbers"])
        solution = row["extra_info"]["solution"]
        assert evaluate(solution) == gt["target"]
        assert sorted(int(n) for n in re.findall(r"\d+", solution)) == sorted(gt["numbers"])
        assert str(gt["numbers"]) in row["prompt"] and f"equals {gt['target']}." in row["prompt"]


def test_generator_is_deterministic_for_a_seed(tmp_path):
    assert countdown.make_countdown_rows(10, seed=1) == countdown.make_countdown_rows(10, seed=1)
    assert countdown.make_countdown_rows(10, seed=1) != countdown.make_countdown_rows(10, seed=2)
    out, val = countdown.write_countdown_dataset(tmp_path / "c.jsonl", 10, val_out=tmp_path / "v.jsonl",
                                                 val_fraction=0.3, seed=1)
    assert len(out.read_text().splitlines()) == 7 and len(val.read_text().splitlines()) == 3


def test_command_line_entry(tmp_path):
    assert countdown.main(["--out", str(tmp_path / "c.parquet"), "--count", "4", "--numbers", "4"]) == 0
    from hybridflow.data import load_prompt_dataset

    rows = load_prompt_dataset(tmp_path / "c.parquet")
    assert len(rows) == 4 and all(len(r["ground_truth"]["numbers"]) == 4 for r in rows)
