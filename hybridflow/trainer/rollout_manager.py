"""RolloutManager: text in, text out generation with a causal LM, outside of training.

Built on the rollout engine the trainers use (:class:`~hybridflow.runtime.engines.HFRolloutEngine`,
KV-cached sampling with :class:`~hybridflow.runtime.engines.SamplingParams`)::

    from hybridflow import RolloutManager
    rm = RolloutManager.from_pretrained("./my-model", max_new_tokens=32, temperature=0.7, seed=0)
    rm.generate(["3+4=", "12+5="])            # ['7', '17']  (one text per prompt)
    rm.generate(["3+4="], n=4)                # [['7', '7', '8', '7']]  (n texts per prompt)

Prompts are plain strings (or chat message lists, through the tokenizer's chat template);
texts are the decoded responses without their final EOS.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch

from ..runtime.engines import HFRolloutEngine, SamplingParams

__all__ = ["RolloutManager"]

Prompt = "str | Sequence[Mapping[str, str]]"


class RolloutManager:
    """Generates responses for prompts with ``model`` and ``tokenizer`` as ``sampling`` says.

    Args:
        model: a transformers ``*ForCausalLM`` module.
        tokenizer: its tokenizer (encodes prompts, decodes responses).
        sampling: default sampling settings (:class:`SamplingParams`).
        device: where to generate (default: where the model is).
        micro_batch_size: responses decoded at once (None: all).
    """

    def __init__(self, model: torch.nn.Module, tokenizer, sampling: SamplingParams | None = None, *,
                 device: str | torch.device | None = None, micro_batch_size: int | None = None):
        self.tokenizer = tokenizer
        self.engine = HFRolloutEngine(model, tokenizer=tokenizer, sampling=sampling or SamplingParams(), device=device,
                                      micro_batch_size=micro_batch_size)

    @classmethod
    def from_pretrained(cls, path_or_name: str | os.PathLike, *, device: str | None = None, dtype: Any = None,
                        **sampling: Any) -> "RolloutManager":
        """Load a model folder or hub name; ``sampling`` keywords are :class:`SamplingParams` fields."""
        from ..data import load_causal_lm, load_tokenizer

        model = load_causal_lm(path_or_name, dtype=dtype, device=device)
        return cls(model, load_tokenizer(path_or_name), SamplingParams(**sampling), device=device)

    @property
    def sampling(self) -> SamplingParams:
        return self.engine.sampling

    @torch.no_grad()
    def generate(self, prompts: Sequence[Prompt], *, apply_chat_template: bool = False,
                 **sampling: Any) -> list[str] | list[list[str]]:
        """One response text per prompt, or a list of ``n`` per prompt when ``n`` > 1.

        ``sampling`` keywords override the defaults for this call (``n=4``, ``greedy=True``, ...).
        """
        from ..data import make_prompt_batch

        params = self.sampling.model_copy(update=sampling) if sampling else self.sampling
        params = SamplingParams.model_validate(params.model_dump())
        rows = [{"prompt": p, "ground_truth": None, "data_source": "rollout_manager"} for p in prompts]
        batch = make_prompt_batch(rows, self.tokenizer, apply_chat_template=apply_chat_template)
        texts = list(self.engine.generate(batch, params)["responses"])
        if params.n == 1:
            return texts
        return [texts[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]
