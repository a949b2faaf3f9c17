"""The tiled (FlashAttention) algorithm in PyTorch, against SDPA and float64 math."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attn_course import self_attention
from attn_course.flash import merge_softmax_blocks, online_softmax, tiled_attention
from attn_course.flash.tiled import merge_attention_outputs
from attn_course.measure.memory import peak_memory

from helpers import FAST, close


def reference_float64(q, k, v, causal):
    """Attention and log-sum-exp written out in float64."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


@pytest.mark.parametrize("n", [1, 17, 200, 1030])
@pytest.mark.parametrize("causal", [False, True])
def test_output_and_lse_match_float64_reference(n, causal):
    generator = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, 2, n, 16, generator=generator) for _ in range(3))
    output, lse = tiled_attention(q, k, v, causal=causal, block_q=128, block_k=64, return_lse=True)
    expected_output, expected_lse = reference_float64(q, k, v, causal)
    sdpa_error = (F.scaled_dot_product_attention(q, k, v, is_causal=causal).double() - expected_output).abs().max()
    assert (output.double() - expected_output).abs().max() <= 2 * sdpa_error + 1e-6
    assert (lse.double() - expected_lse).abs().max() < 1e-5


@pytest.mark.parametrize("block_q, block_k", [(1, 1), (7, 3), (16, 64), (64, 16), (500, 500)])
def test_any_block_sizes_give_the_same_answer(block_q, block_k):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 45, 8, generator=generator) for _ in range(3))
    for causal in (False, True):
        got = tiled_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=causal))


def test_cross_attention_lengths_and_value_width_and_scale():
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 33, 16, generator=generator)
    k = torch.randn(2, 2, 70, 16, generator=generator)
    v = torch.randn(2, 2, 70, 5, generator=generator)
    got = tiled_attention(q, k, v, scale=0.3, block_q=16, block_k=16)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, scale=0.3))


@pytest.mark.parametrize("n_q, n_k", [(1, 1), (1, 70), (5, 70), (40, 130), (130, 130)])
def test_bottom_right_causal_forward_and_backward_match_float64_with_an_explicit_mask(n_q, n_k):
    # The queries are the last n_q of the n_k positions, as after a KV cache: query i sees keys 0..i + n_k - n_q.
    generator = torch.Generator().manual_seed(n_q * 1000 + n_k)
    q = torch.randn(1, 2, n_q, 16, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(1, 2, n_k, 16, generator=generator, dtype=torch.float64) for _ in range(2))
    grad_out = torch.randn(1, 2, n_q, 16, generator=generator, dtype=torch.float64)
    visible = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q)   # [n_q, n_k], written out
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*leaves, attn_mask=visible)
    expected.backward(grad_out)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    got = tiled_attention(*inputs, causal=True, block_q=16, block_k=32)
    got.backward(grad_out)
    torch.testing.assert_close(got, expected)
    for got_input, expected_input in zip(inputs, leaves):
        torch.testing.assert_close(got_input.grad, expected_input.grad)


def test_large_logits_stay_finite_and_exact():
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=generator) for _ in range(3))
    got = tiled_attention(q * 50, k, v, causal=True, block_q=16, block_k=16)
    expected, _ = reference_float64(q * 50, k, v, causal=True)
    assert torch.isfinite(got).all()
    assert (got.double() - expected).abs().max() < 1e-4


def test_non_contiguous_inputs():
    generator = torch.Generator().manual_seed(3)
    base = torch.randn(2, 40, 3, 16, generator=generator)
    q = k = v = base.transpose(1, 2)  # [B, H, N, d], not contiguous
    assert not q.is_contiguous()
    torch.testing.assert_close(tiled_attention(q, k, v, block_q=16, block_k=8), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_in_float64(causal):
    generator = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 21, 4, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(
        lambda a, b, c: tiled_attention(a, b, c, causal=causal, block_q=8, block_k=5), (q, k, v)
    )


def test_peak_memory_grows_linearly_not_quadratically():
    peaks = {}
    for n in (512, 1024):
        x = torch.randn(1, 1, n, 64)
        with torch.no_grad():
            _, tiled = peak_memory(tiled_attention, x, x, x)
            _, naive = peak_memory(self_attention, x, x, x)
        peaks[n] = (tiled, naive)
    assert peaks[1024][1] / peaks[512][1] > 3.5  # naive: N²
    assert peaks[1024][0] / peaks[512][0] < 2.5  # tiled: N
    assert peaks[1024][1] / peaks[1024][0] > 10  # already 10× less at N = 1024


@FAST
@given(n=st.integers(1, 40), block=st.integers(1, 12), seed=st.integers(0, 1000))
def test_online_softmax_equals_softmax(n, block, seed):
    scores = torch.randn(3, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 20
    close(online_softmax(scores, block_size=block), torch.softmax(scores, dim=-1), 1e-7)


@FAST
@given(split=st.integers(1, 19), seed=st.integers(0, 1000))
def test_merging_two_blocks_gives_the_statistics_of_the_whole_row(split, seed):
    row = torch.randn(20, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 10
    a, b = row[:split], row[split:]
    merged_max, merged_sum = merge_softmax_blocks(
        a.max(), torch.exp(a - a.max()).sum(), b.max(), torch.exp(b - b.max()).sum()
    )
    assert merged_max == row.max()
    close(merged_max + merged_sum.log(), torch.logsumexp(row, dim=0), 1e-7)


def test_merging_with_an_empty_block_keeps_the_other():
    minus_inf = torch.tensor(float("-inf"))
    merged = merge_softmax_blocks(minus_inf, torch.tensor(0.0), torch.tensor(2.0), torch.tensor(3.0))
    assert merged == (torch.tensor(2.0), torch.tensor(3.0))
    both_empty = merge_softmax_blocks(minus_inf, torch.tensor(0.0), minus_inf, torch.tensor(0.0))
    assert both_empty[0] == minus_inf and both_empty[1] == 0


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda x: tiled_attention(x[0], x, x), ValueError, "q must be 4-D"),
        (lambda x: tiled_attention(x.long(), x, x), TypeError, "floating"),
        (lambda x: tiled_attention(x, x.double(), x), TypeError, "dtype"),
        (lambda x: tiled_attention(x, x[:, :, :3], x[:, :, :3], causal=True), ValueError, "causal needs"),
        (lambda x: tiled_attention(x, x[..., :4], x), ValueError, "expected q"),
        (lambda x: tiled_attention(x, x, x, block_q=0), ValueError, "block_q"),
        (lambda x: tiled_attention(x, x, x, scale=-1.0), ValueError, "scale"),
        (lambda x: online_softmax(x, block_size=0), ValueError, "block_size"),
        (lambda x: online_softmax(x[..., :0]), ValueError, "at least one entry"),
    ],
)
def test_bad_inputs_raise_with_the_argument_named(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call(torch.randn(1, 2, 5, 8))


# --- merging two partial attentions by their log-sum-exps (what ring attention does at each hop) ---

def masked_part(q, k, v, allowed):
    """Attention of q over the keys ``allowed`` lets it see ([N_q, N_k] bool), in float64, and its lse;
    a row that may see nothing gets output 0 and lse -inf."""
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1))
    return weights @ v, lse


@pytest.mark.parametrize("logit_scale", [1.0, 50.0])
def test_merged_outputs_equal_float64_attention_over_the_union_of_keys(logit_scale):
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(2, 3, 6, 8, generator=generator, dtype=torch.float64) * logit_scale
    k, v = (torch.randn(2, 3, 11, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    in_a = torch.rand(6, 11, generator=generator) < 0.5                       # a random split of the keys
    expected_out, expected_lse = masked_part(q, k, v, torch.ones(6, 11, dtype=torch.bool))
    parts = [t.float() for t in (*masked_part(q, k, v, in_a), *masked_part(q, k, v, ~in_a))]
    out, lse = merge_attention_outputs(*parts)
    assert out.dtype == lse.dtype == torch.float32 and torch.isfinite(out).all()
    assert (out.double() - expected_out).abs().max() < 1e-5
    assert (lse.double() - expected_lse).abs().max() < 1e-5 * logit_scale


def test_an_all_masked_side_leaves_the_other_side_unchanged_without_nan():
    generator = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    everything, nothing = torch.ones(5, 5, dtype=torch.bool), torch.zeros(5, 5, dtype=torch.bool)
    expected_out, expected_lse = masked_part(q, k, v, everything)
    empty_out, empty_lse = masked_part(q, k, v, nothing)
    assert (empty_lse == float("-inf")).all()
    nan_out = torch.full_like(empty_out, float("nan"))                       # an empty side's output is ignored
    for sides in ((expected_out, expected_lse, empty_out, empty_lse),
                  (empty_out, empty_lse, expected_out, expected_lse),
                  (expected_out, expected_lse, nan_out, empty_lse)):
        out, lse = merge_attention_outputs(*sides)
        close(out, expected_out, 1e-12)
        close(lse, expected_lse, 1e-12)
    out, lse = merge_attention_outputs(empty_out, empty_lse, empty_out, empty_lse)   # neither side saw a key
    assert (out == 0).all() and (lse == float("-inf")).all()


def test_merge_attention_outputs_passes_chapter_06s_check_which_forbids_it(monkeypatch):
    import attn_course.checks.flash as flash_checks
    from attn_course.checks import CheckFailed

    with pytest.raises(CheckFailed, match="calls merge_attention_outputs, which this exercise forbids"):
        flash_checks.check_merge_partial_attention(merge_attention_outputs)
    monkeypatch.setattr(flash_checks, "MERGE_RULES", ())          # the numbers alone: right
    assert flash_checks.check_merge_partial_attention(merge_attention_outputs)


@pytest.mark.parametrize(
    "args, error, fragment",
    [
        (lambda o, s: (o, s, o[..., :3], s), ValueError, "out_a and out_b must have one shape"),
        (lambda o, s: (o, s[..., :2], o, s), ValueError, "lse_a must be"),
        (lambda o, s: (o, s, o, s.double()), TypeError, "dtype"),
        (lambda o, s: (o, s.long(), o, s), TypeError, "lse_a must be a floating"),
        (lambda o, s: ("out", s, o, s), TypeError, "out_a must be a torch.Tensor"),
    ],
)
def test_merge_attention_outputs_rejects_mismatched_inputs(args, error, fragment):
    with pytest.raises(error, match=fragment):
        merge_attention_outputs(*args(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5)))
