"""A reward model in inference: a sequence-classification transformer with one output.

``score = head(h_last)``, where ``h_last`` is the backbone's hidden state at the
last real token of prompt + response (the response's last valid token, EOS
included; the prompt's last token for an empty response), as in the reward
models of InstructGPT (Ouyang et al. 2022, Sec. 3.5).

Loading a causal-LM checkpoint as ``AutoModelForSequenceClassification`` keeps
its backbone and creates a new, randomly initialised score head; transformers
reports it in its load report and :meth:`RewardModel.from_pretrained` adds a
``UserWarning`` naming the new weights, because such a model's scores mean
nothing until it is trained.
"""
from __future__ import annotations

import logging
import os
import warnings

import torch

from hybridflow.errors import ModelLoadError

from .rule_reward import RewardOutput
from .sequence import position_ids_from_mask, response_attention
from .text import response_lengths

__all__ = ["RewardModel"]

logger = logging.getLogger(__name__)


class RewardModel:
    """Scores prompt + response pairs with a ``*ForSequenceClassification`` model (``num_labels=1``).

    The model must share the actor's tokenizer (the scores are read from the
    actor's token ids). Args: ``model``; ``device`` (default: where its
    parameters are); ``micro_batch_size`` samples per forward (None = all).
    """

    def __init__(self, model: torch.nn.Module, *, device: str | torch.device | None = None,
                 micro_batch_size: int | None = None):
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(self.device).eval()
        self.micro_batch_size = micro_batch_size
        head = getattr(model, "score", None)
        if not isinstance(head, torch.nn.Linear) or not hasattr(model, "base_model"):
            raise ModelLoadError(f"{type(model).__name__} has no linear 'score' head on a base model; the reward "
                                 "model must be a decoder *ForSequenceClassification (Llama, Qwen2, Mistral, ...)")
        if head.out_features != 1:
            raise ModelLoadError(f"the reward model's score head has {head.out_features} outputs; load it with num_labels=1")

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, *, device: str | torch.device | None = None,
                        micro_batch_size: int | None = None, **kwargs) -> "RewardModel":
        """Load ``AutoModelForSequenceClassification`` with ``num_labels=1``; warn when the score head is new."""
        from transformers import AutoModelForSequenceClassification

        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                name_or_path, num_labels=1, output_loading_info=True, **kwargs)
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"cannot load reward model {str(name_or_path)!r} as sequence classification: {err}") from err
        new = sorted(k for k in info.get("missing_keys", ()) if k.split(".")[0] in ("score", "classifier"))
        if new:
            message = (f"reward model {str(name_or_path)!r} has no trained score head; newly initialised weights: "
                       f"{new}. Its scores are random until the head is trained (was a causal-LM checkpoint given?)")
            logger.warning(message)
            warnings.warn(message, UserWarning, stacklevel=2)
        return cls(model, device=device, micro_batch_size=micro_batch_size)

    @torch.no_grad()
    def sequence_scores(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                        response_mask: torch.Tensor) -> torch.Tensor:
        """Score of each prompt + response: ``(b, P)``, ``(b, P)``, ``(b, R)``, ``(b, R)`` -> ``(b,)`` float32."""
        ids = torch.cat([prompt_ids, response_ids], dim=-1).long().to(self.device)
        mask = torch.cat([prompt_mask.long(), response_attention(response_mask)], dim=-1).to(self.device)
        last = (prompt_ids.shape[-1] + response_lengths(response_mask) - 1).to(self.device)
        out = self.model.base_model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                                    use_cache=False)
        hidden = out.last_hidden_state[torch.arange(ids.shape[0], device=self.device), last]
        return self.model.score(hidden).squeeze(-1).float().cpu()

    def score(self, batch) -> RewardOutput:
        """Scores ``(b,)`` float32 of the responses in ``batch`` (prompt and response ids and masks)."""
        fields = [batch[name] for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")]
        size = len(fields[0])
        step = self.micro_batch_size or max(size, 1)
        parts = [self.sequence_scores(*(f[s:s + step] for f in fields)) for s in range(0, size, step)]
        return RewardOutput(torch.cat(parts) if parts else torch.zeros(0), {})
