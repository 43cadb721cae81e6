"""Typed values: a :class:`Schema` is an ordered tuple of named, typed fields.

A field is a :class:`hybridflow_ops.registry.FieldSpec`: ``name: dtype[dims]``
with symbolic dims (see :mod:`hybridflow.graph.dims`). The standard schemas
below follow the project's field names (B = responses in the batch, P =
prompt length, R = response length).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from hybridflow_ops.registry import FieldSpec, OpRegistryError

from ..errors import GraphError

__all__ = [
    "FieldSpec", "Schema", "parse_field",
    "PROMPTS", "ROLLOUT", "AGENT_ROLLOUT", "LOG_PROBS", "OLD_LOG_PROBS", "REF_LOG_PROBS", "VALUES", "SCORES", "ADVANTAGES",
    "STANDARD_SCHEMAS",
]


def parse_field(text: object) -> FieldSpec:
    """``"scores: float32[B]"`` -> FieldSpec, raising :class:`GraphError` on malformed text."""
    try:
        return FieldSpec.parse(text)  # type: ignore[arg-type]
    except OpRegistryError as err:
        raise GraphError(str(err)) from None


@dataclass(frozen=True)
class Schema:
    """An ordered tuple of fields with distinct names."""

    fields: tuple[FieldSpec, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.fields, tuple) or not all(isinstance(f, FieldSpec) for f in self.fields):
            raise GraphError(f"a Schema holds a tuple of FieldSpec, got {self.fields!r}")
        names = [f.name for f in self.fields]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise GraphError(f"schema declares field(s) {', '.join(duplicates)} twice; field names must be distinct")

    @classmethod
    def of(cls, *fields: "str | FieldSpec") -> "Schema":
        """``Schema.of("scores: float32[B]", ...)``."""
        return cls(tuple(parse_field(f) for f in fields))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def get(self, name: str) -> FieldSpec | None:
        return next((f for f in self.fields if f.name == name), None)

    def __contains__(self, name: object) -> bool:
        return any(f.name == name for f in self.fields)

    def __iter__(self) -> Iterator[FieldSpec]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __str__(self) -> str:
        return "(" + ", ".join(str(f) for f in self.fields) + ")"


PROMPTS = Schema.of("prompt_ids: int64[B, P]", "prompt_mask: int64[B, P]")
"""The prompts of one iteration, as the data loader provides them."""

ROLLOUT = Schema.of(
    "prompt_ids: int64[B, P]", "prompt_mask: int64[B, P]",
    "response_ids: int64[B, R]", "response_mask: float32[B, R]",
    "rollout_log_probs: float32[B, R]", "group_index: int64[B]", "policy_version: int64[B, R]",
)
"""Generated responses with their prompts; ``group_index`` is the prompt each response answers, ``policy_version``
the version (training steps taken) of the weights that sampled each token (:mod:`hybridflow.runtime.policy_version`)."""

AGENT_ROLLOUT = Schema.of(
    "turn_index: int64[B, R]", "num_turns: int64[B]", "env_reward: float32[B]",
    "tool_calls: int64[B]", "tool_errors: int64[B]",
)
"""What a multi-turn rollout (a generate node with ``env=``) adds to :data:`ROLLOUT`: the model turn of each
position (-1 at padding), turns taken, the environment's summed reward, tool calls made and failed. Its
``response_mask`` is 1 only on tokens the model sampled: observations are context, never trained."""

OLD_LOG_PROBS = Schema.of("old_log_probs: float32[B, R]")
"""Per-token log-probs of the responses under the actor before the update."""

REF_LOG_PROBS = Schema.of("ref_log_probs: float32[B, R]")
"""Per-token log-probs of the responses under the frozen reference model."""

LOG_PROBS = {"policy": OLD_LOG_PROBS, "reference": REF_LOG_PROBS}
"""The LogProbs schema by the kind of role that computes it: ``actor.logprob`` -> old_log_probs, ``ref.logprob`` -> ref_log_probs."""

VALUES = Schema.of("values: float32[B, R]")
"""Per-token value estimates of a critic."""

SCORES = Schema.of("scores: float32[B]")
"""One scalar reward per response."""

ADVANTAGES = Schema.of("advantages: float32[B, R]", "returns: float32[B, R]")
"""Per-token advantages and returns (value targets)."""

STANDARD_SCHEMAS: dict[str, Schema] = {
    "Prompts": PROMPTS, "Rollout": ROLLOUT, "AgentRollout": AGENT_ROLLOUT, "OldLogProbs": OLD_LOG_PROBS, "RefLogProbs": REF_LOG_PROBS,
    "Values": VALUES, "Scores": SCORES, "Advantages": ADVANTAGES,
}
