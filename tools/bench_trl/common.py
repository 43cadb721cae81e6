"""What both sides of tools/bench_vs_trl.py share: the task, the reward rule, the greedy evaluation, the run record.

This file imports torch and transformers only (never hybridflow or trl), so the TRL runner
can load it by path inside its own virtual environment and the hybridflow runner can load
it in ours: both sides then score and evaluate with literally the same code.

Task: all 100 prompts ``a+b=`` (a, b in 0..9), tokenised with the model folder's
character tokenizer (``<bos>`` prepended). Reward (as hybridflow_ops.rewards.arithmetic
with ``unfinished_score=0``): 1 when the response ends with EOS within the length limit
and its text before the EOS, decoded with the special tokens kept and stripped of
surrounding whitespace, is exactly the sum; else 0. A ``<pad>`` sampled inside a
response therefore decodes as the text ``<pad>`` and scores 0 on both sides.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

__all__ = ["RunConfig", "arithmetic_rows", "exact_sum_score", "greedy_accuracy", "greedy_responses", "load_tokenizer",
           "set_stop_logits", "spread_stop_probability", "write_record"]


@dataclass(frozen=True)
class RunConfig:
    """Settings of one learning run; both runners read the same JSON file."""

    model_dir: str
    """The transformers folder of the policy at step 0 (made once per seed by the tool)."""
    out: str
    """JSON file the runner writes its record to."""
    seed: int = 0
    """Seed of the data order and the sampling."""
    steps: int = 300
    """Optimizer steps (one generation batch each)."""
    prompts: int = 50
    """Prompts per step."""
    group: int = 16
    """Responses per prompt."""
    max_new_tokens: int = 3
    """Response length limit (the longest answer, 18, is two tokens, plus EOS)."""
    lr: float = 2e-3
    """Peak learning rate of AdamW."""
    lr_schedule: str = "constant"
    """'constant' or 'linear' (decay to 0 over ``steps``, TrainingArguments' default)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Gradient clipping (the norm before clipping is recorded)."""
    temperature: float = 1.0
    """Sampling temperature (and of the log-probs)."""
    clip: float = 0.2
    """PPO clip range, both sides."""
    eval_every: int = 25
    """Greedy accuracy on all 100 prompts every this many steps (and at step 0 and the last step); 0: never (the
    speed mode: evaluation is no part of a timed step, and on the 100M model each one costs minutes)."""
    threads: int = 1
    """torch threads of the runner process."""
    variant: dict = field(default_factory=dict)
    """Side-specific switches for diagnosis experiments (see each runner)."""

    @classmethod
    def load(cls, path: str | Path) -> "RunConfig":
        data = json.loads(Path(path).read_text())
        data["betas"] = tuple(data["betas"])
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1))


def arithmetic_rows() -> list[dict]:
    """All 100 rows ``{"prompt": "a+b=", "ground_truth": "a+b"}`` in a fixed order."""
    return [{"prompt": f"{a}+{b}=", "ground_truth": str(a + b)} for a in range(10) for b in range(10)]


def load_tokenizer(model_dir: str | Path):
    """The folder's character tokenizer (``PreTrainedTokenizerFast``: ``AutoTokenizer`` would swap in Qwen's)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(model_dir))


def exact_sum_score(response_ids: Sequence[int], ground_truth: str, tokenizer, eos_id: int) -> float:
    """1.0 when ``response_ids`` (the valid response tokens) end with EOS and the text before it is the sum."""
    ids = list(response_ids)
    if not ids or ids[-1] != eos_id:
        return 0.0  # hit the length limit without EOS: unfinished_score = 0
    text = tokenizer.decode(ids[:-1], skip_special_tokens=False)
    return 1.0 if text.strip() == str(int(ground_truth)) else 0.0


@torch.no_grad()
def greedy_responses(model: torch.nn.Module, tokenizer, rows: Sequence[dict], max_new_tokens: int) -> list[list[int]]:
    """The argmax response to every row (its tokens up to and including the first EOS or pad), in eval mode.

    A plain loop of full forwards (no KV cache): every prompt has the same length, so no
    padding is involved; a row stops at its first EOS, or at a ``<pad>`` (which ends a
    response in hybridflow's rollout engine, and scores 0 here as it has no EOS).
    """
    was_training = model.training
    model.eval()
    try:
        prompt = [tokenizer(r["prompt"])["input_ids"] for r in rows]
        if len({len(p) for p in prompt}) != 1:
            raise ValueError("greedy_responses expects prompts of one length")
        ids = torch.tensor(prompt, dtype=torch.long)
        responses: list[list[int]] = [[] for _ in rows]
        done = [False] * len(rows)
        for _ in range(max_new_tokens):
            token = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1].argmax(-1)
            for i, t in enumerate(token.tolist()):
                if not done[i]:
                    responses[i].append(t)
                    done[i] = t in (tokenizer.eos_token_id, tokenizer.pad_token_id)
            if all(done):
                break
            ids = torch.cat([ids, token[:, None]], dim=-1)
    finally:
        model.train(was_training)
    return responses


def greedy_accuracy(model: torch.nn.Module, tokenizer, rows: Sequence[dict], max_new_tokens: int) -> float:
    """Mean :func:`exact_sum_score` of the :func:`greedy_responses`."""
    responses = greedy_responses(model, tokenizer, rows, max_new_tokens)
    eos = tokenizer.eos_token_id
    return sum(exact_sum_score(r, row["ground_truth"], tokenizer, eos) for r, row in zip(responses, rows)) / len(rows)


def spread_stop_probability(budget: int, fill: float = 0.5) -> float:
    """The per-token stop probability ``p`` whose geometric lengths, cut at ``budget``, average ``fill * budget``.

    A row stops after token ``k`` with probability ``p`` (EOS counted in its length), so its mean
    length is ``(1 - (1 - p) ** budget) / p``; bisection on ``p``.
    """
    target, low, high = fill * budget, 1e-6, 1.0
    for _ in range(100):
        p = (low + high) / 2
        low, high = (p, high) if (1 - (1 - p) ** budget) / p > target else (low, p)
    return (low + high) / 2


@torch.no_grad()
def set_stop_logits(model: torch.nn.Module, eos_id: int, pad_id: int, budget: int, fill: float = 0.5) -> float:
    """Make a random-weight Llama/Qwen2 model stop at EOS after about ``fill * budget`` tokens; returns the target p.

    The speed benchmark needs responses of realistic length on both sides (a warmed-up model answers
    in 2 tokens: a step then measures fixed costs, not decoding). Random weights give nearly uniform
    logits, so the stop rate is set through one hidden unit held constant: residual dimension 0 is
    ``c = 1`` in every token embedding and no layer writes to it (row 0 of every ``o_proj`` and
    ``down_proj`` zeroed), so after the final RMSNorm it is ``u = g_0 c / rms(x)``, the same for every
    position up to the small random part of ``rms(x)`` (its median over random
    sequences is used). The EOS row of ``lm_head`` becomes
    ``(-b / u, 0, ...)`` (logit ``-b``) and the pad row ``(-50 / u, 0, ...)`` (never sampled, so both
    sides stop at EOS alone; TRL does not stop at ``<pad>``). The other ``V - 2`` logits stay near 0,
    so ``p = e^-b / (e^-b + V - 2)``: ``b`` is solved for :func:`spread_stop_probability`'s ``p``.
    Both sides load the same folder, so both sample from the same distribution.
    """
    import math

    backbone = model.model
    backbone.embed_tokens.weight[:, 0] = 1.0
    for layer in backbone.layers:
        layer.self_attn.o_proj.weight[0] = 0.0
        layer.mlp.down_proj.weight[0] = 0.0
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.lm_head.weight.shape[0], (8, budget), generator=generator)
    u = float(backbone(input_ids=ids).last_hidden_state[..., 0].median())  # after the final norm
    others = model.lm_head.weight.shape[0] - 2
    p = spread_stop_probability(budget, fill)
    b = -math.log(p * others / (1 - p))
    head = model.lm_head.weight
    head[eos_id] = 0.0
    head[pad_id] = 0.0
    head[eos_id, 0] = -b / u
    head[pad_id, 0] = -50.0 / u
    return p


def write_record(path: str | Path, *, framework: str, config: RunConfig, steps: list[dict], evals: list[dict],
                 wall_s: float, extra: dict | None = None) -> None:
    """Write one run's record: per-step metrics, evaluations, wall time, this process's peak RSS."""
    import resource

    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    record = {"framework": framework, "config": asdict(config), "steps": steps, "evals": evals, "wall_s": wall_s,
              "peak_rss_mb": peak_rss_mb, **(extra or {})}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=1))
