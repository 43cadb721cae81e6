"""Decoding that hands back each prompt group as soon as all its ``n`` responses have ended.

:func:`decode_groups` runs the same loop as :func:`.decode.decode` — the same prefill, the same
stepper, the same sampler calls on the same generator in the same order — and so samples the
same tokens, bit for bit; it only *yields* earlier: after every step, the groups (the ``n``
consecutive rows of one prompt) whose rows have all reached EOS (or the pad token) go out as one
piece, and when the loop ends the groups still running go out together. A downstream consumer
(the plan interpreter's streamed region, :mod:`hybridflow.runtime.streaming`) can score and
infer those rows while the longer responses are still decoding, so a step with response lengths
between 1 and 64 tokens no longer waits for the 64-token ones before any scoring starts.

Rows that have ended stay in the decode batch, fed the pad token, as in :func:`.decode.decode`
(dropping them from the batch would shrink every later sampler call and so change the random
numbers the other rows draw: the rollouts would then depend on which rows finished when).
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch

from .decode import Decoded, PATHS, prefill
from .sampling import SamplingParams, choose_tokens, scaled_log_probs
from hybridflow.errors import ExecutionError

__all__ = ["decode_groups"]


@torch.no_grad()
def decode_groups(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                  params: SamplingParams, *, eos_token_ids: Sequence[int], pad_token_id: int,
                  generator: torch.Generator | None = None, path: str = "auto") -> Iterator[tuple[torch.Tensor, Decoded]]:
    """Yield ``(rows, decoded)`` pieces: ``rows`` int64 ``(k,)`` indexes the ``(b * n)`` response rows (whole
    groups, ascending), ``decoded`` holds those rows' :class:`Decoded` tensors ``(k, max_new_tokens)``.

    Every row is yielded exactly once; concatenating the pieces and putting the rows in order gives
    exactly :func:`.decode.decode`'s result for the same arguments and generator state.
    """
    if path not in PATHS:
        raise ExecutionError(f"decode_groups: path must be one of {PATHS}, got {path!r}")
    device, steps, n = prompt_ids.device, params.max_new_tokens, params.n
    logits, stepper = prefill(model, prompt_ids, prompt_mask, n, steps, path)
    b = logits.shape[0]
    stops = torch.tensor(sorted({*eos_token_ids, pad_token_id}), dtype=torch.long, device=device)
    tokens = torch.full((b, steps), pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros((b, steps), dtype=torch.float32, device=device)
    log_probs = torch.zeros((b, steps), dtype=torch.float32, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    sent = torch.zeros(b // n, dtype=torch.bool, device=device)

    def piece(groups: torch.Tensor) -> tuple[torch.Tensor, Decoded]:
        sent[groups] = True
        rows = (groups[:, None] * n + torch.arange(n, device=device)).reshape(-1)
        return rows.cpu(), Decoded(tokens[rows].cpu(), mask[rows].cpu(), log_probs[rows].cpu())

    for t in range(steps):
        step_log_probs = scaled_log_probs(logits, params.temperature)
        token = choose_tokens(step_log_probs, params, generator).masked_fill_(done, pad_token_id)
        alive = ~done
        mask[:, t] = alive
        log_probs[:, t] = step_log_probs.gather(-1, token[:, None]).squeeze(-1).masked_fill_(done, 0.0)
        tokens[:, t] = token
        if params.stop_at_eos:
            done = done | torch.isin(token, stops)
            alive = ~done
        if t == steps - 1 or not bool(alive.any()):
            break
        finished = done.view(-1, n).all(-1) & ~sent
        if bool(finished.any()):
            yield piece(finished.nonzero().squeeze(-1))
        logits = stepper.step(t, token, alive)
    rest = (~sent).nonzero().squeeze(-1)
    if rest.numel():
        yield piece(rest)
