"""The decode's products, kept for the update that follows it with the same weights.

An on-policy step decodes its responses and then updates on them: the update's forward
computes, with gradients, the same layer outputs the decode computed a moment before with the
same weights. On the ~8M bench model the forward's matrix products are about a third of the
update's (one forward product, two backward ones each). When the lean decode
(:mod:`.lean_decode`) runs a model that is being trained, it writes each step's outputs of
the four products every layer computes (``q/k/v``, ``o_proj``, ``gate/up``, ``down``) into a
:class:`DecodeTape`; the lean train forward (:func:`~.lean_forward.lean_shared_hidden`, with
gradients) then takes those outputs in place of its own products and computes only what lies
between them (norms, rotary, attention, the SwiGLU) and the backward. The gradient is the
same function of the same numbers: each product's backward reads its input and weight as
before.

The tape is used only where it holds exactly what the forward would compute:

- the model's weights are unchanged since the decode: a torch optimizer's step over any of its
  parameters drops the tape (a global step hook: fused AdamW changes parameters without advancing
  their version counters), and every parameter's storage and in-place version counter (which a
  ``copy_``, ``load_state_dict`` or weight load advances) must be what the decode saw. So after the
  first optimizer step of a step's update (further mini-batches, PPO epochs) the forward computes
  its products again;
- every row of the forward's call is a row the decode produced: the same prompt tokens and
  the same response tokens under a response mask that is one run of valid positions from the
  start (rows are found by their tokens, whatever order, subset or repetition the batch has
  reached the update in; rows with one valid token or none need no position of it);
- the call's forward reads no position the decode did not compute as the forward does: the
  position fed a row's last response token (an EOS the decode marked ended before feeding it)
  is left out of the replayed forward; its state predicts nothing the loss reads.

Otherwise the forward computes everything, as without a tape. One tape is kept per model (a
new decode replaces it) and only when it holds at most :data:`TAPE_LIMIT` bytes: at long
responses the tape would cost more memory than it saves time. The decode records only when
it runs alone (not cut into segments, not continued) and the model has parameters that
require gradients (a model being trained, whose train engine shares its weights).
"""
from __future__ import annotations

import weakref
from collections import Counter

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

__all__ = ["COUNTS", "DecodeTape", "MIN_HIDDEN", "TAPE_LIMIT", "PRODUCTS", "new_tape", "replay_rows"]

TAPE_LIMIT = 1 << 30
"""The most bytes a decode's tape may hold (every row at every step); a larger decode records nothing."""

MIN_HIDDEN = 256
"""Models narrower than this record nothing: on the tiny bench model (hidden 64) a step's writes cost about what
the products they save do (tools/bench_vs_trl.py speed, 3 rounds against the commit before the tape: 1.72x
against 1.58x TRL with row skipping off, 3.31x against 3.59x with it on, where no update reads the tape)."""

PRODUCTS = ("qkv", "o", "gate_up", "down")
"""The products a layer's tape holds, in the order a layer computes them."""

_TAPES: "weakref.WeakKeyDictionary[torch.nn.Module, DecodeTape]" = weakref.WeakKeyDictionary()
_SPARE: "weakref.WeakKeyDictionary[torch.nn.Module, list[dict[str, torch.Tensor]]]" = weakref.WeakKeyDictionary()

COUNTS: Counter = Counter()
"""Decodes that kept a tape (``"recorded"``) and forward calls that took one (``"replayed"``), in this process."""

FILL: float | None = None
"""A value to fill a new tape with (tests: NaN shows a position read that no step wrote); None leaves it unset."""


class DecodeTape:
    """Each layer's product outputs at every decode step, the rows each step computed one after another.

    :attr:`layers`: per layer, ``{product: (capacity, width)}``; :attr:`index` ``(rows, steps)``: the tape row
    holding row ``r``'s outputs at step ``t`` (fed its ``t``-th response token), -1 where the step did not
    compute the row (a compacted decode drops ended rows). ``spare``: the buffers of an earlier tape of the same
    model, used again when large enough: a new allocation's first writes fault its pages in (on the ~8M bench
    model's decode ~0.1 s a step, measured), which writing into memory already mapped does not.
    """

    def __init__(self, backbone: torch.nn.Module, rows: int, steps: int, widths: dict[str, int],
                 spare: list[dict[str, torch.Tensor]] | None = None):
        self.backbone = weakref.ref(backbone)
        self.rows, self.steps = rows, steps
        weight = backbone.embed_tokens.weight
        capacity = rows * steps
        if spare is not None and all(spare[0][name].shape[0] >= capacity and spare[0][name].shape[1] == widths[name]
                                     for name in PRODUCTS):
            self.layers = spare
        else:
            self.layers = [{name: weight.new_empty(capacity, widths[name]) for name in PRODUCTS}
                           for _ in backbone.layers]
        if FILL is not None:
            for layer in self.layers:
                for tensor in layer.values():
                    tensor.fill_(FILL)
        self.index = torch.full((rows, steps), -1, dtype=torch.long)
        self.used = 0
        self.versions = _versions(backbone)
        self.keys: dict[tuple, int] | None = None  # set by :meth:`seal`
        self.served = 0  # forward calls that replayed this tape

    def begin(self, t: int, rows: torch.Tensor | None, count: int) -> int:
        """Step ``t`` computes ``count`` rows (``rows``: their rows, None: every row in order) -> its first tape row."""
        start = self.used
        self.used += count
        slots = torch.arange(start, start + count)
        if rows is None:
            self.index[:, t] = slots
        else:
            self.index[rows, t] = slots
        return start

    def write(self, layer: int, start: int, name: str, out: torch.Tensor, column: int = 0) -> None:
        """A step's output ``out`` ``(count, 1, w)`` of product ``name`` from tape row ``start`` (:meth:`begin`), into
        its columns from ``column`` (gate and up computed as two products write a block each)."""
        flat = out.reshape(-1, out.shape[-1])
        rows = self.layers[layer][name].narrow(0, start, flat.shape[0])
        (rows if column == 0 and flat.shape[-1] == rows.shape[-1] else rows.narrow(1, column, flat.shape[-1])).copy_(flat)

    def slots(self, rows: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """The tape rows of ``rows`` at ``steps`` (equal shapes); -1 where a step did not compute the row."""
        return self.index.view(-1)[rows * self.steps + steps]

    def seal(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, tokens: torch.Tensor,
             mask: torch.Tensor) -> None:
        """Index the rows by their tokens once the decode is done and register the tape for the model.

        prompt_ids, prompt_mask ``(b, P)``; tokens, mask ``(b * n, S)``: the decode's responses and their mask.
        """
        prompts = [tuple(ids[valid.bool()].tolist()) for ids, valid in zip(prompt_ids, prompt_mask)]
        lengths = mask.sum(-1).long().tolist()
        self.keys = {}
        for row, (response, length) in enumerate(zip(tokens.tolist(), lengths)):
            self.keys.setdefault((prompts[row // n], tuple(response[:length])), row)
        backbone = self.backbone()
        if backbone is not None:
            _TAPES[backbone] = self
            COUNTS["recorded"] += 1

    def fresh(self, backbone: torch.nn.Module) -> bool:
        """Whether ``backbone``'s weights are the ones this tape was recorded with."""
        return self.keys is not None and self.backbone() is backbone and _versions(backbone) == self.versions


def _drop(backbone: torch.nn.Module) -> None:
    """End ``backbone``'s tape; its buffers are kept for the next one (:class:`DecodeTape` ``spare``)."""
    tape = _TAPES.pop(backbone, None)
    if tape is not None:
        tape.keys = None
        _SPARE[backbone] = tape.layers


def _forget_stepped(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """Drop the tapes of models whose parameters ``optimizer`` just stepped (a step post-hook on every optimizer)."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for backbone in list(_TAPES.keys()):
        if any(id(p) in stepped for p in backbone.parameters()):
            _drop(backbone)


register_optimizer_step_post_hook(_forget_stepped)


def _versions(backbone: torch.nn.Module) -> list[tuple[int, int]]:
    # a parameter's version counter advances with every in-place change (optimizer steps, loads)
    return [(p.data_ptr(), p._version) for p in backbone.parameters()]


def new_tape(model: torch.nn.Module, rows: int, steps: int) -> DecodeTape | None:
    """A tape for a lean decode of ``rows`` rows and ``steps`` fed tokens of ``model``, or None where none applies.

    None when the model is narrower than :data:`MIN_HIDDEN`, when no parameter requires gradients (nothing will
    update on it), when the layers' MLPs
    are not the SiLU-gated ones the lean forward replays, or when the tape would exceed
    :data:`TAPE_LIMIT`. Creating one drops the model's previous tape first.
    """
    backbone = model.model
    _drop(backbone)
    if steps < 1 or backbone.config.hidden_size < MIN_HIDDEN or not any(p.requires_grad for p in backbone.parameters()):
        return None
    attention, mlp = backbone.layers[0].self_attn, backbone.layers[0].mlp
    if type(getattr(mlp, "act_fn", None)).__name__ != "SiLUActivation" or (
            mlp.gate_proj.out_features != mlp.up_proj.out_features):
        return None
    widths = {"qkv": attention.q_proj.out_features + attention.k_proj.out_features + attention.v_proj.out_features,
              "o": attention.o_proj.out_features, "gate_up": 2 * mlp.gate_proj.out_features,
              "down": mlp.down_proj.out_features}
    size = rows * steps * sum(widths.values()) * len(backbone.layers) * backbone.embed_tokens.weight.element_size()
    if size > TAPE_LIMIT:
        return None
    return DecodeTape(backbone, rows, steps, widths, _SPARE.pop(backbone, None))


def replay_rows(backbone: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                response_ids: torch.Tensor, response_mask: torch.Tensor) -> tuple[DecodeTape, torch.Tensor] | None:
    """``(tape, rows)`` when ``backbone``'s tape holds every row of this forward call (module docstring), else None.

    ``rows`` ``(b,)``: each row's row in the tape. Shapes: prompt ``(b, P)``, response ``(b, R)``.
    """
    tape = _TAPES.get(backbone)
    if tape is None or not tape.fresh(backbone):
        if tape is not None:
            _drop(backbone)
        return None
    valid = response_mask > 0
    lengths = valid.sum(-1)
    if response_ids.shape[-1] and not bool((valid == (torch.arange(valid.shape[-1]) < lengths[:, None])).all()):
        return None  # a response with a hole: not what the decode computed
    rows = []
    for ids, mask, response, length in zip(prompt_ids.tolist(), prompt_mask.tolist(), response_ids.tolist(),
                                           lengths.tolist()):
        if length <= 1:  # no fed position of this row is read
            rows.append(0)
            continue
        row = tape.keys.get((tuple(i for i, m in zip(ids, mask) if m), tuple(response[:length])))
        if row is None:
            return None
        rows.append(row)
    return tape, torch.tensor(rows, dtype=torch.long)
