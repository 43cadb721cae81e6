"""The decode loop samples whole responses from the model's distribution, not only plausible tokens.

Two-token responses from a tiny model with random weights: the probability of each response
(``p(t1) p(t2 | t1)``, or ``p(t1)`` alone when t1 ends it with EOS or pad) is computed exactly from the
model's full forward, and the counts of 20,000 sampled responses per prompt are tested against it
(Pearson's chi-square over the responses expected at least 5 times, the rest pooled; the statistic's
upper tail from the Wilson-Hilferty normal approximation). The generator seed is fixed, so the test
is deterministic. The lm_head is scaled up 20x so the model is peaked like a trained one (a random one
is nearly uniform, and then almost any sampler passes): sampling at temperature 0.95 or 1.05 where 1
is asked for moves the statistic to z > 5, past the test's bound of 4.5.
"""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from hybridflow.data.tiny import make_tiny_model
from hybridflow.runtime.engines.decode import decode
from hybridflow.runtime.engines.sampling import SamplingParams

VOCAB, EOS, PAD = 12, 2, 0
SAMPLES = 20_000


def _exact(model, prompt: torch.Tensor, temperature: float) -> dict[tuple[int, ...], float]:
    """Probability of every response of at most two tokens (one token when it is EOS or pad)."""
    with torch.no_grad():
        first = torch.log_softmax(model(input_ids=prompt[None]).logits[0, -1].float() / temperature, -1)
        probs: dict[tuple[int, ...], float] = {}
        for t1 in range(VOCAB):
            if t1 in (EOS, PAD):
                probs[(t1,)] = first[t1].exp().item()
                continue
            second = torch.log_softmax(model(input_ids=torch.cat([prompt, torch.tensor([t1])])[None]).logits[0, -1].float()
                                       / temperature, -1)
            for t2 in range(VOCAB):
                probs[(t1, t2)] = (first[t1] + second[t2]).exp().item()
    return probs


def _upper_tail_z(chi2: float, dof: int) -> float:
    """Wilson-Hilferty: (chi2/k)^(1/3) is close to normal with mean 1 - 2/(9k) and variance 2/(9k)."""
    return ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))


@pytest.mark.parametrize("path", ["lean", "hf"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_responses_follow_the_exact_response_distribution(path, temperature):
    model = make_tiny_model("qwen2", vocab_size=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, seed=5).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    prompts = torch.tensor([[1, 5, 7, 3], [1, 9, 4, 8]])
    out = decode(model, prompts, torch.ones_like(prompts), SamplingParams(n=SAMPLES, max_new_tokens=2,
                                                                          temperature=temperature),
                 eos_token_ids=[EOS], pad_token_id=PAD, generator=torch.Generator().manual_seed(11), path=path)
    for row, prompt in enumerate(prompts):
        exact = _exact(model, prompt, temperature)
        assert sum(exact.values()) == pytest.approx(1.0, abs=1e-5)
        ids = out.response_ids[row * SAMPLES:(row + 1) * SAMPLES]
        lengths = out.response_mask[row * SAMPLES:(row + 1) * SAMPLES].sum(-1).long()
        counts = Counter(tuple(r[:n].tolist()) for r, n in zip(ids, lengths))
        assert set(counts) <= set(exact)  # nothing outside the model's responses (e.g. a token after EOS)
        cells = [(counts.get(r, 0), p * SAMPLES) for r, p in exact.items() if p * SAMPLES >= 5]
        rest = (SAMPLES - sum(c for c, _ in cells), SAMPLES - sum(e for _, e in cells))
        if rest[1] >= 5:
            cells.append(rest)
        chi2 = sum((c - e) ** 2 / e for c, e in cells)
        z = _upper_tail_z(chi2, len(cells) - 1)
        assert len(cells) > 10 and z < 4.5, (row, chi2, len(cells), z)
