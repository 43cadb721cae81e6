"""Arithmetic prompts ``a+b=`` whose ground truth is the result as a string.

By default: all 100 prompts ``a+b=`` with ``a, b`` in ``0..9`` (sums of one and
two digits), ``data_source`` ``"arithmetic"``, ``extra_info``
``{"a": a, "b": b, "op": "+"}``. Other ranges and the operators ``- * /``
are options; ``/`` keeps only exact integer divisions (no division by zero).

Command line::

    python -m hybridflow.data.tasks.arithmetic --out data/train.jsonl \\
        [--val-out data/val.jsonl --val-fraction 0.2] [--min 0 --max 9] [--operators +-] [--seed 0]
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..datasets import train_val_split, write_prompt_dataset

__all__ = ["ALPHABET", "DATA_SOURCE", "OPERATORS", "make_arithmetic_rows", "write_arithmetic_dataset", "main", "random_wrong_answer"]

DATA_SOURCE = "arithmetic"
#: every character an arithmetic prompt or answer uses
ALPHABET = "0123456789+-*/=() "
#: operator -> exact integer result, or None where the pair has no integer result
OPERATORS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a // b if b != 0 and a % b == 0 else None,
}


def make_arithmetic_rows(
    *, a_range: tuple[int, int] = (0, 9), b_range: tuple[int, int] | None = None, operators: Sequence[str] = ("+",)
) -> list[dict[str, Any]]:
    """Every prompt ``f"{a}{op}{b}="`` for ``a`` in ``a_range``, ``b`` in ``b_range`` (inclusive), each operator.

    ``b_range`` defaults to ``a_range``. Rows come in a fixed order: by operator, then ``a``, then ``b``.
    """
    b_range = b_range or a_range
    for op in operators:
        if op not in OPERATORS:
            raise ConfigError(f"arithmetic: unknown operator {op!r}; choose from {sorted(OPERATORS)}.")
    for name, (lo, hi) in (("a_range", a_range), ("b_range", b_range)):
        if lo > hi or lo < 0:
            raise ConfigError(f"arithmetic: {name} must be (lo, hi) with 0 <= lo <= hi, got {(lo, hi)}.")
    rows = []
    for op in operators:
        for a in range(a_range[0], a_range[1] + 1):
            for b in range(b_range[0], b_range[1] + 1):
                result = OPERATORS[op](a, b)
                if result is None:
                    continue
                rows.append({
                    "prompt": f"{a}{op}{b}=",
                    "ground_truth": str(result),
                    "data_source": DATA_SOURCE,
                    "extra_info": {"a": a, "b": b, "op": op},
                })
    return rows


def write_arithmetic_dataset(
    out: str | Path,
    *,
    val_out: str | Path | None = None,
    val_fraction: float = 0.0,
    seed: int = 0,
    **row_options,
) -> tuple[Path, Path | None]:
    """Write :func:`make_arithmetic_rows` to ``out`` (jsonl or parquet by suffix).

    With ``val_out`` and ``val_fraction`` > 0, a seeded share of the rows goes to
    ``val_out`` instead. Returns ``(out, val_out)``.
    """
    rows = make_arithmetic_rows(**row_options)
    if val_out is None:
        return write_prompt_dataset(rows, out), None
    train, val = train_val_split(rows, val_fraction, seed=seed)
    return write_prompt_dataset(train, out), write_prompt_dataset(val, val_out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write arithmetic prompts a<op>b= as jsonl or parquet.")
    parser.add_argument("--out", required=True, help="output file, .jsonl or .parquet")
    parser.add_argument("--val-out", default=None, help="optional validation file")
    parser.add_argument("--val-fraction", type=float, default=0.0, help="share of rows for --val-out")
    parser.add_argument("--min", type=int, default=0, help="smallest operand")
    parser.add_argument("--max", type=int, default=9, help="largest operand")
    parser.add_argument("--operators", default="+", help="operators to use, e.g. '+-*/'")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    args = parser.parse_args(argv)
    out, val = write_arithmetic_dataset(
        args.out, val_out=args.val_out, val_fraction=args.val_fraction, seed=args.seed,
        a_range=(args.min, args.max), operators=tuple(args.operators),
    )
    print(f"wrote {out}" + (f" and {val}" if val else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def random_wrong_answer(row: dict, rng, *, max_answer: int = 18) -> str:
    """A uniformly random integer in 0..max_answer that is *not* the row's answer, as text.

    The format warm-up of the arithmetic example trains on these: they have the shape of
    an answer (one or two digits) and are never correct, so they teach the format only.
    """
    truth = row["ground_truth"]
    choices = [str(v) for v in range(max_answer + 1) if str(v) != str(truth)]
    return choices[rng.randrange(len(choices))]
