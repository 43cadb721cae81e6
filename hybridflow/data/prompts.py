"""Turning prompt rows into a generation-ready :class:`~hybridflow.runtime.Batch`.

Prompts are tokenised one by one and **left**-padded, so that every prompt ends
in the last column and generation appends to the right for all rows at once::

    prompt_ids  [B, P] int64    <pad> <pad> <bos> 3 + 4 =
    prompt_mask [B, P] int64      0     0     1   1 1 1 1
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import DataError
from ..batch import Batch

__all__ = ["prompt_text", "tokenize_prompts", "make_prompt_batch"]


def prompt_text(tokenizer, prompt: str | Sequence[Mapping[str, str]], *, apply_chat_template: bool = False) -> str:
    """The text the model sees for one prompt.

    A string is used as it is, or, with ``apply_chat_template``, as a single user
    message. A list of chat messages always goes through the tokenizer's chat
    template with the generation prompt added.
    """
    if isinstance(prompt, str) and not apply_chat_template:
        return prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError(
            "prompt is a list of chat messages (or apply_chat_template=True) but the tokenizer has no chat "
            "template; give plain-text prompts or a tokenizer with a chat_template."
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def tokenize_prompts(
    tokenizer,
    prompts: Sequence[str | Sequence[Mapping[str, str]]],
    *,
    max_prompt_length: int | None = None,
    apply_chat_template: bool = False,
    truncate: bool = False,
    cache: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(prompt_ids, prompt_mask)``, both int64 ``[B, P]`` with ``P`` the longest prompt.

    Plain prompts get the tokenizer's special tokens (e.g. ``<bos>``); chat-template text
    is encoded as it is, since the template writes its own. A prompt longer than
    ``max_prompt_length`` raises :class:`DataError`, or with ``truncate=True`` keeps its
    last ``max_prompt_length`` tokens. ``cache`` (a dict kept by the caller, for one
    tokenizer) holds each prompt's token ids, so that a dataset seen epoch after epoch is
    tokenised once.
    """
    if tokenizer.pad_token_id is None:
        raise DataError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to its eos token).")
    encoded: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        key = (prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True), apply_chat_template)
        ids = cache.get(key) if cache is not None else None
        if ids is None:
            templated = apply_chat_template or not isinstance(prompt, str)
            text = prompt_text(tokenizer, prompt, apply_chat_template=apply_chat_template)
            ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
            if cache is not None:
                cache[key] = ids
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            if not truncate:
                raise DataError(f"prompt {i} is {len(ids)} tokens, longer than max_prompt_length={max_prompt_length}; "
                                "raise max_prompt_length (a config field) or shorten the prompt (from Python, "
                                "make_prompt_batch(..., truncate=True) keeps the prompt's end).")
            ids = ids[-max_prompt_length:]
        encoded.append(ids)
    width = max((len(ids) for ids in encoded), default=0)
    prompt_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.int64)
    prompt_mask = torch.zeros((len(encoded), width), dtype=torch.int64)
    for row, ids in enumerate(encoded):
        if ids:
            prompt_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.int64)
            prompt_mask[row, width - len(ids):] = 1
    return prompt_ids, prompt_mask


def make_prompt_batch(
    rows: Sequence[Mapping[str, Any]],
    tokenizer,
    *,
    max_prompt_length: int | None = None,
    apply_chat_template: bool = False,
    truncate: bool = False,
    meta: Mapping[str, Any] | None = None,
    cache: dict | None = None,
) -> Batch:
    """A Batch of ``prompt_ids``/``prompt_mask`` tensors and the rows' ``prompt``, ``ground_truth``,
    ``data_source``, ``extra_info`` columns, ready for the rollout engine (``cache``: see :func:`tokenize_prompts`)."""
    for i, row in enumerate(rows):
        for column in ("prompt", "ground_truth", "data_source"):
            if column not in row:
                raise DataError(f"row {i} has no column {column!r}; columns found: {sorted(row)}.")
    prompt_ids, prompt_mask = tokenize_prompts(
        tokenizer, [row["prompt"] for row in rows], max_prompt_length=max_prompt_length,
        apply_chat_template=apply_chat_template, truncate=truncate, cache=cache,
    )
    columns = {
        "prompt": [row["prompt"] for row in rows],
        "ground_truth": [row["ground_truth"] for row in rows],
        "data_source": [row["data_source"] for row in rows],
        "extra_info": [row.get("extra_info") or {} for row in rows],
    }
    return Batch({"prompt_ids": prompt_ids, "prompt_mask": prompt_mask}, columns, meta, batch_size=len(rows))
