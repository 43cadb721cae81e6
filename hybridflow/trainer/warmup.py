"""A short supervised warm-up: teach a response *format* before RL does the learning.

A random tiny model does not yet end its answers with EOS, so RL would first spend its
budget discovering the shape of an answer. :func:`supervised_warmup` runs a few
``nll`` steps on (prompt, response) pairs that a function makes up. For the arithmetic
task, :func:`hybridflow.data.tasks.arithmetic.random_wrong_answer` makes responses that
have the right shape and are never correct, so the warm-up teaches the format and
nothing of the answers: RL alone must find those.
"""
from __future__ import annotations

import random
from typing import Callable, Sequence

import torch

from ..batch import Batch
from ..runtime.engines import TrainEngine, TrainEngineConfig

__all__ = ["supervised_warmup", "turns_warmup"]


def _responses(tokenizer, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``response_ids`` (each text + EOS) and their float mask."""
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    width = max(len(ids) for ids in encoded)
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.float32)
    for i, row in enumerate(encoded):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1.0
    return ids, mask


def supervised_warmup(model: torch.nn.Module, tokenizer, rows: Sequence[dict],
                      make_response: Callable[[dict, random.Random], str], *, steps: int, batch_size: int = 64,
                      lr: float = 3e-3, seed: int = 0, num_threads: int | None = None) -> list[float]:
    """``steps`` AdamW steps of token-mean NLL on ``(row["prompt"], make_response(row, rng))``; returns the losses."""
    return _nll_steps(model, tokenizer, rows, lambda picks, rng: _responses(tokenizer, [make_response(r, rng) for r in picks]),
                      steps=steps, batch_size=batch_size, lr=lr, seed=seed, num_threads=num_threads)


def _nll_steps(model: torch.nn.Module, tokenizer, rows: Sequence[dict],
               responses: Callable[[list[dict], random.Random], tuple[torch.Tensor, torch.Tensor]], *, steps: int,
               batch_size: int, lr: float, seed: int, num_threads: int | None) -> list[float]:
    """The warm-ups' loop: each step draws ``batch_size`` rows, gets ``(response_ids, response_mask)`` of them from
    ``responses(picks, rng)`` and takes one AdamW step of token-mean NLL on the masked tokens; returns the losses."""
    from ..data import make_prompt_batch

    engine = TrainEngine(model, TrainEngineConfig(lr=lr, weight_decay=0.0, entropy_metric=False, num_threads=num_threads),
                         metric_prefix="warmup")
    rng = random.Random(seed)
    losses = []
    for _ in range(steps):
        picks = [rows[rng.randrange(len(rows))] for _ in range(batch_size)]
        prompts: Batch = make_prompt_batch(picks, tokenizer)
        response_ids, response_mask = responses(picks, rng)
        batch = prompts.with_fields(response_ids=response_ids, response_mask=response_mask)
        losses.append(engine.update(batch, [("nll", 1.0, {})])["warmup/sft_loss"])
    return losses


def _segment_responses(tokenizer, transcripts: Sequence[Sequence[tuple[str, bool]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``response_ids`` of each transcript's segments (+ EOS) and a mask of its trained segments.

    Each segment is tokenised on its own and appended, as the agent loop appends turns and observations.
    """
    rows, masks = [], []
    for segments in transcripts:
        ids: list[int] = []
        mask: list[float] = []
        for text, trained in segments:
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            mask += [1.0 if trained else 0.0] * len(piece)
        rows.append(ids + [tokenizer.eos_token_id])
        masks.append(mask + [1.0])
    width = max(len(r) for r in rows)
    out_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    out_mask = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (row, mask) in enumerate(zip(rows, masks)):
        out_ids[i, :len(row)] = torch.tensor(row)
        out_mask[i, :len(mask)] = torch.tensor(mask)
    return out_ids, out_mask


def turns_warmup(model: torch.nn.Module, tokenizer, rows: Sequence[dict],
                 make_segments: Callable[[dict, random.Random], Sequence[tuple[str, bool]]], *, steps: int,
                 batch_size: int = 64, lr: float = 3e-3, seed: int = 0, num_threads: int | None = None) -> list[float]:
    """:func:`supervised_warmup` over multi-turn transcripts: ``make_segments(row, rng)`` gives ``(text, trained)``
    segments (model turns trained, observations only read: mask 0), the last followed by EOS; returns the losses."""
    return _nll_steps(model, tokenizer, rows,
                      lambda picks, rng: _segment_responses(tokenizer, [make_segments(r, rng) for r in picks]),
                      steps=steps, batch_size=batch_size, lr=lr, seed=seed, num_threads=num_threads)
