"""The critic: a causal-LM backbone with a scalar value head.

``V(s_t) = w . h_t + b`` where ``h_t`` is the backbone's last hidden state of
the state before response token ``t`` (prompt plus ``y_<t``), i.e. position
``P-1+t`` of the joined sequence: the same alignment as the log-probs, so
``values[b, t]`` is the value of the state from which ``response_ids[b, t]``
was generated (the ``V(s_t)`` of GAE, Schulman et al. 2016, eq. 11).
"""
from __future__ import annotations

import copy
import os

import torch
from torch import nn

from .packing import pack_rows, packed_hidden, unpack
from .sequence import join_prompt_response, response_hidden
from .shared_prompt import shared_response_hidden

__all__ = ["ValueModel"]


class ValueModel(nn.Module):
    """``backbone`` (a transformers base model such as ``Qwen2Model``) + ``Linear(hidden, 1)``.

    Build it with :meth:`from_pretrained` (a causal-LM or base-model folder or hub
    name; the lm_head is dropped) or :meth:`from_causal_lm` (a copy of an
    in-memory model's backbone, e.g. the tiny actor).
    """

    def __init__(self, backbone: nn.Module, *, head_init_std: float = 0.02):
        super().__init__()
        self.backbone = backbone
        hidden_size = backbone.config.hidden_size
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=head_init_std)
        nn.init.zeros_(self.value_head.bias)
        param = next(backbone.parameters(), None)
        if param is not None:
            self.value_head.to(device=param.device, dtype=param.dtype)

    @property
    def config(self):
        return self.backbone.config

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, *, head_init_std: float = 0.02, **kwargs) -> "ValueModel":
        """Load the backbone with ``AutoModel.from_pretrained(name_or_path, **kwargs)``; the head is new."""
        from transformers import AutoModel

        return cls(AutoModel.from_pretrained(name_or_path, **kwargs), head_init_std=head_init_std)

    @classmethod
    def from_causal_lm(cls, model: nn.Module, *, head_init_std: float = 0.02) -> "ValueModel":
        """A deep copy of ``model.base_model`` (the causal LM's backbone) with a new head."""
        return cls(copy.deepcopy(model.base_model), head_init_std=head_init_std)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Value of every position: ``(b, t)`` ids, mask, positions -> ``(b, t)`` float32."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return self.value_head(out.last_hidden_state).squeeze(-1).float()

    def response_values(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                        response_mask: torch.Tensor, *, packed: bool = False) -> torch.Tensor:
        """``V(s_t)`` for each response position ``t``.

        Shapes: prompt ``(b, P)``, response ``(b, R)`` -> ``(b, R)`` float32 (meaningless at padding;
        0 there when ``packed``). ``packed``: the rows run packed into one row of real tokens
        (:mod:`~hybridflow.runtime.engines.packing`).
        """
        if packed:
            rows = pack_rows(prompt_ids, prompt_mask, response_ids, response_mask)
            return unpack(self.value_head(packed_hidden(self.backbone, rows)).squeeze(-1).float(), rows)
        hidden = shared_response_hidden(self.backbone, prompt_ids, prompt_mask, response_ids, response_mask)
        if hidden is None:  # no prompt repeats, or the shared-prompt forward would not be exact
            inputs = join_prompt_response(prompt_ids, prompt_mask, response_ids, response_mask)
            hidden = response_hidden(self.backbone, inputs, prompt_ids.shape[-1])
        return self.value_head(hidden).squeeze(-1).float()
