"""Loss aggregation modes: hand-worked values, split invariance with global counts, padding invariance."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow_ops import aggregate_loss
from hybridflow_ops.losses import LOSS_AGG_MODES, count_seqs, count_tokens

NAN = float("nan")
MODES = list(LOSS_AGG_MODES)


def test_aggregate_modes_hand_worked():
    # Losses [1, 2, 3 | 4, pad, pad]; 4 valid tokens, 2 sequences, r = 3.
    # token-mean              = (1+2+3+4) / 4        = 2.5
    # seq-mean-token-sum      = (6 + 4) / 2          = 5
    # seq-mean-token-mean     = (6/3 + 4/1) / 2      = 3
    # seq-mean-token-sum-norm = 10 / (2 * 3)         = 1.666667;  with norm_length 5: 10 / 10 = 1
    # token-sum               = 1+2+3+4              = 10  (global counts do not enter)
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, NAN, math.inf]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    expected = {"token-mean": 2.5, "seq-mean-token-sum": 5.0, "seq-mean-token-mean": 3.0, "seq-mean-token-sum-norm": 10 / 6,
                "token-sum": 10.0}
    for mode, value in expected.items():
        torch.testing.assert_close(aggregate_loss(loss, mask, mode=mode), torch.tensor(value))
    torch.testing.assert_close(aggregate_loss(loss, mask, mode="seq-mean-token-sum-norm", norm_length=5), torch.tensor(1.0))
    # Global counts replace the batch's own: 10 / 8 tokens; 10 / 4 sequences.
    torch.testing.assert_close(aggregate_loss(loss, mask, mode="token-mean", global_tokens=8), torch.tensor(1.25))
    torch.testing.assert_close(aggregate_loss(loss, mask, mode="seq-mean-token-sum", global_seqs=torch.tensor(4)), torch.tensor(2.5))
    torch.testing.assert_close(aggregate_loss(loss, mask, mode="token-sum", global_tokens=8, global_seqs=4), torch.tensor(10.0))


def test_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm"):
        aggregate_loss(torch.zeros(1, 1), torch.ones(1, 1), mode="sum")


def test_all_padding_batch_gives_zero_not_nan():
    for mode in MODES:
        assert aggregate_loss(torch.full((2, 3), NAN), torch.zeros(2, 3), mode=mode).item() == 0.0


@st.composite
def loss_batch(draw, max_b=6, max_r=6):
    b, r = draw(st.integers(2, max_b)), draw(st.integers(1, max_r))
    loss = draw(st.lists(st.lists(st.floats(-10, 10), min_size=r, max_size=r), min_size=b, max_size=b))
    mask = draw(st.lists(st.lists(st.booleans(), min_size=r, max_size=r), min_size=b, max_size=b))
    return torch.tensor(loss, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64)


@settings(max_examples=100, deadline=None)
@given(batch=loss_batch(), data=st.data(), mode=st.sampled_from(MODES))
def test_micro_batch_losses_sum_to_full_batch_loss_given_global_counts(batch, data, mode):
    loss, mask = batch
    b, r = loss.shape
    cuts = sorted(set(data.draw(st.lists(st.integers(1, b - 1), min_size=1, max_size=3))))
    counts = dict(global_tokens=count_tokens(mask), global_seqs=count_seqs(mask), norm_length=r)
    full = aggregate_loss(loss, mask, mode=mode, **counts)
    total = torch.zeros((), dtype=torch.float64)
    for start, stop in zip([0] + cuts, cuts + [b]):
        micro_loss, micro_mask = loss[start:stop], mask[start:stop]
        # Each micro-batch is trimmed to its own longest valid position, as a packer would.
        width = int(max((torch.nonzero(micro_mask.any(0)).max().item() + 1) if micro_mask.any() else 1, 1))
        total = total + aggregate_loss(micro_loss[:, :width], micro_mask[:, :width], mode=mode, **counts)
    torch.testing.assert_close(total, full)


@settings(max_examples=60, deadline=None)
@given(batch=loss_batch(), data=st.data(), mode=st.sampled_from(MODES))
def test_aggregate_ignores_padding_columns_and_rows(batch, data, mode):
    loss, mask = batch
    b, r = loss.shape
    extra_cols, extra_rows = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 2))
    garbage = data.draw(st.sampled_from([NAN, math.inf, -math.inf, 1e300]))
    wide_loss = torch.full((b + extra_rows, r + extra_cols), garbage, dtype=torch.float64)
    wide_loss[:b, :r] = loss
    wide_mask = torch.zeros_like(wide_loss)
    wide_mask[:b, :r] = mask
    # norm_length is fixed (the maximum response length): otherwise the -norm mode depends on r by design.
    base = aggregate_loss(loss, mask, mode=mode, norm_length=8)
    torch.testing.assert_close(aggregate_loss(wide_loss, wide_mask, mode=mode, norm_length=8), base)


def test_aggregate_gradient_flows_and_is_zero_at_padding():
    loss = torch.tensor([[1.0, NAN], [2.0, 3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    aggregate_loss(loss, mask, mode="seq-mean-token-mean").backward()
    # (l00 / 1 + (l10 + l11) / 2) / 2 -> d/dl = [0.5, 0 | 0.25, 0.25]
    torch.testing.assert_close(loss.grad, torch.tensor([[0.5, 0.0], [0.25, 0.25]]))


def test_half_precision_losses_are_summed_and_counted_in_float32():
    # 8193 tokens of loss 1 in bfloat16: bf16 cannot represent 8193 (it rounds to 8192), so a bf16 sum
    # or count would give 8192/8193 or 8193/8192. In float32 the token mean is exactly 1.
    loss = torch.ones(1, 8193, dtype=torch.bfloat16)
    out = aggregate_loss(loss, torch.ones(1, 8193), mode="token-mean", global_tokens=8193)
    assert out.dtype == torch.float32 and out.item() == 1.0
