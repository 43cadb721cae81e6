"""Partial rollouts on the engine side: a generation decoded in segments, continued under newer weights.

A rollout engine asked for ``segment_tokens=S`` decodes at most ``S`` positions of every response
and returns the batch in the rollout contract (right-padded to ``R = max_new_tokens``) with two
fields more, the *partial state*:

- ``decoded_steps`` int64[B]: positions decoded so far (the cut),
- ``rollout_finished`` bool[B]: the row ended (a stop token) or reached ``R``.

``generate(partial, resume=True)`` continues the rows that are not finished for at most ``S``
positions more (all of what is left when ``S`` is None) and writes what it decodes after the cut;
kept tokens and their log-probs are never touched. With the weights unchanged since the cut, the
engine goes on from the KV cache it kept (found by :func:`piece_key`): the continuation is the uncut
decoding, to the bit. After a weight load (which drops the kept caches) the prompt becomes the
prompt followed by the response tokens kept so far and the prefill recomputes the KV cache under
the new weights. This is AReaL's interruptible generation (Fu et al. 2025, "AReaL: A Large-Scale
Asynchronous Reinforcement Learning System for Language Reasoning", Sec. 4.1: in-flight requests are
interrupted at a weight update, their KV caches recomputed under the new weights, and decoding goes
on), at the granularity of a segment rather than a token.

Every generate output carries ``policy_version`` int64[B, R]: the engine's
:attr:`policy_version` (the trained policy's step count its weights come from, set by each weight sync) when each token was decoded, -1 at padding; the tokens of
a continued row switch version exactly at the cut.

The functions here are pure tensor bookkeeping; the engines (:mod:`.rollout_hf`, :mod:`.vllm_segments`) decode.
"""
from __future__ import annotations

import hashlib

import torch

from hybridflow.errors import ExecutionError

from ...batch import Batch

__all__ = ["PARTIAL_FIELDS", "RESUME_FIELDS", "stamp_versions", "resume_prompt", "piece_cut", "piece_key",
           "check_resumable"]

PARTIAL_FIELDS = ("decoded_steps", "rollout_finished")
"""The partial state a segment adds to the rollout (module docstring)."""

RESUME_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "rollout_log_probs", "policy_version",
                 *PARTIAL_FIELDS)
"""What ``generate(..., resume=True)`` reads from its batch."""


def stamp_versions(mask: torch.Tensor, version: int) -> torch.Tensor:
    """``version`` where ``mask`` is 1, -1 elsewhere.

    Shapes: mask ``(b, r)`` float -> ``(b, r)`` int64.
    """
    return torch.where(mask > 0, torch.full_like(mask, version, dtype=torch.int64),
                       torch.full_like(mask, -1, dtype=torch.int64))


def check_resumable(batch: Batch) -> None:
    """An ExecutionError naming what is missing when ``batch`` is no partial rollout."""
    missing = [name for name in RESUME_FIELDS if name not in batch]
    if missing:
        raise ExecutionError(f"generate(resume=True) continues a partial rollout, the output of generate(..., "
                             f"segment_tokens=S); the batch lacks {missing} (it has {batch.keys()})")


def piece_cut(piece: Batch) -> int | None:
    """The cut of a piece's unfinished rows (they were decoded together, so they share it); None when all finished."""
    unfinished = ~piece["rollout_finished"].bool()
    if not bool(unfinished.any()):
        return None
    cuts = piece["decoded_steps"][unfinished].unique()
    if len(cuts) != 1:
        raise ExecutionError(f"generate(resume=True): the unfinished rows of one piece were cut at different positions "
                             f"{cuts.tolist()}; resume a partial rollout with the micro_batch_size and n it was made with")
    return int(cuts[0])


def resume_prompt(piece: Batch, cut: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt a continued segment is decoded after: the prompt, then the first ``cut`` response positions.

    Shapes: prompt_ids / prompt_mask ``(b, P)``, response_ids / response_mask ``(b, R)`` ->
    ids, mask ``(b, P + cut)`` int64. Positions after a finished row's end are masked out (the row is
    not decoded further), so the position ids ``cumsum(mask) - 1`` of the unfinished rows are the ones
    the uncut decoding gave them.
    """
    ids = torch.cat([piece["prompt_ids"].long(), piece["response_ids"][:, :cut].long()], dim=-1)
    mask = torch.cat([piece["prompt_mask"].long(), piece["response_mask"][:, :cut].long()], dim=-1)
    return ids, mask


def piece_key(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor, cut: int) -> str:
    """A digest of a cut piece: its prompts and the tokens before the cut (by which an engine finds the KV cache
    it kept for the piece: a continuation with unchanged weights then decodes as if it had never been cut).

    Shapes: prompt_ids / prompt_mask ``(b, P)``, response_ids ``(b, R)``.
    """
    digest = hashlib.sha256(str(cut).encode())
    for tensor in (prompt_ids, prompt_mask, response_ids[:, :cut]):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()
