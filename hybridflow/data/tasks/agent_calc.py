"""Sums of three two-digit numbers: a task a tiny model solves with a calculator and not in its head.

Prompts ``a+b+c=`` with ``a, b, c`` in ``10..99`` (``data_source`` ``"agent_calc"``, ground truth
the sum). With the ``calc`` environment the model may write ``[a+b+c]``, read ``{sum}`` and
answer; the rule reward of ``agent_calc`` is the arithmetic one (exactly the sum).

:func:`call_format_segments` makes the transcripts of the format warm-up: a correct call, the
calculator's real answer (an observation: not trained on) and a final answer that is always
wrong: the sum with its last digit one higher (:func:`off_by_one`). The warm-up teaches how to
call and where and in what shape to answer, and never a right answer: answering exactly what
the calculator said is left to RL. (A wrong answer drawn at random among all sums,
:func:`random_wrong_sum`, gives RL no signal: 1 right sample in ~270; one with a random last
digit leaves greedy accuracy at ~0.1 after the warm-up, the share of sums ending in the digit
the model prefers.)

Command line::

    python -m hybridflow.data.tasks.agent_calc --out data/train.jsonl [--count 2000] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

from ..datasets import write_prompt_dataset

__all__ = ["ALPHABET", "DATA_SOURCE", "make_sum3_rows", "off_by_one", "random_wrong_sum", "call_format_segments", "direct_answer_segments",
           "main"]

DATA_SOURCE = "agent_calc"
#: the prompts, calls, observations (results and error messages) and answers
ALPHABET = "0123456789+-*/=()[]{}:._,' abcdefghijklmnopqrstuvwxyz"


def make_sum3_rows(count: int, *, seed: int = 0, low: int = 10, high: int = 99) -> list[dict[str, Any]]:
    """``count`` distinct prompts ``a+b+c=`` drawn with ``random.Random(seed)``."""
    rng, seen, rows = random.Random(seed), set(), []
    while len(rows) < count:
        a, b, c = (rng.randint(low, high) for _ in range(3))
        if (a, b, c) in seen:
            continue
        seen.add((a, b, c))
        rows.append({"prompt": f"{a}+{b}+{c}=", "ground_truth": str(a + b + c), "data_source": DATA_SOURCE,
                     "extra_info": {"terms": [a, b, c]}})
    return rows


def off_by_one(row: dict, rng: random.Random) -> str:
    """The row's answer with its last digit one higher (9 -> 0): wrong, always, and in the answer's shape."""
    truth = row["ground_truth"]
    return truth[:-1] + str((int(truth[-1]) + 1) % 10)


def random_wrong_sum(row: dict, rng: random.Random) -> str:
    """A uniformly random sum of three two-digit numbers (30..297) that is not the row's answer."""
    truth = int(row["ground_truth"])
    value = truth
    while value == truth:
        value = rng.randint(30, 297)
    return str(value)


def call_format_segments(row: dict, rng: random.Random) -> list[tuple[str, bool]]:
    """``[(text, trained), ...]``: the call ``[a+b+c]``, the observation ``{sum}``, then a wrong final answer
    (:func:`off_by_one`)."""
    expression = row["prompt"].rstrip("=")
    return [(f"[{expression}]", True), ("{" + row["ground_truth"] + "}", False), (off_by_one(row, rng), True)]


def direct_answer_segments(row: dict, rng: random.Random) -> list[tuple[str, bool]]:
    """The no-tool baseline's warm-up: the same wrong final answer (:func:`off_by_one`) straight away."""
    return [(off_by_one(row, rng), True)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write sum-of-three prompts a+b+c= as jsonl or parquet.")
    parser.add_argument("--out", required=True, help="output file, .jsonl or .parquet")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"wrote {write_prompt_dataset(make_sum3_rows(args.count, seed=args.seed), args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
