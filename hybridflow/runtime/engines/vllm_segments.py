"""Partial rollouts on the vLLM rollout engine (:mod:`.segments`): the part of :class:`~.rollout_vllm.VLLMRolloutEngine`
that continues a cut generation.

vLLM's offline ``LLM.generate`` runs whole requests, so a segment is a request whose ``max_tokens`` is the
segment's length, and a continuation resubmits each unfinished row as a new request whose prompt is its
prompt followed by the tokens kept so far: vLLM recomputes their KV cache (its prefix cache may find it)
with the weights it holds now. This is slime's abort-and-resubmit at segment boundaries. Unlike the HF
engine, a continuation is not the uncut sampling to the bit (each request draws from a seed of its own).
"""
from __future__ import annotations

from typing import Mapping

import torch

from hybridflow.errors import ExecutionError

from ...batch import Batch
from .sampling import SamplingParams
from .segments import stamp_versions
from .text import decode_responses

__all__ = ["VLLMSegments"]


class VLLMSegments:
    """Continuing a partial rollout (a base of VLLMRolloutEngine, whose generation and weights it uses)."""

    def _ended(self, fields: Mapping[str, torch.Tensor], decoded: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """Rows whose response ended (shorter than decoded, or its last token a stop token) or reached the limit."""
        lengths = fields["response_mask"].sum(-1).long()
        last = fields["response_ids"].gather(-1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
        stops = torch.tensor(sorted({*self.eos_token_ids, self.pad_token_id}))
        stopped = (lengths < decoded) | (torch.isin(last, stops) if params.stop_at_eos else torch.zeros_like(last).bool())
        return stopped | (decoded >= params.max_new_tokens)

    def _continue(self, batch: Batch, prompts: list[list[int]], params: SamplingParams, segment: int | None) -> Batch:
        """The unfinished rows of a partial rollout, one request each, written after their cut (:mod:`.segments`)."""
        width = params.max_new_tokens
        if batch["response_ids"].shape[1] != width:
            raise ExecutionError(f"generate(resume=True): the partial responses are {batch['response_ids'].shape[1]} "
                                 f"positions wide but max_new_tokens is {width}; resume with the sampling they were made with")
        kept = {name: batch[name].clone() for name in ("response_ids", "response_mask", "rollout_log_probs",
                                                       "policy_version", "decoded_steps")}
        rows = [i for i in range(len(batch)) if not bool(batch["rollout_finished"][i])]
        call = self._next_call(params.seed)
        requests, sampling_list, budgets = [], [], []
        for i in rows:
            cut = int(kept["decoded_steps"][i])
            budgets.append(min(segment or width - cut, width - cut))
            requests.append({"prompt_token_ids": prompts[i] + kept["response_ids"][i, :cut].tolist()})
            sampling_list.append(self._seeded_request(params, budgets[-1], call, i))
        outputs = self.llm.generate(requests, sampling_list, use_tqdm=False, lora_request=self._lora_request) if rows else []
        part = self._fields([o.outputs[0] for o in outputs], params)
        for k, (i, budget) in enumerate(zip(rows, budgets)):
            cut = int(kept["decoded_steps"][i])
            span = slice(cut, cut + budget)
            kept["response_ids"][i, span] = part["response_ids"][k, :budget]
            kept["response_mask"][i, span] = part["response_mask"][k, :budget]
            kept["rollout_log_probs"][i, span] = part["rollout_log_probs"][k, :budget]
            kept["policy_version"][i, span] = stamp_versions(part["response_mask"][k, :budget], self.policy_version)
            kept["decoded_steps"][i] = cut + budget
        finished = batch["rollout_finished"].clone()
        if rows:
            done = {"response_ids": kept["response_ids"][rows], "response_mask": kept["response_mask"][rows]}
            finished[rows] = self._ended(done, kept["decoded_steps"][rows], params)
        kept["rollout_finished"] = finished
        if self.tokenizer is not None:
            kept["responses"] = decode_responses(self.tokenizer, kept["response_ids"], kept["response_mask"],
                                                 self.eos_token_ids)
        return batch.with_fields(**kept)
