"""Countdown prompts: reach a target by combining every given number exactly once.

Each problem draws ``num_numbers`` numbers, computes every value an expression
using all of them once with ``+ - * /`` and parentheses can take (exact
fractions, so ``(3/4)*8`` counts), and picks the target among the reachable
integers in ``target_range``. A row's ground truth is ``{"target": t, "numbers": [...]}``,
its ``data_source`` is ``"countdown"``, and ``extra_info`` holds one solution.

Command line::

    python -m hybridflow.data.tasks.countdown --out data/countdown.jsonl --count 1000 [--numbers 3] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
import string
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..datasets import train_val_split, write_prompt_dataset

__all__ = [
    "ALPHABET", "DATA_SOURCE", "reachable_values", "solve", "format_prompt",
    "make_countdown_rows", "write_countdown_dataset", "main",
]

DATA_SOURCE = "countdown"
#: printable ASCII without tabs and form feeds: prompts are English sentences
ALPHABET = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")


@lru_cache(maxsize=4096)
def _expressions(numbers: tuple[int, ...]) -> dict[Fraction, str]:
    """Every value reachable with all of ``numbers`` once -> one expression for it.

    The numbers are split every way into two non-empty groups; each group's
    values are combined with the six binary operations (both orders for - and /).
    """
    if len(numbers) == 1:
        return {Fraction(numbers[0]): str(numbers[0])}
    out: dict[Fraction, str] = {}
    n = len(numbers)
    for mask in range(1, 2 ** (n - 1)):  # mask < 2^(n-1): the last number is always on the right
        left = tuple(x for i, x in enumerate(numbers) if mask >> i & 1)
        right = tuple(x for i, x in enumerate(numbers) if not mask >> i & 1)
        for lv, left_expr in _expressions(left).items():
            for rv, right_expr in _expressions(right).items():
                _combine(out, lv, left_expr, rv, right_expr)
    return out


def _combine(out: dict[Fraction, str], lv: Fraction, left_expr: str, rv: Fraction, right_expr: str) -> None:
    candidates = [(lv + rv, f"({left_expr}+{right_expr})"), (lv * rv, f"({left_expr}*{right_expr})"),
                  (lv - rv, f"({left_expr}-{right_expr})"), (rv - lv, f"({right_expr}-{left_expr})")]
    if rv != 0:
        candidates.append((lv / rv, f"({left_expr}/{right_expr})"))
    if lv != 0:
        candidates.append((rv / lv, f"({right_expr}/{left_expr})"))
    for value, expr in candidates:
        out.setdefault(value, expr)


def reachable_values(numbers: Sequence[int]) -> set[Fraction]:
    """All exact values of expressions that use every one of ``numbers`` exactly once."""
    return set(_expressions(tuple(sorted(numbers))))


def solve(numbers: Sequence[int], target: int) -> str | None:
    """One expression over all of ``numbers`` (each once) equal to ``target``, or None."""
    expr = _expressions(tuple(sorted(numbers))).get(Fraction(target))
    return expr[1:-1] if expr and expr.startswith("(") else expr


def format_prompt(numbers: Sequence[int], target: int) -> str:
    """The task in words, ending where the model's answer begins."""
    return (
        f"Using the numbers {list(numbers)}, write an equation that equals {target}. "
        "Use + - * / and parentheses, and each number exactly once. Equation:"
    )


def make_countdown_rows(
    count: int, *, num_numbers: int = 3, number_range: tuple[int, int] = (1, 20),
    target_range: tuple[int, int] = (1, 100), seed: int = 0,
) -> list[dict[str, Any]]:
    """``count`` problems, each with a target reachable from its numbers; deterministic for ``seed``."""
    if num_numbers < 2 or count < 0:
        raise ConfigError(f"countdown: need num_numbers >= 2 and count >= 0, got {num_numbers}, {count}.")
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for _attempt in range(100 * count + 100):
        if len(rows) == count:
            return rows
        numbers = [rng.randint(*number_range) for _ in range(num_numbers)]
        targets = sorted(int(v) for v in reachable_values(numbers)
                         if v.denominator == 1 and target_range[0] <= v <= target_range[1])
        if not targets:
            continue
        target = rng.choice(targets)
        rows.append({
            "prompt": format_prompt(numbers, target),
            "ground_truth": {"target": target, "numbers": numbers},
            "data_source": DATA_SOURCE,
            "extra_info": {"solution": solve(numbers, target)},
        })
    raise ConfigError(
        f"countdown: could not make {count} problems with numbers in {number_range} and targets in {target_range}; "
        "widen the ranges."
    )


def write_countdown_dataset(
    out: str | Path, count: int, *, val_out: str | Path | None = None, val_fraction: float = 0.0,
    seed: int = 0, **row_options,
) -> tuple[Path, Path | None]:
    """Write :func:`make_countdown_rows` to ``out`` (and a seeded share to ``val_out``)."""
    rows = make_countdown_rows(count, seed=seed, **row_options)
    if val_out is None:
        return write_prompt_dataset(rows, out), None
    train, val = train_val_split(rows, val_fraction, seed=seed)
    return write_prompt_dataset(train, out), write_prompt_dataset(val, val_out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write countdown problems as jsonl or parquet.")
    parser.add_argument("--out", required=True, help="output file, .jsonl or .parquet")
    parser.add_argument("--count", type=int, default=1000, help="number of problems")
    parser.add_argument("--numbers", type=int, default=3, help="numbers per problem")
    parser.add_argument("--max-number", type=int, default=20, help="largest number drawn (smallest is 1)")
    parser.add_argument("--max-target", type=int, default=100, help="largest target (smallest is 1)")
    parser.add_argument("--val-out", default=None, help="optional validation file")
    parser.add_argument("--val-fraction", type=float, default=0.0, help="share of rows for --val-out")
    parser.add_argument("--seed", type=int, default=0, help="seed of the problems and the split")
    args = parser.parse_args(argv)
    out, val = write_countdown_dataset(
        args.out, args.count, val_out=args.val_out, val_fraction=args.val_fraction, seed=args.seed,
        num_numbers=args.numbers, number_range=(1, args.max_number), target_range=(1, args.max_target),
    )
    print(f"wrote {out}" + (f" and {val}" if val else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
